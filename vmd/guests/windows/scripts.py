"""The PowerShell a Windows guest runs for vmd (guest.py, verbs.py beside it), as
templates: `render` fills a `{{NAME}}` only with an integer, base64 or a single-quoted string
(vmd/guests/windows/powershell.py `quoted`), so nothing from the model or the guest can change a
script's code. Every template here is parsed with a PowerShell grammar in the tests
(tests/vmd/guests/windows/test_windows_scripts.py), rendered.

Strings in these scripts are in single quotes unless they expand a variable: Windows
PowerShell 5.1 (no `&&`, no `??`, no ternary) is what every Windows since 10 has.
"""

from __future__ import annotations

import hashlib
import re

# The timeout's kill: a Job Object (learn.microsoft.com, "Job Objects"). The command's process
# is assigned to it as soon as it starts, before its PowerShell has read the command, so every
# process the command starts is in the job too (children inherit it), and TerminateJobObject
# at the timeout ends the whole tree, also what left its parent behind, which taskkill /T
# would miss. The job has no kill-on-close limit: as on Linux, what a command started and
# left running (Start-Process) outlives a command that ended in time. Compiled by Add-Type
# once per guest into a DLL under ProgramData, named by this source's hash, and loaded from
# there by every later command: compiling starts .NET's C# compiler (csc.exe), loading does
# not (not measured: no Windows boots on vmd's build machines).
JOB_SOURCE = r"""
using System;
using System.ComponentModel;
using System.Runtime.InteropServices;
public static class VmdJob {
    [DllImport("kernel32.dll", SetLastError = true)]
    static extern IntPtr CreateJobObject(IntPtr attributes, string name);
    [DllImport("kernel32.dll", SetLastError = true)]
    static extern bool AssignProcessToJobObject(IntPtr job, IntPtr process);
    [DllImport("kernel32.dll", SetLastError = true)]
    static extern bool TerminateJobObject(IntPtr job, uint exitCode);
    public static IntPtr Create() {
        IntPtr job = CreateJobObject(IntPtr.Zero, null);
        if (job == IntPtr.Zero) { throw new Win32Exception(); }
        return job;
    }
    public static void Assign(IntPtr job, IntPtr process) {
        if (!AssignProcessToJobObject(job, process)) { throw new Win32Exception(); }
    }
    public static void Kill(IntPtr job) { TerminateJobObject(job, 124); }
}
"""
JOB_DLL = f"VmdJob-{hashlib.sha256(JOB_SOURCE.encode()).hexdigest()[:12]}.dll"

# What the guest's own stderr says when the timeout killed the command (vmd reads it back).
TIMEOUT_LINE = "vmd: the command ran past its timeout; its job object was terminated"

# Output as UTF-8 (5.1 writes the console's OEM code page otherwise; setting the console's
# encoding throws where there is no console, which is fine), progress records silenced (5.1
# serializes them to stderr as CLIXML when stderr is not a console).
PREAMBLE = """$ProgressPreference = 'SilentlyContinue'
try { [Console]::OutputEncoding = [Text.Encoding]::UTF8 } catch { $null = $_ }
$OutputEncoding = [Text.Encoding]::UTF8
"""

def type_loader(type_name: str, field: str, indent: str = "") -> str:
    """PowerShell that makes [type_name] usable, compiled once per guest: the DLL named by
    {{<field>_DLL}} under ProgramData is compiled from {{<field>_SOURCE}} by the first
    command that needs it (into a temporary name, then moved: two at once do not meet) and
    loaded by every later one. Whether -OutputAssembly also loads the type is not said in
    5.1's help: it is loaded if not. The here-string's lines start at column 0, as
    PowerShell demands of its closing '@."""
    body = f"""if (-not ('{type_name}' -as [type])) {{
    $vmdDll = Join-Path $env:ProgramData {{{{{field}_DLL}}}}
    if (-not (Test-Path -LiteralPath $vmdDll)) {{
        $null = New-Item -ItemType Directory -Force -Path (Split-Path -Parent $vmdDll)
        $vmdTemp = Join-Path (Split-Path -Parent $vmdDll) ("$PID-" + (Split-Path -Leaf $vmdDll))
        Add-Type -TypeDefinition @'
@@SOURCE@@
'@ -OutputAssembly $vmdTemp -OutputType Library
        try {{ Move-Item -LiteralPath $vmdTemp -Destination $vmdDll }} catch {{ Remove-Item -LiteralPath $vmdTemp -Force -ErrorAction SilentlyContinue }}
    }}
    if (-not ('{type_name}' -as [type])) {{ Add-Type -Path $vmdDll }}
}}
"""
    lines = [line if line.startswith(("@@SOURCE@@", "'@")) or not line else indent + line
             for line in body.split("\n")]
    return "\n".join(lines).replace("@@SOURCE@@", "{{" + field + "_SOURCE}}")


# A net.exe that maps the project share with the share's own login (vmd/machines/smb_account.py).
# sshd's logons have no credentials for the network (a key proves nothing to another server:
# Win32-OpenSSH #518, #1049, #139), so a mapping without them fails in every SSH logon; with the
# share's user and password it is also a signed connection, which Windows 11 24H2 requires.
# Any earlier mapping of the drive (one left unavailable by a relay's restart) goes first.
NET_USE = """& net.exe use {{DRIVE}} /delete /y 2>&1 | Out-Null
$vmdSaid = & net.exe use {{DRIVE}} {{SHARE_UNC}} {{SHARE_PASSWORD}} ('/user:' + {{SHARE_USER}}) /persistent:no 2>&1"""

# What sshd's own PowerShell runs for one `run`, in itself (vmd/guests/windows/powershell.py
# in_shell_command: no powershell.exe of its own, so a command costs two starts, the shell's and
# the command's, not three): maps the project share in this logon session when it is not (each
# SSH logon is a session of its own, where the desktop's Z: does not exist), starts the
# command's own powershell.exe (RUN_INNER) in a job object, waits at most SECONDS, kills the
# job's whole tree past it, and exits with the command's code.
RUN_WRAPPER = PREAMBLE + """$vmdSeconds = {{SECONDS}}
if ({{MAP_SHARE}} -and -not (Test-Path -LiteralPath {{DRIVE_ROOT}})) {
    # Before 'Stop': in 5.1 a native program's stderr under 2>&1 is an error record, which
    # 'Stop' would make the end of the wrapper. A share that cannot be mapped shows in the command.
""" + "\n".join("    " + line for line in NET_USE.split("\n")) + """
}
$ErrorActionPreference = 'Stop'
""" + type_loader("VmdJob", "JOB") + """$vmdJob = [VmdJob]::Create()
$vmdStart = New-Object System.Diagnostics.ProcessStartInfo
$vmdStart.FileName = Join-Path $PSHOME 'powershell.exe'
$vmdStart.Arguments = '-NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand ' + {{INNER}}
$vmdStart.UseShellExecute = $false
# Its input is a pipe closed at once (Linux's </dev/null: a command that reads input ends
# instead of waiting for its timeout). With one stream redirected, .NET Framework's
# Process.Start passes the others as this process's own standard handles (STARTF_USESTDHANDLES,
# GetStdHandle: referencesource Process.cs), so the output goes straight to sshd.
$vmdStart.RedirectStandardInput = $true
$vmdChild = [System.Diagnostics.Process]::Start($vmdStart)
[VmdJob]::Assign($vmdJob, $vmdChild.Handle)
$vmdChild.StandardInput.Close()
if (-not $vmdChild.WaitForExit($vmdSeconds * 1000)) {
    [VmdJob]::Kill($vmdJob)
    [Console]::Error.WriteLine({{TIMEOUT_LINE}})
    exit 124
}
$vmdChild.WaitForExit()
exit $vmdChild.ExitCode
"""

# The command's own powershell.exe: the working folder (its home when the folder is not
# there, as on Linux), the process's folder too (native programs read that one), then the
# command file vmd wrote, run as a script block in this scope (a script block is no file:
# no execution policy stops it; -ExecutionPolicy Bypass lets the scripts it runs run).
RUN_INNER = PREAMBLE + """$vmdUtf8 = New-Object System.Text.UTF8Encoding $false
$vmdCwd = $vmdUtf8.GetString([Convert]::FromBase64String({{CWD_B64}}))
$vmdFile = $vmdUtf8.GetString([Convert]::FromBase64String({{FILE_B64}}))
Set-Location -LiteralPath $vmdCwd -ErrorAction SilentlyContinue
if (-not $?) { Set-Location -LiteralPath $HOME }
[Environment]::CurrentDirectory = (Get-Location -PSProvider FileSystem).ProviderPath
$vmdText = [IO.File]::ReadAllText($vmdFile, $vmdUtf8)
Remove-Item -LiteralPath $vmdFile -Force -ErrorAction SilentlyContinue
$global:LASTEXITCODE = 0
. ([ScriptBlock]::Create($vmdText))
"""

# Appended to every command in its file, on a line of its own, so that `$?` is the command's
# last statement's: its success is exit 0, a native program's failure its own exit code,
# a cmdlet's failure exit 1. `exit` in the command itself still exits with its number.
EXIT_TAIL = """
if ($?) { exit 0 }
if ($global:LASTEXITCODE) { exit $global:LASTEXITCODE }
exit 1
"""

# The facts, one `name=value` line each (vmd/guests/windows/verbs.py reads them).
FACTS = """$os = Get-CimInstance -ClassName Win32_OperatingSystem
$cv = Get-ItemProperty -Path 'HKLM:\\SOFTWARE\\Microsoft\\Windows NT\\CurrentVersion'
function Get-VmdVersion([string]$Name, [string[]]$Arguments) {
    $command = Get-Command $Name -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
    if ($null -eq $command) { return 'none' }
    $text = (& $command.Source @Arguments 2>&1 | Select-Object -First 1) -as [string]
    if ($text) { return $text.Trim() }
    return 'none'
}
'os=' + $os.Caption + ' (' + $cv.EditionID + ')'
'build=' + $os.Version + '.' + $cv.UBR
'powershell=' + $PSVersionTable.PSVersion.ToString()
'python=' + (Get-VmdVersion 'python' @('--version'))
'git=' + (Get-VmdVersion 'git' @('--version'))
'dotnet=' + (Get-VmdVersion 'dotnet' @('--version'))
$desktop = @(Get-Process -Name explorer -ErrorAction SilentlyContinue | Where-Object { $_.SessionId -ne 0 })
'desktop=' + ($desktop.Count -gt 0)
'mounted=' + (Test-Path -LiteralPath {{DRIVE_ROOT}})
'boot=' + $os.LastBootUpTime.ToUniversalTime().ToString('o')
'hostname=' + $env:COMPUTERNAME
"""

# The desktop is up when explorer.exe runs in a user's session (sshd's own is session 0).
DESKTOP_PROBE = """$shell = @(Get-Process -Name explorer -ErrorAction SilentlyContinue | Where-Object { $_.SessionId -ne 0 })
if ($shell.Count -eq 0) { 'explorer.exe is not running in a user session yet'; exit 1 }
'explorer.exe runs in session ' + $shell[0].SessionId
"""

# The machine's check that the project share is there (vmd/machines/machine.py `ready`): mapped
# by the wrapper already or here; what net.exe said when it is not.
MOUNT_SHARE = """if (Test-Path -LiteralPath {{DRIVE_ROOT}}) { 'mapped'; exit 0 }
""" + NET_USE + """
$vmdCode = $LASTEXITCODE
if ($vmdCode -eq 0 -and (Test-Path -LiteralPath {{DRIVE_ROOT}})) { 'mapped'; exit 0 }
[Console]::Error.WriteLine('net use exited ' + $vmdCode + ': ' + (($vmdSaid | Out-String) -replace '\\s+', ' ').Trim())
exit 1
"""

# A TCP connection to port 80, as the Linux probe opens one: any answer at all is internet.
CHECK_INTERNET = """$client = New-Object System.Net.Sockets.TcpClient
try {
    $opened = $client.ConnectAsync({{HOST}}, 80).Wait(8000)
} catch {
    $opened = $false
}
if ($opened -and $client.Connected) { 'reachable'; $client.Close(); exit 0 }
'no TCP connection to ' + {{HOST}} + ':80 within 8 s'
exit 1
"""

# The session task's program (the image's vmd-launch task, vmd/guests/windows/contract.py)
# starts what LAUNCH_REQUEST names; this asks it to.
RUN_LAUNCH_TASK = """& schtasks.exe /Run /TN {{TASK}}
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
"""

REBOOT = "& shutdown.exe /r /t 0 /f\n"

# Sets the clock of a guest restored from a save (it stood still from the save on).
SET_CLOCK = "Set-Date -Date ([DateTimeOffset]::FromUnixTimeMilliseconds({{MILLIS}}).LocalDateTime) | Out-Null\n"

# The desktop session's project drive, mapped by vmd once the session has a share (its login is
# the session's: the image knows none), and anew after a warm slot's restore, whose mapping
# spoke to the slot's placeholder share, with the slot's login, over a connection that ended at
# the save; sshd's logons map their own (NET_USE in the wrapper). Run in the desktop session by
# the session task; it removes its own file (the password in it) before anything else.
REMAP_SHARE = """Remove-Item -LiteralPath $MyInvocation.MyCommand.Path -Force -ErrorAction SilentlyContinue
& net.exe use {{SHARE_UNC}} /delete /y 2>&1 | Out-Null
""" + NET_USE + """
"""

# A warm slot's identity of its own (vmd/machines/warm_pool.py, before the save): every slot
# of an image would otherwise share the image's sshd host keys and MachineGuid (which
# software reads as the machine's identity). ssh-keygen -A writes the keys where Win32-OpenSSH
# reads them (%ProgramData%\ssh); the private ones get the ACL sshd demands (SYSTEM and
# Administrators alone: by SID, so any display language). sshd loads its host keys when it
# starts: a task of SYSTEM's restarts it a few seconds after this script has answered, since
# a restart from this connection would end the connection first. The machine SID stays: only
# sysprep changes it, with a reboot through OOBE. Prints `key=<public key>` per new key.
NEW_IDENTITY = """$ErrorActionPreference = 'Stop'
try {
    $service = Get-CimInstance -ClassName Win32_Service -Filter "Name='sshd'"
    if ($null -eq $service) { throw 'there is no sshd service' }
    $sshd = $service.PathName -replace '^"([^"]+)".*$', '$1'
    $keygen = Join-Path (Split-Path -Parent $sshd) 'ssh-keygen.exe'
    $dir = Join-Path $env:ProgramData 'ssh'
    Get-ChildItem -LiteralPath $dir -Filter 'ssh_host_*' | Remove-Item -Force
    $null = & $keygen -A 2>&1
    if ($LASTEXITCODE -ne 0) { throw ('ssh-keygen -A exit ' + $LASTEXITCODE) }
    foreach ($key in @(Get-ChildItem -LiteralPath $dir -Filter 'ssh_host_*_key' | Where-Object { $_.Extension -eq '' })) {
        $null = & icacls.exe $key.FullName /inheritance:r /grant '*S-1-5-18:F' /grant '*S-1-5-32-544:F'
        if ($LASTEXITCODE -ne 0) { throw ('icacls exit ' + $LASTEXITCODE + ' on ' + $key.Name) }
    }
    Set-ItemProperty -LiteralPath 'HKLM:\\SOFTWARE\\Microsoft\\Cryptography' -Name 'MachineGuid' -Value ([guid]::NewGuid().ToString())
    $restart = New-ScheduledTaskAction -Execute 'powershell.exe' -Argument '-NoProfile -NonInteractive -Command "Start-Sleep -Seconds 3; Restart-Service -Name sshd -Force"'
    $null = Register-ScheduledTask -TaskName 'vmd-new-identity' -Action $restart -User 'SYSTEM' -RunLevel Highest -Force
    Start-ScheduledTask -TaskName 'vmd-new-identity'
    foreach ($public in @(Get-ChildItem -LiteralPath $dir -Filter 'ssh_host_*_key.pub')) {
        'key=' + (Get-Content -LiteralPath $public.FullName -Raw).Trim()
    }
} catch {
    [Console]::Error.WriteLine('vmd-identity: ' + $_.Exception.Message)
    exit 1
}
"""

# The top-level windows of the user's desktop, front first (EnumWindows' Z order): run in the
# user's session by the launch task (sshd's session 0 has a desktop of its own, with nothing
# on it; its user32 calls compiled once per guest, as the job's are), written to the file its
# first argument names (a temporary name, then renamed, so
# that vmd never reads half of it). Each window: its handle, its inside (the client rectangle
# on screen: below the title bar) and its frame (window rectangle minus client), its title.
WINDOWS_SOURCE = r"""
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;
public static class VmdWindows {
    public delegate bool EnumProc(IntPtr hwnd, IntPtr lParam);
    [StructLayout(LayoutKind.Sequential)] public struct Rect { public int Left, Top, Right, Bottom; }
    [StructLayout(LayoutKind.Sequential)] public struct Point { public int X, Y; }
    [DllImport("user32.dll")] static extern bool EnumWindows(EnumProc proc, IntPtr lParam);
    [DllImport("user32.dll")] static extern bool IsWindowVisible(IntPtr hwnd);
    [DllImport("user32.dll")] static extern bool IsIconic(IntPtr hwnd);
    [DllImport("user32.dll")] static extern int GetWindowTextLength(IntPtr hwnd);
    [DllImport("user32.dll", CharSet = CharSet.Unicode)] static extern int GetWindowText(IntPtr hwnd, StringBuilder text, int max);
    [DllImport("user32.dll")] static extern bool GetWindowRect(IntPtr hwnd, out Rect rect);
    [DllImport("user32.dll")] static extern bool GetClientRect(IntPtr hwnd, out Rect rect);
    [DllImport("user32.dll")] static extern bool ClientToScreen(IntPtr hwnd, ref Point point);
    [DllImport("user32.dll")] public static extern IntPtr GetForegroundWindow();
    [DllImport("user32.dll")] public static extern bool SetProcessDPIAware();
    [DllImport("dwmapi.dll")] static extern int DwmGetWindowAttribute(IntPtr hwnd, int attribute, out int value, int size);
    public static List<string> List() {
        List<string> lines = new List<string>();
        EnumWindows(delegate (IntPtr hwnd, IntPtr lParam) {
            int cloaked;
            if (!IsWindowVisible(hwnd) || IsIconic(hwnd)) { return true; }
            if (DwmGetWindowAttribute(hwnd, 14, out cloaked, 4) == 0 && cloaked != 0) { return true; }
            int length = GetWindowTextLength(hwnd);
            if (length == 0) { return true; }
            StringBuilder title = new StringBuilder(Math.Min(length, 400) + 1);
            GetWindowText(hwnd, title, title.Capacity);
            Rect outer; Rect inner; Point origin = new Point();
            if (!GetWindowRect(hwnd, out outer) || !GetClientRect(hwnd, out inner) || !ClientToScreen(hwnd, ref origin)) { return true; }
            int left = origin.X - outer.Left, top = origin.Y - outer.Top;
            int right = outer.Right - origin.X - inner.Right, bottom = outer.Bottom - origin.Y - inner.Bottom;
            lines.Add(string.Join("\t", new string[] { hwnd.ToInt64().ToString(), origin.X.ToString(), origin.Y.ToString(),
                inner.Right.ToString(), inner.Bottom.ToString(), left + "," + right + "," + top + "," + bottom,
                title.ToString().Replace('\t', ' ').Replace('\r', ' ').Replace('\n', ' ') }));
            return true;
        }, IntPtr.Zero);
        return lines;
    }
}
"""
WINDOWS_DLL = f"VmdWindows-{hashlib.sha256(WINDOWS_SOURCE.encode()).hexdigest()[:12]}.dll"

LIST_WINDOWS = """param([string]$Out)
$ErrorActionPreference = 'Stop'
try {
""" + type_loader("VmdWindows", "WINDOWS", indent="    ") + """    $null = [VmdWindows]::SetProcessDPIAware()
    $lines = @('@@active ' + [VmdWindows]::GetForegroundWindow().ToInt64()) + [VmdWindows]::List()
} catch {
    $lines = @('@@error ' + ($_.Exception.Message -replace '\\s+', ' '))
}
$temp = $Out + '.tmp'
[IO.File]::WriteAllLines($temp, [string[]]$lines, (New-Object System.Text.UTF8Encoding $false))
Move-Item -LiteralPath $temp -Destination $Out -Force
"""

TEMPLATES = {name: value for name, value in globals().items()
             if name.isupper() and isinstance(value, str)
             and name not in ("JOB_SOURCE", "JOB_DLL", "WINDOWS_SOURCE", "WINDOWS_DLL", "TIMEOUT_LINE")}
RAW = {"JOB_SOURCE": JOB_SOURCE, "WINDOWS_SOURCE": WINDOWS_SOURCE}  # vmd's own C#, put in as it is

_FIELD = re.compile(r"\{\{([A-Z_0-9]+)\}\}")
_SAFE = re.compile(r"^(-?\d+|\$true|\$false|'(?:[^'\u2018\u2019\u201a\u201b]|''|\u2018\u2018|\u2019\u2019|"
                   r"\u201a\u201a|\u201b\u201b)*'|[A-Za-z]:)$", re.DOTALL)


def render(template: str, **values: str | int | bool) -> str:
    """`template` with each `{{NAME}}` replaced; every value must be an int, a bool, a drive
    (`Z:`) or a quoted string (vmd/guests/windows/powershell.py `quoted`), else ValueError: a bug in
    vmd, never a way for text to become code. JOB_SOURCE is the one raw value (vmd's own)."""
    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name in RAW:
            return RAW[name].strip("\n")
        if name not in values:
            raise ValueError(f"no value for {{{{{name}}}}}")
        value = values[name]
        text = ("$true" if value else "$false") if isinstance(value, bool) else str(value)
        if not _SAFE.fullmatch(text):
            raise ValueError(f"{{{{{name}}}}} must be an integer, a drive or a quoted string, not {text[:60]!r}")
        return text
    return _FIELD.sub(fill, template)
