"""A hostile guest's SSH server for tests: paramiko's server on loopback, in this process,
whose exec channels and SFTP subsystem are whatever a test makes them. The guest is an
attacker: it can replace its sftp-server and its shell, and print anything.

`HostileSshd.exec_handler(command, channel)` runs on a thread of its own per exec;
`HostileSshd.sftp_handler(request) -> replies` answers each raw SFTP request (the
protocol is written by hand so that a test controls every byte of every reply).
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import paramiko

# SFTP packet types and status codes (draft-ietf-secsh-filexfer-02), the few used here.
INIT, VERSION, OPEN, CLOSE, OPENDIR, READDIR, STAT, LSTAT, FSTAT = 1, 2, 3, 4, 11, 12, 17, 7, 8
STATUS, HANDLE, NAME, ATTRS = 101, 102, 104, 105
OK, EOF, NO_SUCH_FILE = 0, 1, 2


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def string(b: bytes) -> bytes:
    return u32(len(b)) + b


def packet(kind: int, body: bytes) -> bytes:
    return u32(len(body) + 1) + bytes([kind]) + body


def status(request_id: int, code: int) -> bytes:
    return packet(STATUS, u32(request_id) + u32(code) + string(b"") + string(b""))


def file_attrs(size: int = 0, mode: int = 0o100644) -> bytes:
    return u32(0x1 | 0x4) + struct.pack(">Q", size) + u32(mode)


def names(request_id: int, entries: Iterable[tuple[bytes, int]]) -> bytes:
    """A NAME reply of (name, size) regular files."""
    entries = list(entries)
    body = u32(request_id) + u32(len(entries))
    for name, size in entries:
        body += string(name) + string(b"-rw-r--r-- 1 agent agent " + name) + file_attrs(size)
    return packet(NAME, body)


class _Server(paramiko.ServerInterface):
    def __init__(self, sshd: "HostileSshd"):
        self.sshd = sshd

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        command = command.decode() if isinstance(command, bytes) else command
        self.sshd.commands.append(command)
        threading.Thread(target=self.sshd._exec, args=(command, channel), daemon=True).start()
        return True

    def check_channel_subsystem_request(self, channel, name):
        if name != "sftp" or self.sshd.sftp_handler is None:
            return False
        threading.Thread(target=self.sshd._sftp, args=(channel,), daemon=True).start()
        return True


class HostileSshd:
    def __init__(self, tmp_path: Path):
        self.key_path = tmp_path / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key_path)], check=True)
        self.host_key = paramiko.RSAKey.generate(1024)
        self.exec_handler: Callable[[str, paramiko.Channel], None] = self.exit_zero
        self.sftp_handler: Callable[[int, int, bytes], Iterable[bytes]] | None = None
        self.commands: list[str] = []
        self.stop = threading.Event()
        self.transports: list[paramiko.Transport] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @staticmethod
    def exit_zero(command: str, channel: paramiko.Channel) -> None:
        channel.send_exit_status(0)
        channel.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            transport.start_server(server=_Server(self))
            self.transports.append(transport)

    def _exec(self, command: str, channel: paramiko.Channel) -> None:
        # The handler starts before paramiko answers the exec request: a channel closed
        # at once read as "Channel closed" to the client, which had no answer yet.
        time.sleep(0.1)
        try:
            self.exec_handler(command, channel)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client closed the channel: what a test wants

    def _sftp(self, channel: paramiko.Channel) -> None:
        buffer = b""
        try:
            while not self.stop.is_set():
                while len(buffer) < 4 or len(buffer) < 4 + struct.unpack(">I", buffer[:4])[0]:
                    data = channel.recv(65536)
                    if not data:
                        return
                    buffer += data
                size = struct.unpack(">I", buffer[:4])[0]
                body, buffer = buffer[4:4 + size], buffer[4 + size:]
                kind = body[0]
                if kind == INIT:
                    channel.sendall(packet(VERSION, u32(3)))
                    continue
                request_id = struct.unpack(">I", body[1:5])[0]
                for reply in self.sftp_handler(kind, request_id, body[5:]):
                    if self.stop.is_set():
                        return
                    channel.sendall(reply)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def close(self) -> None:
        self.stop.set()
        # shutdown wakes the accept() under way; close alone does not, and the thread's next
        # accept() could then take the fd number a later socket got (vmd's own listener in
        # test_history_verb, whose client then met this server's SSH banner).
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._accepting.join(5)
        self.listener.close()
        for transport in self.transports:
            transport.close()
