"""The SSH connection to a guest: one persistent paramiko transport, a channel per command,
one SFTP client; every request bounded in time, and close() never waiting on the guest."""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import paramiko
from paramiko.sftp import CMD_CLOSE, CMD_HANDLE, CMD_NAME, CMD_OPENDIR, CMD_READDIR, SFTPError

# How long the guest may take to answer one SSH request: a channel's open, an exec or
# subsystem start, one SFTP reply. A running guest answers these in milliseconds even
# under TCG; one that QEMU paused (its disk could not grow: the host's disk is full) or
# that hung answers never, and paramiko would wait an hour for the open and forever for
# the exec's answer, with the verb, the session and its close waiting behind it.
REQUEST_TIMEOUT_S = 30
SFTP_REPLY_TIMEOUT_S = 60
# How often an idle transport tells the guest it is there (paramiko's keepalive).
KEEPALIVE_S = 15
# The largest SFTP packet read from the guest: OpenSSH's sftp-server refuses anything over
# 256 KiB itself (SFTP_MAX_MSG_LENGTH), and paramiko asks for file data 32 KiB at a time.
# Without it paramiko reads any length up to 16 MiB into memory, for each reply.
SFTP_MAX_PACKET = 256 * 1024
# A listing answered by the guest is read one reply at a time, and stopped past these:
# a hostile sftp-server that answered with 400,000 entries grew vmd by 317 MiB in 2.9 s,
# each reply quick enough that no per-reply bound fired. OpenSSH sends up to 100 entries
# a reply, so 10,000 entries are 100 round trips, well under a second on a real guest.
LIST_MAX_ENTRIES = 10_000
LIST_TIME_S = 30.0
# Linux's NAME_MAX: no file in the guest has a longer name; an entry with one is left out.
NAME_MAX_BYTES = 255

_ATTR_SIZE, _ATTR_UIDGID, _ATTR_PERMISSIONS, _ATTR_ACMODTIME = 0x1, 0x2, 0x4, 0x8
_ATTR_EXTENDED = 0x80000000


class GuestNotAnswering(paramiko.SSHException):
    """The guest did not answer an SSH request in time."""


@dataclass
class FolderEntry:
    name: str
    mode: int
    size: int


@dataclass
class Folder:
    """What `BoundedSftp.list_folder` read: at most its cap of entries, and why it stopped
    early when it did. `out_of_step`: a reply was cut off, the client must be dropped."""
    entries: list[FolderEntry] = field(default_factory=list)
    more: bool = False  # the cap was reached; the guest had more to list
    timed_out: bool = False  # the total time bound passed first
    long_names: int = 0  # entries left out for a name over NAME_MAX_BYTES
    out_of_step: bool = False


class _Short(Exception):
    """A NAME reply ended inside an entry."""


class _Reader:
    """Reads SFTP's big-endian fields from one reply; every read consumes bytes or raises,
    so a count the reply does not hold ends the loop instead of spinning on padding."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Short
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def string(self) -> bytes:
        return self.take(self.u32())

    def attrs(self) -> tuple[int, int]:
        """(mode, size) of an ATTRS block; the rest is skipped."""
        flags, mode, size = self.u32(), 0, 0
        if flags & _ATTR_SIZE:
            size = struct.unpack(">Q", self.take(8))[0]
        if flags & _ATTR_UIDGID:
            self.take(8)
        if flags & _ATTR_PERMISSIONS:
            mode = self.u32()
        if flags & _ATTR_ACMODTIME:
            self.take(8)
        if flags & _ATTR_EXTENDED:
            for _ in range(self.u32()):
                self.string(), self.string()
        return mode, size


class BoundedSftp(paramiko.SFTPClient):
    """paramiko's SFTP client with the guest's replies bounded: a packet is at most
    SFTP_MAX_PACKET bytes and must arrive whole within `reply_timeout` (paramiko bounds
    only each recv, so a reply sent a byte a minute never ended), and `list_folder`
    reads a folder with a cap on entries and on the whole listing's time."""

    def __init__(self, channel: paramiko.Channel, reply_timeout: float = SFTP_REPLY_TIMEOUT_S):
        self.reply_timeout = reply_timeout
        self._until = float("inf")  # when the packet being read must be in
        self._op_until = float("inf")  # when the whole operation must be done (list_folder)
        super().__init__(channel)

    def _read_packet(self):
        self._until = min(time.monotonic() + self.reply_timeout, self._op_until)
        head = self._read_all(4)
        size = struct.unpack(">I", head)[0]
        if size > SFTP_MAX_PACKET:
            raise SFTPError(f"the guest's SFTP server sent a packet of {size} bytes (at most "
                            f"{SFTP_MAX_PACKET} are read)")
        data = self._read_all(size)
        return (data[0], data[1:]) if size else (0, b"")

    def _read_all(self, n: int) -> bytes:
        out = bytearray()
        while n > 0:
            left = self._until - time.monotonic()
            if left <= 0:
                raise TimeoutError("the guest's SFTP reply did not come in time")
            self.sock.settimeout(left)
            x = self.sock.recv(n)
            if not x:
                raise EOFError()
            out += x
            n -= len(x)
        return bytes(out)

    def list_folder(self, path: str, max_entries: int | None = None, seconds: float | None = None) -> Folder:
        """The folder's entries but '.' and '..', in the guest's order, read one reply at a
        time: past `max_entries` or `seconds` it stops reading and closes the handle
        without waiting for the answer. Raises as paramiko does (FileNotFoundError, ...)."""
        folder = Folder()
        max_entries = LIST_MAX_ENTRIES if max_entries is None else max_entries
        self._op_until = time.monotonic() + (LIST_TIME_S if seconds is None else seconds)
        try:
            t, msg = self._request(CMD_OPENDIR, self._adjust_cwd(path))
            if t != CMD_HANDLE:
                raise SFTPError("Expected handle")
            handle = msg.get_binary()
            while True:
                try:
                    t, msg = self._request(CMD_READDIR, handle)
                except EOFError:  # the end of the folder
                    try:
                        self._request(CMD_CLOSE, handle)
                    except TimeoutError:  # what was listed stands; the client is out of step
                        folder.out_of_step = True
                    return folder
                except TimeoutError:
                    folder.timed_out = folder.out_of_step = True
                    return folder
                if t != CMD_NAME:
                    raise SFTPError("Expected name response")
                self._add_names(folder, _Reader(msg.get_remainder()), max_entries)
                if folder.more or time.monotonic() >= self._op_until:
                    folder.timed_out = not folder.more
                    self._async_request(type(None), CMD_CLOSE, handle)  # its answer is dropped when it comes
                    return folder
        finally:
            self._op_until = float("inf")

    @staticmethod
    def _add_names(folder: Folder, reply: _Reader, max_entries: int) -> None:
        try:
            for _ in range(reply.u32()):
                name = reply.string()
                reply.string()  # the long name: ls -l's line, not used
                mode, size = reply.attrs()
                if name in (b".", b".."):
                    continue
                if len(name) > NAME_MAX_BYTES:
                    folder.long_names += 1
                    continue
                if len(folder.entries) >= max_entries:
                    folder.more = True
                    return
                folder.entries.append(FolderEntry(name.decode("utf-8", "replace"), mode, size))
        except _Short:  # a count the reply does not hold: what it held is kept
            pass


class SshConnection:
    """One persistent paramiko transport per machine; a channel per command."""

    def __init__(self, host: str, port: int, user: str, key_path: str, connect_timeout: float = 10):
        self.host, self.port, self.user, self.key_path = host, port, user, key_path
        self.key = paramiko.Ed25519Key.from_private_key_file(key_path)
        self.connect_timeout = connect_timeout
        self._transport: paramiko.Transport | None = None
        self._sftp: BoundedSftp | None = None
        self._sftp_of: paramiko.Transport | None = None  # the transport the SFTP client runs on
        self.request_timeout = REQUEST_TIMEOUT_S
        self.sftp_reply_timeout = SFTP_REPLY_TIMEOUT_S
        self._lock = threading.Lock()  # held only for moments: close() must never wait on the guest

    def another(self) -> "SshConnection":
        """A second connection to the same guest as the same user (a Windows guest gives each
        SSH logon a logon session of its own)."""
        other = SshConnection(self.host, self.port, self.user, self.key_path, self.connect_timeout)
        other.request_timeout, other.sftp_reply_timeout = self.request_timeout, self.sftp_reply_timeout
        return other

    def transport(self) -> paramiko.Transport:
        with self._lock:
            if self._transport is None or not self._transport.is_active():
                self._sftp = None
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                transport = paramiko.Transport(sock)
                transport.banner_timeout = self.connect_timeout
                try:
                    transport.start_client(timeout=self.connect_timeout)
                    transport.auth_publickey(self.user, self.key)
                except Exception:
                    transport.close()
                    raise
                transport.set_keepalive(KEEPALIVE_S)
                self._transport = transport
            return self._transport

    def open_channel(self, command: str | None = None, subsystem: str | None = None,
                     timeout: float | None = None) -> paramiko.Channel:
        """A new channel running `command` (or `subsystem`), or GuestNotAnswering when the
        guest did not open it and start it within `timeout` s (request_timeout)."""
        timeout = self.request_timeout if timeout is None else timeout
        try:
            channel = self.transport().open_session(timeout=timeout)
        except paramiko.SSHException as exc:
            if "Timeout opening channel" in str(exc):
                raise GuestNotAnswering(f"the guest did not open an SSH channel within {timeout:g} s; "
                                        "it is paused, overloaded or gone") from None
            raise
        expired = threading.Event()

        def expire() -> None:  # closing the channel wakes paramiko's wait for the answer
            expired.set()
            try:
                channel.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection went meanwhile: the waiter wakes on its end all the same

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            if subsystem is not None:
                channel.invoke_subsystem(subsystem)
            else:
                channel.exec_command(command or "")
        except Exception as exc:
            channel.close()
            if expired.is_set():
                raise GuestNotAnswering(f"the guest did not start {subsystem or 'a command'} within "
                                        f"{timeout:g} s; it is paused, overloaded or gone") from None
            raise exc
        finally:
            timer.cancel()
        return channel

    def sftp(self) -> BoundedSftp:
        """The connection's SFTP client, made on first use. Each reply it waits for is
        bounded (SFTP_REPLY_TIMEOUT_S): a wait past it raises TimeoutError, and the caller
        drops the client (`drop_sftp`), whose requests are out of step from then on."""
        transport = self.transport()
        with self._lock:
            if self._sftp is not None and self._sftp_of is transport:
                return self._sftp
        # Made outside the lock: a guest that stopped answering must not keep close() waiting.
        channel = self.open_channel(subsystem="sftp")
        channel.settimeout(self.sftp_reply_timeout)
        try:
            sftp = BoundedSftp(channel, self.sftp_reply_timeout)
        except Exception:
            channel.close()
            raise
        with self._lock:
            if self._transport is transport and (self._sftp is None or self._sftp_of is not transport):
                self._sftp, self._sftp_of = sftp, transport
                return sftp
            current = self._sftp if self._transport is transport else None
        sftp.close()  # another thread made one meanwhile, or the connection was closed
        if current is None:
            raise paramiko.SSHException("the SSH connection to the guest was closed meanwhile")
        return current

    def drop_sftp(self) -> None:
        """Forgets the SFTP client after one of its replies timed out."""
        with self._lock:
            sftp, self._sftp, self._sftp_of = self._sftp, None, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:
                pass

    def keepalive(self, seconds: int = KEEPALIVE_S) -> None:
        """The open transport's keepalive interval (0: none), without connecting."""
        transport = self._transport
        if transport is not None and transport.is_active():
            transport.set_keepalive(seconds)

    def active(self) -> bool:
        """The transport is up (without connecting when it is not)."""
        transport = self._transport
        return transport is not None and transport.is_active()

    def close(self) -> None:
        with self._lock:
            sftp, transport = self._sftp, self._transport
            self._sftp = self._transport = self._sftp_of = None
        for part in (sftp, transport):  # closing the transport ends every channel on it
            if part is not None:
                try:
                    part.close()
                except Exception:
                    pass


def drain(channel: paramiko.Channel, sink, deadline: float) -> tuple[int, bool]:
    """(exit code, whether vmd gave up at `deadline`) of an exec channel, its output handed
    to `sink(stream, bytes)` as it comes; the channel is closed after. 124 when vmd gave up."""
    try:
        while True:
            # Checked on every turn: checked only when nothing came, a guest printing
            # without end kept run(timeout=1) going for 40 s and got exit 0.
            if time.monotonic() > deadline:
                return 124, True
            if channel.recv_ready():
                sink("stdout", channel.recv(65536))
                continue
            if channel.recv_stderr_ready():
                sink("stderr", channel.recv_stderr(65536))
                continue
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                return channel.recv_exit_status(), False
            select.select([channel], [], [], 0.2)
    finally:
        channel.close()
