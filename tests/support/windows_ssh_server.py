"""An SSH server on loopback that answers like Windows' OpenSSH with PowerShell as its
DefaultShell, for vmd/guests/windows/guest.py: it records every exec command line, decodes the
wrapper the line hands to sshd's own PowerShell (`in_shell_command`) and checks it (the wrapper, and the command's own script inside
it, parse as PowerShell; it never runs them), and answers with what a test's `respond`
says, as Windows would send it: CR LF line ends, UTF-8, CLIXML on stderr where PowerShell
writes it. Its SFTP subsystem (paramiko's SFTPServer) is rooted in a folder where a Windows
path `/Z:/src/a.py` is `<root>/Z/src/a.py`, and names are found without regard to case,
as on NTFS.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import paramiko
from paramiko.sftp import SFTP_NO_SUCH_FILE, SFTP_OK

from vmd.guests.windows.powershell import decode_in_shell

_QUOTED_B64 = r"'([A-Za-z0-9+/=]*)'"


@dataclass
class Exec:
    """One exec request as the server read it."""
    line: str  # the command line exactly as sent
    wrapper: str  # the script the line runs in sshd's PowerShell, decoded
    inner: str = ""  # the command's own powershell.exe script (RUN_INNER), decoded
    cwd: str = ""
    command_file: str = ""
    command: str = ""  # the command file's text, as vmd wrote it
    seconds: int = 0
    connection: int = 0  # which SSH connection sent it (a baseline uses its own)
    stdin_closed: bool = False  # vmd sent EOF on the channel before the answer came


@dataclass
class Reply:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    delay: float = 0.0


@dataclass
class Recorded:
    execs: list[Exec] = field(default_factory=list)
    sftp: list[tuple[str, str]] = field(default_factory=list)  # (operation, path)
    connections: int = 0


def parse_exec(line: str) -> Exec:
    """The parts of vmd's exec line (ValueError when it is not vmd's wrapper)."""
    wrapper = decode_in_shell(line)
    found = Exec(line=line, wrapper=wrapper)
    inner = re.search(r"-EncodedCommand ' \+ " + _QUOTED_B64, wrapper)
    if inner is None:
        raise ValueError("the wrapper starts no inner command")
    found.inner = base64.b64decode(inner.group(1)).decode("utf-16-le")
    found.seconds = int(re.search(r"\$vmdSeconds = (\d+)", wrapper).group(1))
    cwd = re.search(r"\$vmdCwd = .*FromBase64String\(" + _QUOTED_B64, found.inner)
    command_file = re.search(r"\$vmdFile = .*FromBase64String\(" + _QUOTED_B64, found.inner)
    found.cwd = base64.b64decode(cwd.group(1)).decode()
    found.command_file = base64.b64decode(command_file.group(1)).decode()
    return found


def local_path(root: Path, path: str) -> Path:
    """Where a Windows path (`/Z:/src`, `Z:/src` or `Z:\\src`) lies under `root`: each name
    matched without regard to case, as NTFS does."""
    match = re.match(r"^/?([A-Za-z]):([/\\].*)?$", path)
    if not match:
        raise FileNotFoundError(path)  # Windows' sftp-server has no path without a drive
    place = root / match.group(1).upper()
    for name in re.split(r"[/\\]", match.group(2) or ""):
        if not name:
            continue
        same = [p for p in place.iterdir() if p.name.casefold() == name.casefold()] if place.is_dir() else []
        place = same[0] if same else place / name
    return place


class WindowsFiles(paramiko.SFTPServerInterface):
    """SFTP over `root`, with Windows' path form and case-insensitive names."""

    root: Path
    recorded: Recorded

    def local(self, path: str) -> Path:
        return local_path(self.root, path)

    def _attrs(self, place: Path):
        return paramiko.SFTPAttributes.from_stat(place.stat(), place.name)

    def stat(self, path):
        self.recorded.sftp.append(("stat", path))
        place = self.local(path)
        if not place.exists():
            return SFTP_NO_SUCH_FILE
        return self._attrs(place)

    lstat = stat

    def list_folder(self, path):
        self.recorded.sftp.append(("list", path))
        place = self.local(path)
        if not place.is_dir():
            return SFTP_NO_SUCH_FILE
        return [self._attrs(p) for p in sorted(place.iterdir())]

    def open(self, path, flags, attr):
        self.recorded.sftp.append(("open", path))
        place = self.local(path)
        if flags & os.O_CREAT:
            if not place.parent.is_dir():
                return SFTP_NO_SUCH_FILE
            mode = "ab" if flags & os.O_APPEND else ("r+b" if place.exists() and not flags & os.O_TRUNC else "wb")
        elif not place.is_file():
            return SFTP_NO_SUCH_FILE
        else:
            mode = "rb" if (flags & 3) == os.O_RDONLY else "r+b"
        handle = paramiko.SFTPHandle(flags)
        fh = open(place, mode)
        handle.readfile = fh if "r" in mode else None
        handle.writefile = fh if mode != "rb" else None
        return handle

    def mkdir(self, path, attr):
        self.recorded.sftp.append(("mkdir", path))
        self.local(path).mkdir()
        return SFTP_OK

    def remove(self, path):
        self.recorded.sftp.append(("remove", path))
        place = self.local(path)
        if not place.is_file():
            return SFTP_NO_SUCH_FILE
        place.unlink()
        return SFTP_OK


class _Server(paramiko.ServerInterface):
    def __init__(self, fake: "WindowsSshServer", number: int):
        self.fake, self.number = fake, number

    def check_auth_publickey(self, username, key):
        ok = username == self.fake.user and key.get_base64() == self.fake.key.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username):
        return "publickey"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        line = command.decode("utf-8")
        try:
            found = parse_exec(line)
            found.connection = self.number
            command_file = self.fake.files_path(found.command_file)
            found.command = command_file.read_text(encoding="utf-8")
            command_file.unlink()  # RUN_INNER removes it once read
            self.fake.check(found.line)  # what sshd's PowerShell itself parses (`-c <line>`)
            self.fake.check(found.wrapper)
            self.fake.check(found.inner)
            self.fake.check(found.command)
        except Exception as exc:  # not vmd's wrapper: PowerShell would say what it could not parse
            found, reply = Exec(line=line, wrapper="", connection=self.number), Reply(stderr=f"{exc}\r\n", exit_code=1)
        else:
            reply = self.fake.respond(found)
        self.fake.recorded.execs.append(found)
        threading.Thread(target=self._answer, args=(channel, reply, found), daemon=True).start()
        return True

    @staticmethod
    def _answer(channel, reply: Reply, found: Exec) -> None:
        try:
            # paramiko sends the exec request's success only once this method's caller
            # returns: an answer sent before it closed the channel under the client's wait
            # ("Channel closed"). sshd answers after it, as this does.
            time.sleep(0.05 + reply.delay)
            found.stdin_closed = channel.eof_received
            if reply.stdout:
                channel.sendall(reply.stdout.encode("utf-8"))
            if reply.stderr:
                channel.sendall_stderr(reply.stderr.encode("utf-8"))
            channel.send_exit_status(reply.exit_code)
        except Exception:  # vmd closed the channel first
            pass
        finally:
            channel.close()


_HOST_KEYS: list[paramiko.RSAKey] = []


def _host_key() -> paramiko.RSAKey:
    """One host key for every server of a test run: making one costs a tenth of a second."""
    if not _HOST_KEYS:
        _HOST_KEYS.append(paramiko.RSAKey.generate(2048))
    return _HOST_KEYS[0]


class WindowsSshServer:
    """`with WindowsSshServer(tmp_path, respond) as server:` listens on 127.0.0.1:server.port."""

    def __init__(self, root: Path, respond: Callable[[Exec], Reply], check: Callable[[str], None],
                 user: str = "agent"):
        self.root = root
        (root / "C").mkdir(parents=True, exist_ok=True)
        (root / "Z").mkdir(exist_ok=True)
        self.respond, self.check, self.user = respond, check, user
        self.key = paramiko.Ed25519Key.from_private_key_file(str(self._key_file()))
        self.host_key = _host_key()
        self.recorded = Recorded()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.transports: list[paramiko.Transport] = []
        self.files = type("Files", (WindowsFiles,), {"root": root, "recorded": self.recorded})

    def _key_file(self) -> Path:
        path = self.root.parent / "id_ed25519"
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        return path

    @property
    def key_path(self) -> str:
        return str(self.root.parent / "id_ed25519")

    def files_path(self, windows: str) -> Path:
        return local_path(self.root, windows)

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.recorded.connections += 1
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            transport.set_subsystem_handler("sftp", paramiko.SFTPServer, self.files)
            transport.start_server(server=_Server(self, self.recorded.connections))
            self.transports.append(transport)

    def __enter__(self) -> "WindowsSshServer":
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()
        for transport in self.transports:
            transport.close()
