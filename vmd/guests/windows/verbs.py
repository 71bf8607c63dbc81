"""The OS verbs of a Windows guest (vmd/guests/windows/guest.py `WindowsGuest` mixes them in): start a
program on the desktop, probe the internet, list the windows, and what the machine asks of its guest (facts, desktop, share, clock, reboot). Every
script is a template of vmd/guests/windows/scripts.py; failures are `GuestError`s.

Two things sshd's session cannot do itself, because it runs in session 0, whose desktop no
one sees: start a window, and see the windows. Both go through the image's task that runs in
the logged-on user's session (vmd/guests/windows/contract.py VMD_LAUNCH_TASK: it starts
the one command line written to LAUNCH_REQUEST, through `cmd /c start`).
"""

from __future__ import annotations

import logging
import secrets
import time

from vmd.guests.guest import CommandResult, GuestError, GuestFacts, ListedWindow, ShareLogin, screen_coordinate
from vmd.guests.ssh import SshConnection
from vmd.guests.windows.contract import GUEST_VMD_DIR, LAUNCH_REQUEST, VMD_LAUNCH_TASK
from vmd.guests.windows.powershell import quoted
from vmd.guests.windows.scripts import (CHECK_INTERNET, DESKTOP_PROBE, FACTS,
                                        LIST_WINDOWS, MOUNT_SHARE, NEW_IDENTITY, REBOOT, REMAP_SHARE, RUN_LAUNCH_TASK,
                                        SET_CLOCK, WINDOWS_DLL, render)

log = logging.getLogger("vmd.guests.windows.verbs")

LAUNCH_TIMEOUT_S = 30  # the task starts the program and returns; its window comes later
PROBE_TIMEOUT_S = 20  # the probe itself gives up after 8 s
# The window list is written by a program the session task starts: a PowerShell start, and
# the first time on a guest a C# compile. 15 s is a guess with room (not measured: no Windows
# boots on vmd's build machines); past it vmd says it got none.
WINDOWS_WAIT_S = 15.0
WINDOWS_POLL_S = 0.25
# The desktop's mapping script starts like the window list's (one PowerShell start, no compile);
# past this its task is taken not to have run it (not measured: no Windows boots here).
REMAP_WAIT_S = 10.0
# The new identity's script: ssh-keygen, icacls and a registered task, a few seconds; then
# sshd's restart by that task (3 s after) and its start, waited for up to identity_wait_s.
IDENTITY_SCRIPT_S = 120
IDENTITY_POLL_S = 1.0
# `cmd /c start` reads the launch line: a quote or a percent sign in it would be cmd's, not
# the program's (cmd expands %NAME% even inside quotes), and a line end ends the line.
LAUNCH_REFUSED = set('"%\r\n')
CMD_SPECIAL = set(" \t&|<>^(),;=")


def launch_line(path: str, args: list[str]) -> str:
    """The one line the session task hands to `cmd /c start ""`: each part quoted when cmd
    would split or read it."""
    parts = []
    for part in [path, *args]:
        bad = LAUNCH_REFUSED.intersection(part)
        if bad:
            raise GuestError(f"launch_app cannot pass {part!r} on Windows: it holds {''.join(sorted(bad))!r}, "
                             "which cmd.exe (that starts the program in the desktop session) would read "
                             "itself. Write a .cmd or .ps1 file in the project that starts the program "
                             "with these arguments, and launch_app that file.")
        parts.append(f'"{part}"' if not part or CMD_SPECIAL.intersection(part) else part)
    return " ".join(parts)


def parse_windows_listing(text: str) -> list[ListedWindow]:
    """LIST_WINDOWS' file: `@@active <handle>`, then one tab-separated line per window
    (handle, x, y, width, height, frame, title), front first, or `@@error <what>`. A line
    that does not parse costs its window only: the file was written by the guest."""
    active, windows = "", []
    for line in text.splitlines():
        if line.startswith("@@error "):
            raise GuestError(f"the desktop session could not list its windows: {line[8:].strip()[:300]}")
        if line.startswith("@@active "):
            active = line.split(" ", 1)[1].strip()
            continue
        fields = line.split("\t", 6)
        if len(fields) != 7:
            continue
        try:
            x, y, width, height = (screen_coordinate(v) for v in fields[1:5])
            frame = tuple(max(0, screen_coordinate(v)) for v in fields[5].split(","))
        except ValueError:
            continue
        if width < 8 or height < 8 or len(frame) != 4:
            continue
        windows.append(ListedWindow(title=fields[6][:400], x=x, y=y, width=width, height=height,
                                    active=active != "" and fields[0].strip() == active, frame=frame))
    return windows


def _said(result: CommandResult) -> str:
    return (result.stderr or result.stdout).strip()[-400:]


class WindowsVerbs:
    """The OS verbs of a Windows guest (OpenSSH with PowerShell as its shell), built on
    `WindowsGuest`'s run, _write, read_file, remove_file, another, close and its ssh."""

    ssh: SshConnection
    project_path: str
    drive: str
    share_unc: str | None
    share_login: ShareLogin | None
    identity_wait_s = 90.0  # sshd's restart with its new keys (forget_identity)
    # Whether the desktop session was asked to map the drive with this share's login (REMAP_SHARE).
    _desktop_mapped = False
    _mapped_for = None  # WindowsGuest._share_ready's

    @property
    def maps_share(self) -> bool:
        """Whether commands map the project drive: a share on the drive, and its login."""
        return self.share_unc is not None and self.share_login is not None

    def share_values(self) -> dict:
        """The template values of the share's mapping (NET_USE); the password among them."""
        login = self.share_login or ShareLogin(user="", password="")
        return dict(DRIVE_ROOT=quoted(self.drive + "\\"), DRIVE=self.drive, SHARE_UNC=quoted(self.share_unc or ""),
                    SHARE_USER=quoted(login.user), SHARE_PASSWORD=quoted(login.password))

    def _ps(self, template: str, timeout: float, **values) -> CommandResult:
        return self.run(render(template, **values), timeout=timeout, cwd="C:\\")

    def _start_in_session(self, line: str) -> CommandResult:
        """Asks the session task to start `line` in the logged-on user's session."""
        # UTF-8 with its BOM: Windows PowerShell 5.1's Get-Content reads a file without one
        # in the ANSI code page, and a path with a non-ASCII letter would not be found.
        self._write("launch_app", LAUNCH_REQUEST, b"\xef\xbb\xbf" + line.encode("utf-8"), "wb")
        return self._ps(RUN_LAUNCH_TASK, LAUNCH_TIMEOUT_S, TASK=quoted(VMD_LAUNCH_TASK))

    def launch_app(self, path: str, args: list[str]) -> str:
        if not self._desktop_mapped:  # the program may look for its files on the project drive
            self._remap_in_session()  # waits until the task took its request: one request at a time
        result = self._start_in_session(launch_line(path, args))
        if result.exit_code != 0:
            raise GuestError(f"could not start {path}: the desktop session's task did not run (exit "
                             f"{result.exit_code}: {_said(result)}); is the user logged on? take a screenshot.")
        return (f"asked the desktop session to start {path}; take a screenshot to see its window (a program "
                "that is not found shows no window and no error: check the path with Test-Path).")

    def check_internet(self, host: str) -> tuple[bool, str]:
        result = self._ps(CHECK_INTERNET, PROBE_TIMEOUT_S, HOST=quoted(host))
        return result.exit_code == 0, (result.stdout + result.stderr).strip()[-300:]

    # --- what the machine asks of its guest ---------------------------------------------

    def facts(self) -> GuestFacts:
        result = self._ps(FACTS, 60, DRIVE_ROOT=quoted(self.drive + "\\"))
        found = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        missing = {"os", "build", "powershell", "desktop", "boot", "hostname"} - set(found)
        if missing:
            raise GuestError(f"could not read facts from the Windows guest (no {', '.join(sorted(missing))}): "
                             f"{_said(result)[:300]}")
        # Facts has one field for the system's version: Windows' build, PowerShell's and .NET's.
        kernel = f"Windows {found['build']}; PowerShell {found['powershell']}; dotnet {found.get('dotnet', 'none')}"
        return GuestFacts(os=found["os"], kernel=kernel, python=found.get("python", "none"),
                          git=found.get("git", "none"), desktop=found["desktop"] == "True",
                          project_mounted=found.get("mounted") == "True", boot_id=found["boot"],
                          hostname=found["hostname"])

    def desktop_problem(self) -> str | None:
        seen = self._ps(DESKTOP_PROBE, 20)
        return None if seen.exit_code == 0 else _said(seen) or "no answer"

    def mount_share(self) -> str | None:
        """The project drive in sshd's logons (checked: None, or what net.exe said) and in the
        desktop session (asked of the session task; a failure there is logged)."""
        if self.share_unc is None:
            return None
        if self.share_login is None:
            return "the SMB share has no login (vmd found no account for it)"
        done = self._ps(MOUNT_SHARE, 30, **self.share_values())
        self._mapped_for = self.ssh.transport() if done.exit_code == 0 else None
        self._remap_in_session()
        return None if done.exit_code == 0 else _said(done) or f"exit {done.exit_code}"

    def restored(self, now: float, mount_share: bool) -> GuestFacts:
        self._ps(SET_CLOCK, 30, MILLIS=int(now * 1000))
        if mount_share:
            self._desktop_mapped = False  # the slot's mapping had the slot's login
            self.mount_share()
        return self.facts()

    def _remap_in_session(self) -> None:
        """The desktop session's drive mapped to the session's share with its login
        (REMAP_SHARE): a program the model starts there finds its files on the drive. Waits
        (at most REMAP_WAIT_S) until the script has removed itself, which it does first: the
        session task has then taken its request, and LAUNCH_REQUEST is free for the next. A
        task that does not run it (no one logged on yet) is logged, the script removed, and
        it is tried again at the next launch_app; the command line's own mapping stands."""
        if not self.maps_share:
            return
        script = f"{GUEST_VMD_DIR}\\run\\share-{secrets.token_hex(6)}.ps1"
        text = render(REMAP_SHARE, **self.share_values())
        self._write("mount_share", script, b"\xef\xbb\xbf" + text.encode("utf-8"), "wb")
        started = self._start_in_session(f"powershell.exe -NoProfile -NonInteractive -WindowStyle Hidden "
                                         f"-ExecutionPolicy Bypass -File {script}")
        taken = started.exit_code == 0 and self._gone(script, REMAP_WAIT_S)
        if not taken:
            self.remove_file(script)  # not run: its password goes now
            log.warning("the desktop session did not map %s with the share's login (task exit %s%s)", self.drive,
                        started.exit_code, f": {_said(started)}" if started.exit_code else ", the script stayed")
        self._desktop_mapped = taken

    def _gone(self, path: str, wait_s: float) -> bool:
        until = time.monotonic() + wait_s
        while True:
            try:
                self.read_file(path, 0, 1)
            except GuestError:
                return True
            if time.monotonic() > until:
                return False
            time.sleep(WINDOWS_POLL_S)

    def reboot(self) -> None:
        try:
            self._ps(REBOOT, 10)
        except GuestError:  # the guest went away mid-answer: that is the reboot
            pass

    def forget_identity(self) -> None:
        """New sshd host keys and MachineGuid (NEW_IDENTITY), and back only once sshd serves
        one of the new keys: the slot is saved with sshd restarted, so every session restored
        from it meets keys no other slot has. The share needs no unmount (QEMU saves a guest
        on SMB; the drive's mapping belongs to this SSH logon, which ends here)."""
        done = self._ps(NEW_IDENTITY, IDENTITY_SCRIPT_S)
        if done.exit_code != 0:
            raise GuestError(f"the Windows guest could not take a new identity: {_said(done)}")
        new_keys = {line.split()[1] for line in done.stdout.splitlines()
                    if line.startswith("key=") and len(line.split()) >= 2}
        if not new_keys:
            raise GuestError(f"the Windows guest listed no new sshd host key: {_said(done)}")
        self.close()  # its sshd restarts under it
        until, served = time.monotonic() + self.identity_wait_s, "no answer"
        while True:
            probe = self.ssh.another()
            try:
                served = probe.transport().get_remote_server_key().get_base64()
                if served in new_keys:
                    return
                served = "the old host key"
            except Exception as exc:  # sshd restarting: refused, reset
                served = f"{type(exc).__name__}: {exc}"
            finally:
                probe.close()
            if time.monotonic() > until:
                raise GuestError(f"sshd did not come back with its new host keys within {self.identity_wait_s:g} s "
                                 f"(last: {served[:200]})")
            time.sleep(IDENTITY_POLL_S)

    def list_windows(self) -> list[ListedWindow]:
        """The user's windows, listed by LIST_WINDOWS run in the desktop session by the session task."""
        token = secrets.token_hex(6)
        script, out = f"{GUEST_VMD_DIR}\\run\\windows-{token}.ps1", f"{GUEST_VMD_DIR}\\run\\windows-{token}.txt"
        listing = render(LIST_WINDOWS, WINDOWS_DLL=quoted("vmd\\" + WINDOWS_DLL))
        self._write("list_windows", script, b"\xef\xbb\xbf" + listing.encode("utf-8"), "wb")
        try:
            started = self._start_in_session(
                f"powershell.exe -NoProfile -NonInteractive -WindowStyle Hidden -ExecutionPolicy Bypass "
                f"-File {script} -Out {out}")
            if started.exit_code != 0:
                raise GuestError(f"the desktop session's task did not run (exit {started.exit_code}: {_said(started)})")
            until = time.monotonic() + WINDOWS_WAIT_S
            while True:
                try:
                    written = self.read_file(out).content
                except GuestError:  # not there yet
                    if time.monotonic() > until:
                        raise GuestError(f"the desktop session wrote no window list within {WINDOWS_WAIT_S:g} s "
                                         "(is the user logged on?)") from None
                    time.sleep(WINDOWS_POLL_S)
                    continue
                return parse_windows_listing(written)
        finally:
            self.remove_file(script)
            self.remove_file(out)
