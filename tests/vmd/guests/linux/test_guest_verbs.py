"""The Linux verbs whose command differs by OS (vmd/guests/linux/verbs.py): the command the
guest sends, and what comes back of it, on a guest that only records its commands. Windows'
are in tests/vmd/guests/windows/test_windows_guest.py, against an SSH server that answers like Windows'."""

from __future__ import annotations

import pytest

from vmd.guests.guest import CommandResult, GuestError
from vmd.guests.linux.verbs import LinuxVerbs


class _Recording:
    project_path = "/mnt/project"
    user = "agent"

    def __init__(self, exit_code: int = 0, stdout: str = "", stderr: str = ""):
        self.answer = CommandResult(exit_code=exit_code, stdout=stdout, stderr=stderr, duration=0.1)
        self.commands: list[tuple[str, float]] = []
        self.files: dict[str, bytes] = {}

    def run(self, command, timeout=300, cwd=None, on_output=None):
        self.commands.append((command, timeout))
        return self.answer

    def write_file(self, path, content):
        self.files[path] = content
        return len(content)


class Linux(_Recording, LinuxVerbs):
    pass


def test_linux_starts_a_program_on_the_desktop_detached():
    guest = Linux()
    assert guest.launch_app("xterm", ["-e", "echo hi"]) == "started xterm; take a screenshot to see its window."
    [(command, timeout)] = guest.commands
    assert command == "DISPLAY=:0 setsid -f xterm -e 'echo hi' >/tmp/vmagent-launch.log 2>&1 </dev/null"
    assert timeout == 30


def test_a_program_that_does_not_start_is_a_verb_error_with_what_the_guest_said():
    with pytest.raises(GuestError, match=r"could not start nope: exit 127: bash: nope: command not found"):
        Linux(exit_code=127, stderr="bash: nope: command not found\n").launch_app("nope", [])


def test_the_internet_probe():
    linux = Linux(stdout="reachable\n")
    assert linux.check_internet("probe.internal") == (True, "reachable")
    assert linux.commands == [("timeout 8 bash -c 'exec 3<>/dev/tcp/probe.internal/80' && echo reachable", 20)]


