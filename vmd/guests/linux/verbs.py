"""The verbs of a Linux guest whose command differs by OS: start a program on the desktop
(`launch_app`), probe the internet (`check_internet`), list the windows (`list_windows`,
vmd/guests/linux/x11_windows.py), and what the machine asks of its guest (facts, desktop, share,
reboot, identity). `LinuxVerbs` is mixed into `LinuxGuest` (vmd/guests/linux/guest.py) and built on
its `run` and `write_file`, so that no caller (the session, the verb handlers, the machine
adapter) branches on the OS; Windows' are `WindowsVerbs` (vmd/guests/windows/verbs.py).
Failures are `GuestError`s: the verb's handler turns one into the verb's error with its words.
"""

from __future__ import annotations

import logging
import shlex

from vmd.guests.guest import CommandResult, GuestError, GuestFacts, ListedWindow, ShareLogin
from vmd.guests.linux.x11_windows import list_x11_windows

log = logging.getLogger("vmd.guests.linux.verbs")

LAUNCH_TIMEOUT_S = 30  # starting a program returns at once; its window comes later
PROBE_TIMEOUT_S = 20  # the probe itself gives up after 8 s
# A warm slot's guest gets its own identity before it is saved: every session restored
# from it would otherwise share host keys and a machine-id (vmd/machines/warm_pool.py).
LINUX_IDENTITY = ("rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && "
                  "tr -d - </proc/sys/kernel/random/uuid >/etc/machine-id && "
                  "systemctl reload ssh")
# The desktop is up when openbox manages windows and the terminal is on screen (the
# window exists, unmapped, well before that).
LINUX_DESKTOP_PROBE = ("export DISPLAY=:0; xprop -root _NET_SUPPORTING_WM_CHECK 2>&1 | grep -q 'window id' "
                       "|| { echo 'no window manager yet'; exit 1; }; "
                       "xwininfo -name terminal 2>&1 | grep -E 'Map State|error' | grep -q IsViewable "
                       "|| { echo 'the terminal window is not on screen yet'; exit 1; }")


def launched(path: str, result: CommandResult) -> str:
    if result.exit_code != 0:
        raise GuestError(f"could not start {path}: exit {result.exit_code}: "
                        f"{(result.stderr or result.stdout).strip()[-400:]}")
    return f"started {path}; take a screenshot to see its window."


def probed(result: CommandResult) -> tuple[bool, str]:
    return result.exit_code == 0, (result.stdout + result.stderr).strip()[-300:]


class LinuxVerbs:
    """The OS verbs of a Linux guest (bash, X on :0, sudo, util-linux)."""

    project_path: str
    user: str  # the account the agent's commands run as
    share: str  # "9p" or "smb" (Guest.share)
    share_login: ShareLogin | None  # the SMB share's (Guest.share_login)

    def launch_app(self, path: str, args: list[str]) -> str:
        """Starts `path` on the desktop, detached from the SSH session; the text says what to do next."""
        command = ("DISPLAY=:0 setsid -f " + " ".join(shlex.quote(a) for a in [path, *args])
                   + " >/tmp/vmagent-launch.log 2>&1 </dev/null")
        return launched(path, self.run(command, timeout=LAUNCH_TIMEOUT_S))

    def check_internet(self, host: str) -> tuple[bool, str]:
        """(whether a TCP connection to `host`:80 opens, what the guest said)."""
        command = f"timeout 8 bash -c 'exec 3<>/dev/tcp/{host}/80' && echo reachable"
        return probed(self.run(command, timeout=PROBE_TIMEOUT_S))

    # --- what the machine asks of its guest ---------------------------------------------

    def facts(self, prefix: str = "", runner=None) -> GuestFacts:
        """`prefix`: commands run first in the same shell, their output dropped; `runner`: the
        `run` to use (the exec path for a guest just restored)."""
        script = prefix + (
            ". /etc/os-release; echo \"$PRETTY_NAME\"; uname -srm; "
            "python3 --version 2>&1 || echo none; git --version 2>&1 || echo none; "
            "DISPLAY=:0 xdpyinfo >/dev/null 2>&1 && echo desktop || echo nodesktop; "
            f"mountpoint -q {self.project_path} && echo mounted || echo unmounted; "
            "cat /proc/sys/kernel/random/boot_id; hostname"
        )
        result = (runner or self.run)(script, timeout=30, cwd="/")
        lines = result.stdout.strip().splitlines()
        if len(lines) < 8:
            raise GuestError(f"could not read facts from the guest: {result.stderr.strip()[:300]}")
        return GuestFacts(os=lines[0], kernel=lines[1], python=lines[2], git=lines[3],
                          desktop=lines[4] == "desktop", project_mounted=lines[5] == "mounted",
                          boot_id=lines[6], hostname=lines[7])

    def desktop_problem(self) -> str | None:
        seen = self.run(LINUX_DESKTOP_PROBE, timeout=20)
        return None if seen.exit_code == 0 else (seen.stdout + seen.stderr).strip()[-300:] or "no answer"

    def _mount_line(self) -> str:
        """Mounts the project share unless it is (fstab names the 9p one)."""
        if self.share == "smb":
            if self.share_login is None:
                return "echo 'the SMB share has no login' >&2; false"
            return f"mountpoint -q {self.project_path} || {linux_smb_mount(self.project_path, self.share_login)}"
        return f"mountpoint -q {self.project_path} || sudo -n mount {self.project_path}"

    def mount_share(self) -> str | None:
        # The facts say whether the share is mounted; the machine says why it is not.
        done = self.run(self._mount_line(), timeout=30)
        if done.exit_code != 0:
            said = (done.stdout + done.stderr).strip()[-300:]
            log.warning("mounting the %s project share failed (exit %s): %s", self.share, done.exit_code, said)
            return f"mount exited {done.exit_code}: {said}"
        return None

    def reboot(self) -> None:
        self.run("sudo systemctl reboot", timeout=10)

    def list_windows(self) -> list[ListedWindow]:
        return list_x11_windows(self.run)

    def forget_identity(self) -> None:
        done = self.run(f"sudo sh -c {shlex.quote(LINUX_IDENTITY)} && sudo umount {self.project_path}",
                        timeout=60, cwd="/")
        if done.exit_code != 0:
            raise GuestError(f"the guest could not take a new identity: {(done.stdout + done.stderr)[-300:]}")


def linux_smb_mount(project_path: str, login: ShareLogin, server: str = "10.0.2.4", share: str = "project") -> str:
    """The project over SMB (vmd/machines/smb_share.py) with the kernel's cifs alone: the
    Debian image has no mount.cifs, so the kernel gets the server's address and UNC itself
    (`ip=`, `unc=`: what the helper would resolve), and numeric owner ids. The share's own
    login (`username=`, since mount(8) keeps `user` for itself; its password is letters and
    digits, so no comma ends the option string early) over NTLMSSP, every request signed
    (`sign`: the server requires it too; /proc/mounts then says `sec=ntlmsspi`). noperm:
    the server's modes are vmd's (0600/0700), the guest's user owns everything it sees."""
    fixed = shlex.quote(f"ip={server},unc=\\\\{server}\\{share},username={login.user},password={login.password},"
                        "sec=ntlmssp,sign,vers=3.0,nounix,noperm,file_mode=0644,dir_mode=0755,actimeo=1")
    return (f"sudo -n mkdir -p {shlex.quote(project_path)} && sudo -n mount -t cifs //{server}/{share} "
            f"{shlex.quote(project_path)} -o {fixed},uid=$(id -u),gid=$(id -g)")
