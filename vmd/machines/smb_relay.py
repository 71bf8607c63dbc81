"""The relay between QEMU's SMB character device and vmd's smbd (vmd/machines/smb_share.py).

A guest's SMB connections all arrive on QEMU's one character device, and QEMU does not
say when one ends; each begins with a NEGOTIATE (SMB2's, or SMB1's multi-protocol one that
Windows may send first), and SMB allows that nowhere else (a server drops a connection that
negotiates twice), so a NEGOTIATE after the first starts a fresh smbd for the new connection,
at most `max_starts` times per relay (VmdConfig.smb_max_starts): a guest that negotiates in
a loop costs the host that many smbd starts, then its NEGOTIATEs are refused. Each smbd's end
of its connection is a TCP socket in a network namespace of its own (netns_pair.py): smbd
serves only an IP connection, and nothing on the host can reach that one.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import threading
import time
from pathlib import Path

from vmd.host_env import clean_env
from vmd.machines.netns_pair import private_tcp_pair
from vmd.machines.smbd_jail import missing_tools

log = logging.getLogger("vmd.machines.smb_relay")

# How long the relay waits for QEMU's socket after the domain's start (QEMU makes it
# before the guest runs; TCG on a loaded host took a few seconds to start QEMU at all).
CONNECT_WAIT_S = 60.0
# Enough of a frame to tell a NEGOTIATE: the 4-byte transport header, then SMB2's header
# (protocol id at 0, command at 12) or SMB1's (command at 4).
_PEEK = 4 + 16
# RFC 1002's NEGATIVE SESSION RESPONSE, "unspecified error" (type 0x83, length 1, 0x8F): the
# answer to a guest that speaks in a connection no smbd holds. Linux's cifs reconnects a
# second later (is_smb_response in fs/smb/client/connect.c) and negotiates with a fresh
# smbd; without it the guest waited for its echo timeout (~160 s on the Debian guest after
# a relay restart, tests/vmd/machines/test_smb_share_vm.py).
SESSION_REFUSED = bytes([0x83, 0, 0, 1, 0x8F])


def is_negotiate(head: bytes) -> bool:
    """Whether a transport frame that begins with `head` (its 4-byte header first) is a
    NEGOTIATE: SMB2's (command 0) or SMB1's (0x72), which only a new connection sends."""
    body = head[4:]
    if body[:4] == b"\xfeSMB" and len(body) >= 14:
        return int.from_bytes(body[12:14], "little") == 0
    return body[:4] == b"\xffSMB" and len(body) >= 5 and body[4] == 0x72


class SmbRelay:
    """Joins QEMU's SMB character device (`socket`) to smbd: a fresh smbd, started by
    `command` (smbd_jail.jailed_smbd: sandboxed, as the share's uid), for each SMB
    connection of the guest, at most `max_starts` of them. A thread; `stop` ends it and its
    smbd."""

    def __init__(self, socket_path: Path, command: list[str], max_starts: int, count_file: Path | None = None):
        self.socket_path = Path(socket_path)
        self.command = list(command)
        self.max_starts = max_starts
        # The starts so far, kept in `count_file` (vmd's folder of the share), so that a vmd
        # restarted under a running guest goes on counting where the last one stopped.
        self.count_file = count_file
        self.connections = _read_count(count_file)  # smbd processes started
        self.refused = 0  # NEGOTIATEs refused past max_starts
        self._stop = threading.Event()
        self._qemu: socket.socket | None = None
        self._server: subprocess.Popen | None = None
        self._server_end: socket.socket | None = None
        self._write_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"smb-relay {socket_path}", daemon=True)

    @property
    def capped(self) -> bool:
        """Whether the guest used up its smbd starts: its share is gone until its machine is."""
        return self.connections >= self.max_starts

    def start(self) -> "SmbRelay":
        if missing := missing_tools():
            log.warning("smb relay: %s missing; the guest's project share cannot be served "
                        "(apt-get install bubblewrap samba)", ", ".join(missing))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._end_server()
        if self._qemu is not None:
            try:
                self._qemu.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)

    # --- the guest's side ----------------------------------------------------------------

    def _connect(self) -> socket.socket | None:
        deadline = time.monotonic() + CONNECT_WAIT_S
        while not self._stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.socket_path))
                return sock
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    log.warning("smb relay: QEMU's socket %s did not come up", self.socket_path)
                    return None
                time.sleep(0.2)
        return None

    def _run(self) -> None:
        # QEMU's chardev takes one client at a time; when it drops us (the domain ended, or
        # vmd's side failed), a new connection is tried while QEMU still listens.
        while not self._stop.is_set():
            self._qemu = self._connect()
            if self._qemu is None:
                return
            try:
                self._pump_from_guest(self._qemu)
            except OSError as exc:
                log.info("smb relay: %s", exc)
            finally:
                self._end_server()
                self._qemu.close()
            if not self.socket_path.exists():
                return  # QEMU is gone

    def _pump_from_guest(self, qemu: socket.socket) -> None:
        negotiated = False
        while not self._stop.is_set():
            head = _read_exact(qemu, 4)
            if head is None:
                return
            length = int.from_bytes(head[1:4], "big")
            peek = _read_exact(qemu, min(length, _PEEK - 4)) if length else b""
            if peek is None:
                return
            frame_start = head + peek
            if is_negotiate(frame_start):
                if negotiated or self._server is None or self._server.poll() is not None:
                    if self.capped:
                        self._refuse_start()
                        if not _skip(qemu, length - len(peek)):
                            return
                        continue
                    self._start_server()
                negotiated = True
            elif self._server is None or self._server.poll() is not None:
                # A frame of a connection no smbd holds any more (vmd restarted, or its smbd
                # ended): no smbd could take it up mid-session. Said so at once, the guest's
                # client connects afresh instead of waiting out its echo timeout.
                if frame_start[0] == 0:
                    self._to_guest(SESSION_REFUSED)
                if not _skip(qemu, length - len(peek)):
                    return
                continue
            self._to_server(frame_start)
            left = length - len(peek)
            while left > 0:
                chunk = qemu.recv(min(left, 1 << 16))
                if not chunk:
                    return
                self._to_server(chunk)
                left -= len(chunk)

    def _to_guest(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self._qemu.sendall(data)
            except (OSError, AttributeError):
                pass

    def _to_server(self, data: bytes) -> None:
        try:
            self._server_end.sendall(data)
        except (OSError, AttributeError):  # AttributeError: no smbd could be started
            pass  # smbd ended; what the guest sent is dropped and its client reconnects

    # --- smbd's side -----------------------------------------------------------------------

    def _refuse_start(self) -> None:
        """A new connection past max_starts: no smbd for it, and the guest is told at once."""
        self._end_server()
        self.refused += 1
        if self.refused == 1:
            log.warning("smb relay %s: the guest opened %d SMB connections, the most one machine gets "
                        "(smb_max_starts); its project share is refused from now on", self.socket_path,
                        self.connections)
        self._to_guest(SESSION_REFUSED)

    def _start_server(self) -> None:
        self._end_server()
        try:
            ours, theirs = private_tcp_pair()
        except OSError as exc:
            log.warning("smb relay: no connection for smbd (%s); vmd must run as root", exc)
            return
        # inetd mode: stdin is the connection; no -D, -F or -i. Its logs go to the
        # configuration's log file, never to the socket. bubblewrap needs vmd's root to make
        # the sandbox; smbd itself runs as the share's uid (smbd_jail.py).
        try:
            self._server = subprocess.Popen(self.command, stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL,
                                            env=clean_env(), close_fds=True, start_new_session=True, cwd="/")
        except OSError as exc:
            log.warning("smb relay: smbd could not be started (%s)", exc)
            ours.close()
            return
        finally:
            theirs.close()
        self._server_end = ours
        self.connections += 1
        if self.count_file is not None:
            try:
                self.count_file.write_text(str(self.connections))
            except OSError as exc:
                log.warning("smb relay: the count of smbd starts could not be kept (%s)", exc)
        threading.Thread(target=self._pump_from_server, args=(ours,), daemon=True,
                         name=f"smb-relay-out {self.socket_path}").start()

    def _pump_from_server(self, server_end: socket.socket) -> None:
        while True:
            try:
                data = server_end.recv(1 << 16)
            except OSError:
                return
            if not data or server_end is not self._server_end:
                return
            with self._write_lock:
                try:
                    self._qemu.sendall(data)
                except (OSError, AttributeError):
                    return

    def _end_server(self) -> None:
        server, end = self._server, self._server_end
        self._server, self._server_end = None, None
        if end is not None:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _read_count(count_file: Path | None) -> int:
    try:
        return int(count_file.read_text()) if count_file is not None else 0
    except (OSError, ValueError):
        return 0


def _skip(sock: socket.socket, n: int) -> bool:
    """Reads and drops `n` bytes; False when the connection ended first."""
    while n > 0:
        chunk = sock.recv(min(n, 1 << 16))
        if not chunk:
            return False
        n -= len(chunk)
    return True


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
