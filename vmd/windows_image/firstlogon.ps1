# vmd's first logon script for a Windows guest image (vmd/windows_image/).
#
# Windows Setup runs it once, as the autologon user, from the answer file's one first logon
# command, which copies it off the seed first (vmd/windows_image/answer_file.py passes every
# argument, from guest_contract.py). It leaves the guest the way vmd's Windows backend
# (vmd/guests/windows.py) expects it: OpenSSH Server with PowerShell as its shell and vmd's
# key, the desktop awake and unlocked, a task that starts programs in the logged-on session;
# then it writes the ready marker on COM1, which the image build waits for on the serial log.
# The project share is mapped by vmd per session, with that session's login.
param(
    [string]$User = 'agent',
    [int]$Width = 1280,
    [int]$Height = 800,
    [string]$LaunchTask = 'vmd-launch',
    [string]$LaunchRequest = 'C:\vmd\launch.txt',
    [string]$Share = '\\10.0.2.4\project',
    [string]$ShareLetter = 'Z:',
    [string]$ReadyMarker = 'VMD-READY'
)

$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
$here = Split-Path -Parent $MyInvocation.MyCommand.Path
Start-Transcript -Path (Join-Path $here 'firstlogon.log') -Append | Out-Null

function Write-Serial([string]$Line) {
    # COM1 is the serial console QEMU logs to a file on the host.
    $port = New-Object System.IO.Ports.SerialPort 'COM1', 115200, 'None', 8, 'One'
    try {
        $port.Open()
        $port.WriteLine($Line)
    } finally {
        $port.Close()
    }
}

function Step([string]$Text) {
    Write-Output "vmd: $Text"
    try { Write-Serial "vmd: $Text" } catch { Write-Output "vmd: no serial port: $_" }
}

try {
    Step 'OpenSSH Server'
    $capability = Get-WindowsCapability -Online -Name 'OpenSSH.Server*' -ErrorAction SilentlyContinue |
        Select-Object -First 1
    $msi = Join-Path $here 'OpenSSH-Win64.msi'
    $installed = $false
    if ($capability -and $capability.State -eq 'Installed') {
        $installed = $true
    } elseif ($capability) {
        # A Feature on Demand: Windows downloads it, which fails without the internet.
        try {
            Add-WindowsCapability -Online -Name $capability.Name | Out-Null
            $installed = $true
        } catch {
            Step "the OpenSSH capability did not install ($_); trying the MSI"
        }
    }
    if (-not $installed) {
        if (-not (Test-Path $msi)) {
            throw 'OpenSSH Server could not be installed from Windows and no OpenSSH MSI was given: rebuild with --openssh-msi'
        }
        $install = Start-Process msiexec.exe -ArgumentList @('/i', "`"$msi`"", '/qn', '/norestart') -Wait -PassThru
        if ($install.ExitCode -ne 0) { throw "the OpenSSH MSI failed with exit code $($install.ExitCode)" }
    }
    New-Item -Path 'HKLM:\SOFTWARE\OpenSSH' -Force | Out-Null
    $shell = Join-Path $env:SystemRoot 'System32\WindowsPowerShell\v1.0\powershell.exe'
    New-ItemProperty -Path 'HKLM:\SOFTWARE\OpenSSH' -Name DefaultShell -Value $shell -PropertyType String -Force | Out-Null

    Step 'vmd key in administrators_authorized_keys'
    $sshDir = Join-Path $env:ProgramData 'ssh'
    New-Item -ItemType Directory -Path $sshDir -Force | Out-Null
    $keys = Join-Path $sshDir 'administrators_authorized_keys'
    Copy-Item -Path (Join-Path $here 'vmd_key.pub') -Destination $keys -Force
    # sshd ignores this file unless only Administrators and SYSTEM may write it. Granted by
    # SID (BUILTIN\Administrators, LocalSystem): the names are translated on non-English
    # media (German: Administratoren), where icacls fails on the English ones.
    & icacls.exe $keys /inheritance:r /grant '*S-1-5-32-544:F' /grant '*S-1-5-18:F' | Out-Null
    if ($LASTEXITCODE -ne 0) { throw "icacls failed on $keys" }
    Set-Service -Name sshd -StartupType Automatic
    Start-Service sshd

    Step 'firewall rule for SSH on every profile'
    Get-NetFirewallRule -Name 'vmd-sshd' -ErrorAction SilentlyContinue | Remove-NetFirewallRule
    New-NetFirewallRule -Name 'vmd-sshd' -DisplayName 'vmd OpenSSH Server' -Direction Inbound -Protocol TCP `
        -LocalPort 22 -Action Allow -Profile Any | Out-Null

    Step 'no sleep, screen saver, lock or Windows Update'
    foreach ($setting in 'monitor-timeout-ac', 'standby-timeout-ac', 'hibernate-timeout-ac', 'disk-timeout-ac') {
        & powercfg.exe /change $setting 0
    }
    & powercfg.exe /hibernate off
    $desktop = 'HKCU:\Control Panel\Desktop'
    Set-ItemProperty -Path $desktop -Name ScreenSaveActive -Value '0'
    Set-ItemProperty -Path $desktop -Name ScreenSaverIsSecure -Value '0'
    $personalization = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\Personalization'
    New-Item -Path $personalization -Force | Out-Null
    Set-ItemProperty -Path $personalization -Name NoLockScreen -Value 1 -Type DWord
    $system = 'HKLM:\SOFTWARE\Microsoft\Windows\CurrentVersion\Policies\System'
    Set-ItemProperty -Path $system -Name DisableLockWorkstation -Value 1 -Type DWord
    $au = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\WindowsUpdate\AU'
    New-Item -Path $au -Force | Out-Null
    Set-ItemProperty -Path $au -Name NoAutoUpdate -Value 1 -Type DWord
    Stop-Service -Name wuauserv -Force -ErrorAction SilentlyContinue
    Set-Service -Name wuauserv -StartupType Disabled
    # Setup's autologon counts down to zero; without the count it stays on for every boot.
    $winlogon = 'HKLM:\SOFTWARE\Microsoft\Windows NT\CurrentVersion\Winlogon'
    Remove-ItemProperty -Path $winlogon -Name AutoLogonCount -ErrorAction SilentlyContinue
    Set-ItemProperty -Path $winlogon -Name AutoAdminLogon -Value '1'

    Step "resolution ${Width}x${Height}"
    Add-Type -TypeDefinition @'
using System;
using System.Runtime.InteropServices;
public static class VmdDisplay {
    [StructLayout(LayoutKind.Sequential, CharSet = CharSet.Unicode)]
    public struct DEVMODE {
        [MarshalAs(UnmanagedType.ByValTStr, SizeConst = 32)] public string dmDeviceName;
        public short dmSpecVersion, dmDriverVersion, dmSize, dmDriverExtra;
        public int dmFields, dmPositionX, dmPositionY, dmDisplayOrientation, dmDisplayFixedOutput;
        public short dmColor, dmDuplex, dmYResolution, dmTTOption, dmCollate;
        [MarshalAs(UnmanagedType.ByValTStr, SizeConst = 32)] public string dmFormName;
        public short dmLogPixels;
        public int dmBitsPerPel, dmPelsWidth, dmPelsHeight, dmDisplayFlags, dmDisplayFrequency;
        public int dmICMMethod, dmICMIntent, dmMediaType, dmDitherType, dmReserved1, dmReserved2;
        public int dmPanningWidth, dmPanningHeight;
    }
    [DllImport("user32.dll", CharSet = CharSet.Unicode)]
    public static extern bool EnumDisplaySettings(string device, int mode, ref DEVMODE devMode);
    [DllImport("user32.dll", CharSet = CharSet.Unicode)]
    public static extern int ChangeDisplaySettings(ref DEVMODE devMode, int flags);
    public static int Set(int width, int height) {
        DEVMODE mode = new DEVMODE();
        mode.dmSize = (short)Marshal.SizeOf(typeof(DEVMODE));
        if (!EnumDisplaySettings(null, -1, ref mode)) { return -1; }
        mode.dmPelsWidth = width;
        mode.dmPelsHeight = height;
        mode.dmFields = 0x80000 | 0x100000;
        return ChangeDisplaySettings(ref mode, 1);
    }
}
'@
    $changed = [VmdDisplay]::Set($Width, $Height)
    if ($changed -ne 0) { Write-Output "vmd: the display refused ${Width}x${Height} (code $changed)" }

    Step "task $LaunchTask starts programs in the logged-on session"
    # sshd's sessions run in session 0, where no window is ever seen; this task runs in the
    # user's interactive session and starts the one command line vmd wrote to $LaunchRequest.
    $runner = Join-Path $here 'launch.ps1'
    Set-Content -Path $runner -Encoding UTF8 -Value @'
# vmd writes one command line, UTF-8 with a BOM (Windows PowerShell 5.1 reads it as UTF-8 then).
$request = Get-Content -Raw -Path $args[0]
Start-Process -FilePath 'cmd.exe' -WindowStyle Hidden -ArgumentList @('/c', 'start', '""', $request.Trim())
'@
    $action = New-ScheduledTaskAction -Execute 'powershell.exe' `
        -Argument "-NoProfile -WindowStyle Hidden -ExecutionPolicy Bypass -File `"$runner`" `"$LaunchRequest`""
    $principal = New-ScheduledTaskPrincipal -UserId $User -LogonType Interactive -RunLevel Highest
    $settings = New-ScheduledTaskSettingsSet -AllowStartIfOnBatteries -DontStopIfGoingOnBatteries `
        -ExecutionTimeLimit ([TimeSpan]::Zero) -MultipleInstances Parallel
    Register-ScheduledTask -TaskName $LaunchTask -Action $action -Principal $principal -Settings $settings -Force | Out-Null

    # The project share ($Share as $ShareLetter) is not mapped here: its login is each
    # session's own (a user and a random password vmd makes per session), which vmd gives the
    # guest when the session starts; a signed logon, so Windows' defaults (no guest logons, and
    # signing required since 24H2) stay as they are.

    Step 'done'
    Write-Serial $ReadyMarker
} catch {
    $message = "vmd: firstlogon failed: $_"
    Write-Output $message
    try { Write-Serial $message } catch { Write-Output 'vmd: no serial port either' }
    exit 1
} finally {
    Stop-Transcript | Out-Null
}
