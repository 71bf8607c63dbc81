# vmd's first logon script for a Windows guest image (vmd/images/windows/).
#
# Windows Setup runs it once, as the autologon user, from the answer file's one first logon
# command, which copies it off the seed first (vmd/images/windows/answer_file.py passes every
# argument, from vmd/guests/windows/contract.py). It leaves the guest the way vmd's Windows backend
# (vmd/guests/windows/guest.py) expects it: OpenSSH Server with PowerShell as its shell and vmd's
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
    [string]$ReadyMarker = 'VMD-READY',
    # Each way of installing OpenSSH gets this long (the capability's download; the MSI).
    [int]$OpenSshTimeoutS = 900
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

function Test-Sshd {
    [bool](Get-Service -Name sshd -ErrorAction SilentlyContinue)
}

function Install-OpenSshServer([string]$Msi, [int]$TimeoutS) {
    # Returns which way sshd came, in words; throws when none gave it. The capability is a
    # Feature on Demand that Windows fetches from Windows Update (or FoD media), which can
    # hang without the internet, and Add-WindowsCapability has reported success with no
    # sshd service: each way is bounded in time and judged by the service, not its word.
    if (Test-Sshd) { return 'already installed' }
    $tried = @()
    $capability = Get-WindowsCapability -Online -Name 'OpenSSH.Server*' -ErrorAction SilentlyContinue |
        Select-Object -First 1
    if ($capability) {
        $job = Start-Job -ScriptBlock {
            param($Name)
            Add-WindowsCapability -Online -Name $Name | Out-Null
        } -ArgumentList $capability.Name
        if (Wait-Job -Job $job -Timeout $TimeoutS) {
            try {
                Receive-Job -Job $job -ErrorAction Stop | Out-Null
                $tried += 'the capability said it installed'
            } catch {
                $tried += "the capability failed ($_)"
            }
        } else {
            Stop-Job -Job $job
            $tried += "the capability did not install within $TimeoutS s (Windows Update unreachable?)"
        }
        Remove-Job -Job $job -Force
        if (Test-Sshd) { return "the $($capability.Name) capability" }
        if ($tried[-1] -eq 'the capability said it installed') { $tried[-1] += ', but no sshd service exists' }
    } else {
        $tried += 'this edition has no OpenSSH.Server capability'
    }
    Step "OpenSSH Server: $($tried -join '; '); trying the MSI"
    if (-not (Test-Path $Msi)) {
        throw "OpenSSH Server could not be installed ($($tried -join '; ')) and no OpenSSH MSI was given: rebuild with --openssh-msi OpenSSH-Win64.msi from the PowerShell/Win32-OpenSSH releases"
    }
    $install = Start-Process msiexec.exe -ArgumentList @('/i', "`"$Msi`"", '/qn', '/norestart') -PassThru
    if (-not $install.WaitForExit($TimeoutS * 1000)) {
        Stop-Process -Id $install.Id -Force -ErrorAction SilentlyContinue
        throw "the OpenSSH MSI did not finish within $TimeoutS s"
    }
    # 3010: installed, a restart wanted (Windows Installer's ERROR_SUCCESS_REBOOT_REQUIRED).
    if ($install.ExitCode -notin 0, 3010) { throw "the OpenSSH MSI failed with exit code $($install.ExitCode)" }
    if (-not (Test-Sshd)) { throw 'the OpenSSH MSI finished but no sshd service exists' }
    return 'the Win32-OpenSSH MSI'
}

try {
    Step 'running as an administrator'
    # The answer file puts the account in Administrators by name, as dockur's and
    # cschneegans' answer files do on every display language; checked here by SID, so that
    # an account left out of the group says so instead of failing at the first HKLM write.
    $identity = [Security.Principal.WindowsIdentity]::GetCurrent()
    $admins = New-Object Security.Principal.SecurityIdentifier 'S-1-5-32-544'
    if (-not ([Security.Principal.WindowsPrincipal]$identity).IsInRole($admins)) {
        throw "the first logon runs as $($identity.Name), not as an elevated member of Administrators (S-1-5-32-544)"
    }

    Step 'OpenSSH Server'
    $how = Install-OpenSshServer -Msi (Join-Path $here 'OpenSSH-Win64.msi') -TimeoutS $OpenSshTimeoutS
    Step "OpenSSH Server: $how"
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
    # Running, not only installed: a service that stops at once (a bad config or key ACL)
    # says so here rather than as an SSH timeout in the first session.
    (Get-Service -Name sshd).WaitForStatus('Running', [TimeSpan]::FromSeconds(60))

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
    # The lock screen at boot: a machine policy (honoured by Enterprise, Education and Server).
    $personalization = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\Personalization'
    New-Item -Path $personalization -Force | Out-Null
    Set-ItemProperty -Path $personalization -Name NoLockScreen -Value 1 -Type DWord
    # Locking the workstation: a user policy, read from the user's hive only (it was written
    # to HKLM before, where Windows never looks for it). This script runs as that user.
    $userSystem = 'HKCU:\Software\Microsoft\Windows\CurrentVersion\Policies\System'
    New-Item -Path $userSystem -Force | Out-Null
    Set-ItemProperty -Path $userSystem -Name DisableLockWorkstation -Value 1 -Type DWord
    $au = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\WindowsUpdate\AU'
    New-Item -Path $au -Force | Out-Null
    Set-ItemProperty -Path $au -Name NoAutoUpdate -Value 1 -Type DWord
    Stop-Service -Name wuauserv -Force -ErrorAction SilentlyContinue
    Set-Service -Name wuauserv -StartupType Disabled
    # Autologon at every boot: the answer file's LogonCount is large (as dockur's, 65432), so
    # Winlogon never counts down to the end, where it turns autologon off and deletes the
    # stored password (removing AutoLogonCount here, as before, came after that could happen).
    $winlogon = Get-ItemProperty -Path 'HKLM:\SOFTWARE\Microsoft\Windows NT\CurrentVersion\Winlogon'
    $count = $winlogon.AutoLogonCount  # none: no count at all, which is for good too
    if ($winlogon.AutoAdminLogon -ne '1' -or ($null -ne $count -and [int]$count -lt 1000)) {
        throw "autologon is not set up for good (AutoAdminLogon $($winlogon.AutoAdminLogon), AutoLogonCount $count)"
    }
    Step "autologon stays on (AutoLogonCount $count)"

    # Windows has no driver for the machine's std VGA: it keeps the mode the firmware set,
    # which the image's video device sets to the image's resolution (vmd/machines/
    # domain_devices.py Video); a display driver's mode list is not there to choose from.
    # What Windows shows is said, so a build whose screen differs from its manifest is seen.
    Add-Type -AssemblyName System.Windows.Forms
    $screen = [System.Windows.Forms.Screen]::PrimaryScreen.Bounds
    if ($screen.Width -eq $Width -and $screen.Height -eq $Height) {
        Step "display ${Width}x${Height}"
    } else {
        Step "display $($screen.Width)x$($screen.Height), not the image's ${Width}x${Height}: the firmware did not set the video device's mode"
    }

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
