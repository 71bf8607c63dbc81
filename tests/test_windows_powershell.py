"""Every PowerShell the Windows image ships or generates parses with a real PowerShell
grammar (tree-sitter-powershell) without an error node: firstlogon.ps1, the launcher it
writes, and the first logon command of the answer file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vmd.guests import windows_contract as contract
from vmd.windows_image.answer_file import FirstLogon

tree_sitter = pytest.importorskip("tree_sitter")
tsp = pytest.importorskip("tree_sitter_powershell")
SCRIPT = Path(__file__).resolve().parents[1] / "vmd" / "windows_image" / "firstlogon.ps1"


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
