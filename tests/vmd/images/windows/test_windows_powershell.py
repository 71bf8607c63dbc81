"""Every PowerShell the Windows image ships or generates parses with a real PowerShell
grammar (tree-sitter-powershell) without an error node: firstlogon.ps1, the launcher it
writes, and the first logon command of the answer file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vmd.guests.windows import contract
from vmd.images.windows.answer_file import FirstLogon

tree_sitter = pytest.importorskip("tree_sitter")
tsp = pytest.importorskip("tree_sitter_powershell")
SCRIPT = Path(__file__).resolve().parents[4] / "vmd" / "images" / "windows" / "firstlogon.ps1"


def parse_errors(source: str) -> list[str]:
    parser = tree_sitter.Parser(tree_sitter.Language(tsp.language()))
    data = source.encode()
    tree = parser.parse(data)
    found, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            found.append(f"line {node.start_point[0] + 1}: {data[node.start_byte:node.end_byte][:60]!r}")
        stack.extend(node.children)
    return found


def test_the_grammar_finds_errors_in_broken_powershell():
    assert parse_errors("if ($a { Write-Output 'x'\nfunction ( {\n")
    assert parse_errors("Write-Output 'fine'\n") == []


def test_firstlogon_ps1_parses_without_errors():
    assert parse_errors(SCRIPT.read_text()) == []


def test_the_launcher_firstlogon_writes_parses_too():
    launcher = re.search(r"-Value @'\n(.*?)\n'@", SCRIPT.read_text(), re.S)
    assert launcher, "the launcher's here-string is gone from firstlogon.ps1"
    assert "Start-Process" in launcher[1] and parse_errors(launcher[1]) == []


def test_the_first_logon_command_parses():
    inner = re.fullmatch(r'powershell\.exe -NoProfile -ExecutionPolicy Bypass -Command "(.*)"',
                         FirstLogon(1280, 800).command())
    assert inner and parse_errors(inner[1]) == []


def test_firstlogon_grants_the_key_file_by_sid_not_by_localized_name():
    # Group names are translated on non-English media (German: Administratoren); the SIDs are not.
    grants = re.findall(r"/grant '([^']+)'", "\n".join(
        line for line in SCRIPT.read_text().splitlines() if "icacls" in line and not line.lstrip().startswith("#")))
    assert grants == ["*S-1-5-32-544:F", "*S-1-5-18:F"]


def test_the_script_defaults_are_the_guest_contract():
    head = SCRIPT.read_text().split(")\n", 1)[0]
    for name, value in (("User", contract.ADMIN_USER), ("LaunchTask", contract.VMD_LAUNCH_TASK),
                        ("LaunchRequest", contract.LAUNCH_REQUEST), ("Share", contract.SHARE_UNC),
                        ("ShareLetter", contract.SHARE_LETTER), ("ReadyMarker", contract.READY_MARKER)):
        assert f"${name} = '{value}'" in head, name
    body = SCRIPT.read_text()
    for needle in ("OpenSSH.Server", "HKLM:\\SOFTWARE\\OpenSSH", "DefaultShell", "administrators_authorized_keys",
                   "/inheritance:r", "-LocalPort 22", "-Profile Any", "Register-ScheduledTask", "Write-Serial $ReadyMarker"):
        assert needle in body, needle


def function_body(source: str, name: str) -> str:
    """The text of a PowerShell function, found with the grammar (not a regex)."""
    parser = tree_sitter.Parser(tree_sitter.Language(tsp.language()))
    data = source.encode()
    stack = [parser.parse(data).root_node]
    while stack:
        node = stack.pop()
        if node.type == "function_statement" and name.encode() in data[node.start_byte:node.end_byte].split(b"{")[0]:
            return data[node.start_byte:node.end_byte].decode()
        stack.extend(node.children)
    raise AssertionError(f"no function {name} in the script")


def in_order(text: str, *needles: str) -> bool:
    """Each needle found after the one before it."""
    at = 0
    for needle in needles:
        at = text.find(needle, at)
        if at < 0:
            return False
        at += len(needle)
    return True


def test_openssh_is_judged_by_its_service_each_way_bounded_in_time():
    body = function_body(SCRIPT.read_text(), "Install-OpenSshServer")
    # Already there (Server 2025 ships it), then the capability in a job that is waited on
    # for a bounded time, then the service is looked for, then the MSI, bounded, then the
    # service again: Add-WindowsCapability's "installed" is not taken for an answer.
    assert in_order(body, "if (Test-Sshd) { return 'already installed' }", "Get-WindowsCapability",
                    "Start-Job", "Wait-Job -Job $job -Timeout $TimeoutS", "Stop-Job", "if (Test-Sshd) { return",
                    "but no sshd service exists", "trying the MSI", "Test-Path $Msi", "--openssh-msi",
                    "WaitForExit($TimeoutS * 1000)", "-notin 0, 3010",
                    "if (-not (Test-Sshd)) { throw 'the OpenSSH MSI finished but no sshd service exists' }",
                    "return 'the Win32-OpenSSH MSI'")
    assert "Add-WindowsCapability" in body.split("Start-Job", 1)[1].split("Wait-Job", 1)[0]  # only inside the job
    script = SCRIPT.read_text()
    # The way taken is said on COM1, and sshd must be running, not only installed.
    assert in_order(script, "$how = Install-OpenSshServer", 'Step "OpenSSH Server: $how"',
                    "Start-Service sshd", "WaitForStatus('Running'")


def test_the_lock_policies_are_in_the_hive_windows_reads_them_from():
    script = SCRIPT.read_text()
    # DisableLockWorkstation is a user policy (HKCU); NoLockScreen a machine one (HKLM).
    user_policy = re.search(r"\$userSystem = '([^']+)'", script)[1]
    assert user_policy == "HKCU:\\Software\\Microsoft\\Windows\\CurrentVersion\\Policies\\System"
    assert "-Path $userSystem -Name DisableLockWorkstation" in script
    assert not re.search(r"HKLM:[^'\n]*Policies\\System'", script)
    assert re.search(r"\$personalization = 'HKLM:\\SOFTWARE\\Policies\\Microsoft\\Windows\\Personalization'", script)


def test_failures_that_were_hidden_are_said():
    script = SCRIPT.read_text()
    # Windows' SMB client is left as it ships (signing required, no guest logons): vmd's
    # share is a signed logon of the session's own user, so there is no failure to hide.
    assert "Set-SmbClientConfiguration" not in script and "AllowInsecureGuestAuth" not in script
    # The display: no mode to choose without a driver; the one Windows shows is said.
    assert "ChangeDisplaySettings" not in script
    assert in_order(script, "PrimaryScreen.Bounds", 'Step "display ${Width}x${Height}"', "not the image's")
    # An account left out of Administrators (asked by SID) says so before any HKLM write.
    assert in_order(script, "'S-1-5-32-544'", "IsInRole($admins)", "Install-OpenSshServer -Msi", "HKLM:\\SOFTWARE\\OpenSSH")


def test_the_first_logon_command_parses_with_its_failure_branch():
    inner = re.fullmatch(r'powershell\.exe -NoProfile -ExecutionPolicy Bypass -Command "(.*)"',
                         FirstLogon(1280, 800).command())[1]
    assert "catch {" in inner and parse_errors(inner) == []
