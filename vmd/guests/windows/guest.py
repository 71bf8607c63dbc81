"""A Windows guest over SSH (vmd/guests/guest.py `Guest`): Windows' OpenSSH with PowerShell as
its DefaultShell (the image sets it: vmd/guests/windows/contract.py). Each command is one
exec channel whose line runs RUN_WRAPPER (vmd/guests/windows/scripts.py) in sshd's own PowerShell
(vmd/guests/windows/powershell.py in_shell_command), which maps the project share with the share's
login and runs the command file vmd wrote over SFTP in a powershell.exe of its own, inside a
job object that the timeout terminates whole: two PowerShell starts per command. Files over SFTP with Windows paths
(vmd/guests/windows/paths.py). Its OS verbs are `WindowsVerbs` (vmd/guests/windows/verbs.py).

Why a command file and not the command in the line: a command may be 128 KiB (the contract's
COMMAND_CHARS) and Windows' command line holds 32,767 characters, base64 of UTF-16 included.
"""

from __future__ import annotations

import base64
import secrets
import stat
import time

import paramiko

from vmd.contract.bounds import READ_LIMIT
from vmd.contract.shown_text import one_line
from vmd.guests.guest import (CommandResult, DirListing, FileChunk, Guest, GuestError, OutputCallback, listing_of)
from vmd.guests.output import _CappedStream, _LineSplitter
from vmd.guests.ssh import LIST_TIME_S, SshConnection, drain
from vmd.guests.windows.contract import GUEST_VMD_DIR, PROJECT_PATH, SHARE_LETTER, SHARE_UNC
from vmd.guests.windows.paths import parent, sftp_path, windows_path
from vmd.guests.windows.powershell import b64_utf8, in_shell_command, plain_lines, quoted, strip_clixml
from vmd.guests.windows.scripts import EXIT_TAIL, JOB_DLL, MOUNT_SHARE, RUN_INNER, RUN_WRAPPER, TIMEOUT_LINE, render
from vmd.guests.windows.verbs import WindowsVerbs

# Where vmd's command files and the window lists wait in the guest (deleted once read).
RUN_FOLDER = GUEST_VMD_DIR + "\\run"
# The guest's own timeout fires first: the wrapper needs a moment to kill the job and exit.
HOST_GRACE_S = 10
GUEST_TEXT_CHARS = 500  # characters of an SFTP server's own words in an error message
TIMED_OUT = ("\n[vmd: the command ran past its {timeout:g} s timeout and was killed with everything it "
             "started; give a longer timeout or run it in smaller steps]")


def _clixml_filter(on_output: OutputCallback | None) -> OutputCallback | None:
    """The watcher's callback with stderr's CLIXML shown as its text, line by line (PowerShell
    writes each block as a header line and one line of XML)."""
    if on_output is None:
        return None

    def forward(stream: str, line: str) -> None:
        if stream == "stderr" and (line.startswith("#< CLIXML") or "<Objs" in line):
            for text in plain_lines(strip_clixml(line)).split("\n"):
                if text.strip():
                    on_output(stream, text)
            return
        on_output(stream, line)
    return forward


class WindowsGuest(WindowsVerbs, Guest):
    os_family = "windows"
    # What `run` keeps of each stream (head, tail bytes): the machine sets vmd's config's
    # (vmd/guests/output.py OutputBounds); None keeps _CappedStream's defaults.
    output = None
    _mapped_for = None  # the SSH transport whose logon had the project drive mapped (_share_ready)

    def __init__(self, ssh: SshConnection, project_path: str = PROJECT_PATH):
        self.ssh = ssh
        self.project_path = windows_path(project_path, PROJECT_PATH)
        self.drive = self.project_path[:2]
        self.share_unc = SHARE_UNC if self.drive.upper() == SHARE_LETTER.upper() else None

    @property
    def user(self) -> str:
        return self.ssh.user

    # --- shell ---------------------------------------------------------------------

    def command_line(self, command_file: str, cwd: str, seconds: int) -> str:
        """The exec line of one command: the wrapper, with the command's own script inside it.
        It holds the share's password: it goes to the guest and nowhere else."""
        inner = render(RUN_INNER, CWD_B64=quoted(b64_utf8(cwd)), FILE_B64=quoted(b64_utf8(command_file)))
        inner_b64 = base64.b64encode(inner.encode("utf-16-le")).decode("ascii")
        wrapper = render(RUN_WRAPPER, SECONDS=seconds, MAP_SHARE=self.maps_share,
                         JOB_DLL=quoted("vmd\\" + JOB_DLL), INNER=quoted(inner_b64),
                         TIMEOUT_LINE=quoted(TIMEOUT_LINE), **self.share_values())
        return in_shell_command(wrapper)

    def run(self, command: str, timeout: float = 300, cwd: str | None = None,
            on_output: OutputCallback | None = None) -> CommandResult:
        cwd = windows_path(cwd, self.project_path) if cwd else self.project_path
        seconds = max(1, int(round(timeout)))
        command_file = f"{RUN_FOLDER}\\{secrets.token_hex(8)}.ps1"
        # A BOM-less UTF-8 file: RUN_INNER reads it as UTF-8 itself, whatever the code page.
        self._write("run", command_file, (command + "\n" + EXIT_TAIL).encode("utf-8"), "wb")
        started = time.monotonic()
        deadline = started + timeout + HOST_GRACE_S
        bounds = () if self.output is None else (self.output.head, self.output.tail)
        caps = {"stdout": _CappedStream(*bounds), "stderr": _CappedStream(*bounds)}
        watcher = _clixml_filter(on_output)
        splitters = {name: _LineSplitter(name, watcher) for name in caps}

        def sink(stream: str, data: bytes) -> None:
            caps[stream].add(data)
            splitters[stream].feed(data)

        try:
            channel = self.ssh.open_channel(command=self.command_line(command_file, cwd, seconds))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise GuestError(f"the command could not be started in the guest: {one_line(str(exc))[:300]}; "
                             "it did not run. Try again, or reboot_vm if the guest stays silent.") from None
        try:
            # End of input at once, as Linux's </dev/null: powershell.exe with its stdin a pipe
            # left open can wait on it, and nothing vmd runs reads from vmd.
            channel.shutdown_write()
            exit_code, host_gave_up = drain(channel, sink, deadline)
        finally:
            for splitter in splitters.values():
                splitter.flush()
        stderr = plain_lines(strip_clixml(caps["stderr"].text()))
        timed_out = host_gave_up or (exit_code == 124 and TIMEOUT_LINE in stderr)
        if timed_out:
            stderr = stderr.replace(TIMEOUT_LINE + "\n", "").replace(TIMEOUT_LINE, "").rstrip("\n")
            stderr += TIMED_OUT.format(timeout=timeout)
        return CommandResult(exit_code=exit_code, stdout=plain_lines(caps["stdout"].text()), stderr=stderr,
                             duration=round(time.monotonic() - started, 3),
                             truncated=bool(caps["stdout"].dropped or caps["stderr"].dropped), timed_out=timed_out)

    # --- files ---------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        return windows_path(path, self.project_path)

    def _share_ready(self, full: str) -> None:
        """SFTP runs in this SSH connection's logon, where the project drive exists only once
        something mapped it there: a connection vmd opened anew (after a question's wait, a
        dropped transport) maps it before its first SFTP request on the drive. A mapping that
        fails shows as the request's own error."""
        if not self.maps_share or not full[:2].upper() == self.drive.upper():
            return
        transport = self.ssh.transport()
        if self._mapped_for is transport:
            return
        self._mapped_for = transport
        self._ps(MOUNT_SHARE, 30, **self.share_values())

    def _sftp_call(self, verb: str, path: str, fn):
        try:
            self._share_ready(path)
            return fn()
        except FileNotFoundError:
            raise GuestError(f"{verb} {path}: no such file or folder in the guest; "
                             "list_dir its folder to see what is there") from None
        except PermissionError:
            raise GuestError(f"{verb} {path}: access denied for the user '{self.ssh.user}' (the file may be "
                             f"open in a program, or protected); work under {self.project_path}") from None
        except IsADirectoryError:
            raise GuestError(f"{verb} {path}: that is a folder; use list_dir") from None
        except TimeoutError:
            self.ssh.drop_sftp()
            raise GuestError(f"{verb} {path}: the guest did not answer within {self.ssh.sftp_reply_timeout:g} s "
                             "(it is paused, overloaded or gone); try again, or run a command to see "
                             "whether it still answers") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise GuestError(f"{verb} {path}: {one_line(str(exc))[:GUEST_TEXT_CHARS]}") from None

    def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> FileChunk:
        full = self.resolve(path)
        limit = min(limit or READ_LIMIT, READ_LIMIT)

        def read():
            sftp = self.ssh.sftp()
            attrs = sftp.stat(sftp_path(full))
            if stat.S_ISDIR(attrs.st_mode or 0):
                raise IsADirectoryError(full)
            with sftp.open(sftp_path(full), "rb") as fh:
                fh.seek(offset)
                data = fh.read(limit + 1)
            return attrs.st_size or 0, data

        size, data = self._sftp_call("read_file", full, read)
        return FileChunk(content=data[:limit].decode("utf-8", "replace"), size=size, offset=offset,
                         truncated=len(data) > limit)

    def _write(self, verb: str, full: str, data: bytes, mode: str) -> int:
        def write():
            sftp = self.ssh.sftp()
            missing, folder = [], parent(full)
            while len(folder) > 3:  # a drive's root is always there
                try:
                    sftp.stat(sftp_path(folder))
                    break
                except FileNotFoundError:
                    missing.append(folder)
                    folder = parent(folder)
            for part in reversed(missing):
                sftp.mkdir(sftp_path(part))
            with sftp.open(sftp_path(full), mode) as fh:
                fh.write(data)
            return len(data)

        return self._sftp_call(verb, full, write)

    def write_file(self, path: str, content: str | bytes) -> int:
        data = content.encode() if isinstance(content, str) else content
        return self._write("write_file", self.resolve(path), data, "wb")

    def append_file(self, path: str, content: str | bytes) -> int:
        data = content.encode() if isinstance(content, str) else content
        return self._write("append_file", self.resolve(path), data, "ab")

    def remove_file(self, full: str) -> None:
        """Removes a file vmd put in the guest; one already gone is no error."""
        try:
            self.ssh.sftp().remove(sftp_path(full))
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def list_dir(self, path: str) -> DirListing:
        full = self.resolve(path)

        def listing():
            sftp = self.ssh.sftp()
            folder = sftp.list_folder(sftp_path(full))
            if folder.out_of_step:
                self.ssh.drop_sftp()
            return listing_of(folder, list_time_s=LIST_TIME_S, fold_case=True,
                              narrower="run('Get-ChildItem | Select-Object -First 50')",
                              long_names="255 bytes of UTF-8")

        return self._sftp_call("list_dir", full, listing)

    def close(self) -> None:
        self.ssh.close()
