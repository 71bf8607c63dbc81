"""The verbs of a guest whose command differs by OS: start a program on the desktop
(`launch_app`), probe the internet (`check_internet`), run the check against the baseline
(`run_baseline`, vmd/session/verification.py). One class per OS, mixed into that OS's `Guest`
(vmd/guests/guest.py) and built on its `run` and `write_file`, so that no caller (the session,
the verb handlers, the machine adapter) branches on the OS.

`LinuxVerbs` is what `LinuxGuest` uses. `WindowsVerbs` keeps the Windows command forms
vmd had (schtasks, PowerShell) for the Windows guest that will mix it in; vmd starts no
Windows guest yet (vmd/machines/machine.py refuses the image).
"""

from __future__ import annotations

import secrets
import shlex
import subprocess

from vmd.errors import VerbError
from vmd.guests.guest import CommandResult

LAUNCH_TIMEOUT_S = 30  # starting a program returns at once; its window comes later
PROBE_TIMEOUT_S = 20  # the probe itself gives up after 8 s


def _launched(path: str, result: CommandResult) -> str:
    if result.exit_code != 0:
        raise VerbError(f"could not start {path}: exit {result.exit_code}: "
                        f"{(result.stderr or result.stdout).strip()[-400:]}")
    return f"started {path}; take a screenshot to see its window."


def _probed(result: CommandResult) -> tuple[bool, str]:
    return result.exit_code == 0, (result.stdout + result.stderr).strip()[-300:]


class LinuxVerbs:
    """The OS verbs of a Linux guest (bash, X on :0, sudo, util-linux)."""

    project_path: str
    user: str  # the account the agent's commands run as; the baseline check runs as it too

    def launch_app(self, path: str, args: list[str]) -> str:
        """Starts `path` on the desktop, detached from the SSH session; the text says what to do next."""
        command = ("DISPLAY=:0 setsid -f " + " ".join(shlex.quote(a) for a in [path, *args])
                   + " >/tmp/vmagent-launch.log 2>&1 </dev/null")
        return _launched(path, self.run(command, timeout=LAUNCH_TIMEOUT_S))

    def check_internet(self, host: str) -> tuple[bool, str]:
        """(whether a TCP connection to `host`:80 opens, what the guest said)."""
        command = f"timeout 8 bash -c 'exec 3<>/dev/tcp/{host}/80' && echo reachable"
        return _probed(self.run(command, timeout=PROBE_TIMEOUT_S))

    def run_baseline(self, command: str, archive: bytes, timeout: float) -> CommandResult:
        """The check with the project path showing the baseline (vmd/session/verification.py says why
        this way): the archive is unpacked in the guest and bound over the project path in a
        private mount namespace, where only the check runs."""
        path = f"/tmp/vmd-baseline-{secrets.token_hex(4)}.tar"
        self.write_file(path, archive)
        return self.run(linux_baseline_command(command, self.project_path, self.user, path), timeout=timeout)


def linux_baseline_command(command: str, project_path: str, user: str, archive_path: str) -> str:
    """A shell line for a Linux guest: unpack the baseline, bind it over the project
    path in a private mount namespace, run the check there as the guest user."""
    folder = f"/tmp/vmd-baseline-{secrets.token_hex(4)}"
    inner = (f"mount --bind {shlex.quote(folder)} {shlex.quote(project_path)} && "
             f"cd {shlex.quote(project_path)} && exec runuser -u {shlex.quote(user)} -- bash -c "
             f"{shlex.quote(command)}")
    return (f"set -o pipefail; sudo mkdir -p {folder} && sudo tar -xf {shlex.quote(archive_path)} -C {folder} "
            f"&& sudo chown -R {shlex.quote(user)}: {folder} || exit 125; "
            f"sudo unshare --mount --propagation private -- sh -c {shlex.quote(inner)}; rc=$?; "
            f"sudo rm -rf {folder} {shlex.quote(archive_path)}; exit $rc")


class WindowsVerbs:
    """The OS verbs of a Windows guest (OpenSSH with PowerShell as its shell)."""

    def launch_app(self, path: str, args: list[str]) -> str:
        # Programs started over SSH land in session 0 and are invisible: start them in
        # the logged-on user's session through a scheduled task run interactively.
        line = subprocess.list2cmdline([path, *args])
        command = (f"schtasks /Create /F /TN vmagent-launch /SC ONCE /ST 00:00 /IT /TR '{line}'; "
                   "schtasks /Run /TN vmagent-launch")
        return _launched(path, self.run(command, timeout=LAUNCH_TIMEOUT_S))

    def check_internet(self, host: str) -> tuple[bool, str]:
        command = ("try { (Invoke-WebRequest -UseBasicParsing -TimeoutSec 8 "
                   f"http://{host}/ -Method Head).StatusCode }} catch {{ exit 1 }}")
        return _probed(self.run(command, timeout=PROBE_TIMEOUT_S))

    def run_baseline(self, command: str, archive: bytes, timeout: float) -> CommandResult:
        # The finish reports this as "whether the check needs the work could not be checked".
        raise NotImplementedError("a baseline run on windows guests")
