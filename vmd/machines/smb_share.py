"""The project folder over SMB (domain_xml.SmbShare): vmd's smbd configuration and the
relay that hands each SMB connection of the guest to a fresh smbd.

Why not QEMU's `smb=` (net/slirp.c `slirp_smb`) or `guestfwd=...-cmd:smbd`: both make
QEMU start smbd itself, and libvirt starts QEMU with `-sandbox ...,spawn=deny` (here: a
guest's connection to a `cmd:` forward was refused, QEMU logged `slirp_socketpair():
Connection refused`); libslirp joins QEMU and the command through a TCP listener on the
host's 127.0.0.1, which every guest's approved egress reaches; and `smb=` writes its own
smb.conf (links followed, SMB1 unix extensions on, no create masks) in QEMU's /tmp.

So: QEMU forwards the guest's connections to 10.0.2.4:445 into a Unix socket it listens on
in the session's private workdir; vmd connects to it (no TCP listener anywhere), and runs
smbd in inetd mode (its stdin a connected socket, one SMB connection, no listener) as
QEMU's unprivileged user, with a configuration written here: the share is only this
session's folder, links are never followed or made, no unix extensions, no printers, and
files are made 0600, folders 0700 (no setuid, setgid or exec bits), whatever the guest asks.

A guest's SMB connections all arrive on QEMU's one character device, and QEMU does not
say when one ends; each begins with a NEGOTIATE (SMB2's, or SMB1's multi-protocol one that
Windows may send first), and SMB allows that nowhere else (a server drops a connection that
negotiates twice), so a NEGOTIATE after the first starts a fresh smbd for the new connection.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import libvirt

from vmd.host_env import clean_env
from vmd.machines.domain_xml import SmbShare, smb_socket_of
from vmd.machines.netns_pair import private_tcp_pair
from vmd.private_fs import open_private, private_dir

log = logging.getLogger("vmd.machines.smb_share")

SMBD = "/usr/sbin/smbd"
TESTPARM = "/usr/bin/testparm"
SHARE_NAME = "project"
# A Unix socket's path holds at most 107 bytes (sun_path is 108 with its NUL).
SOCKET_PATH_MAX = 107
# smbd's messaging sockets are `<lock directory>/msg.sock/<pid>`, the pid as long as Linux
# makes one (pid_max is at most 2^22). Under a deep state_dir that path passes a Unix
# socket's limit and smbd ends at start ("messaging_dgm_init failed: File name too long"),
# the guest's mount failing with no word why: the lock directory then moves to a short
# folder of its own under SHORT_SOCKET_ROOT, which exists while the session's relay runs.
MSG_SOCKET_TAIL = "/msg.sock/4194304"
SHORT_SOCKET_ROOT = Path("/run/vmd-smb")
# smbd's log per session: enough for a failed mount's reasons, bounded on disk (KiB).
LOG_MAX_KIB = 1024
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
# a relay restart, tests/test_smb_share_vm.py).
SESSION_REFUSED = bytes([0x83, 0, 0, 1, 0x8F])


def smb_dir(workdir: Path) -> Path:
    """The session's SMB folder: smbd's configuration, its state and QEMU's socket."""
    return workdir / "smb"


@functools.lru_cache(maxsize=None)
def samba_knows(parameter: str) -> bool:
    """Whether this host's Samba has `parameter` (`smb3 unix extensions` came after 4.17)."""
    try:
        done = subprocess.run([TESTPARM, "-s", f"--parameter-name={parameter}", "/dev/null"],
                              capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "Unknown parameter" not in done.stderr + done.stdout


def socket_dir(folder: Path) -> Path:
    """smbd's lock directory, where it makes its sockets, for the session SMB folder
    `folder`: its own `state/lock`, or a short folder named for it where that path would
    be too long for a socket (MSG_SOCKET_TAIL)."""
    lock = folder / "state" / "lock"
    if len(os.fsencode(str(lock) + MSG_SOCKET_TAIL)) <= SOCKET_PATH_MAX:
        return lock
    return SHORT_SOCKET_ROOT / hashlib.sha256(os.fsencode(str(folder))).hexdigest()[:16]


def smb_conf(project_dir: Path, state: Path, user: str, group: str, *, smb3_unix_extensions: bool,
             lock_dir: Path | None = None) -> str:
    """smbd's configuration for one session's share. `state`: smbd's own folders (QEMU's
    user's, private); `user`, `group`: QEMU's, whom every file belongs to and who the
    guest is (guest access only: no password exists or is needed). `lock_dir`: where smbd
    makes its sockets, if not under `state` (socket_dir)."""
    lines = [
        "[global]",
        "server role = standalone server",
        # Every client is the guest account, which is QEMU's user: no account of the host
        # can be logged into, and nothing is reached that QEMU's user could not.
        "security = user",
        "map to guest = Bad User",
        f"guest account = {user}",
        "restrict anonymous = 0",
        f"passdb backend = smbpasswd:{state}/smbpasswd",
        # SMB3 only (what Windows 8 and later and Linux cifs vers=3.0 speak): SMB1 brings unix
        # extensions (links, devices, modes), and nothing here needs SMB2.0 or 2.1.
        "server min protocol = SMB3_00",
        "smb1 unix extensions = no",
        *(["smb3 unix extensions = no"] if smb3_unix_extensions else []),
        # A link the guest made (in Samba's view, or one left by a 9p session) is never
        # followed out of the share, and none is made: SMB2 without unix extensions has no
        # way to make a symlink, a device or a FIFO.
        "follow symlinks = no",
        "wide links = no",
        "allow insecure wide links = no",
        # No printers, no RPC helpers, no NetBIOS, no home shares, no user shares.
        "load printers = no",
        "printing = bsd",
        "printcap name = /dev/null",
        "disable spoolss = yes",
        "disable netbios = yes",
        "rpc start on demand helpers = no",
        "usershare max shares = 0",
        "usershare path =",
        # Not root: no kernel oplocks or share modes, and DOS attributes not kept in xattrs
        # or mapped to mode bits (map archive would set the owner's exec bit).
        "kernel oplocks = no",
        "kernel share modes = no",
        "store dos attributes = no",
        "ea support = no",
        "map archive = no",
        "map hidden = no",
        "map system = no",
        "map readonly = no",
        f"private dir = {state}/private",
        f"lock directory = {lock_dir or state / 'lock'}",
        f"state directory = {state}/state",
        f"cache directory = {state}/cache",
        f"pid directory = {state}/pid",
        f"ncalrpc dir = {state}/ncalrpc",
        f"binddns dir = {state}/bind-dns",
        f"log file = {state}/log.smbd",
        f"max log size = {LOG_MAX_KIB}",
        "log level = 1",
        "",
        f"[{SHARE_NAME}]",
        f"path = {project_dir}",
        "read only = no",
        "guest ok = yes",
        "guest only = yes",
        "browseable = no",
        # Every client is the guest account (QEMU's user, above); `force user` as well would
        # fail every open here (smbd is not root: NT_STATUS_ACCESS_DENIED on each create).
        f"force group = {group}",
        # Modes: whatever the guest asks, a file is 0600 and a folder 0700 on the host, as
        # the project folders are (vmd/projects/tree.py): no setuid, setgid or exec bits.
        "create mask = 0600",
        "force create mode = 0600",
        "directory mask = 0700",
        "force directory mode = 0700",
        "inherit permissions = no",
        "inherit acls = no",
        "nt acl support = no",
        "acl allow execute always = no",
        "",
    ]
    return "\n".join(lines)


def prepare_smb_share(workdir: Path, project_dir: Path, owner: tuple[int, int] | None,
                      user: str, group: str) -> SmbShare:
    """Writes smbd's configuration and folders under the session's workdir and returns the
    share for the domain XML. `owner`: QEMU's user (uid, gid), who runs smbd and whose
    files these are; None where it does not exist here (tests without libvirt)."""
    folder = private_dir(smb_dir(workdir))
    state = folder / "state"
    lock = socket_dir(folder)
    for sub in ("", "private", "state", "cache", "pid", "ncalrpc", "bind-dns"):
        private_dir(state / sub if sub else state)
    if lock.parent != SHORT_SOCKET_ROOT:  # else the relay makes it (SmbRelay._make_short_lock_dir)
        private_dir(lock)
    conf = folder / "smb.conf"
    text = smb_conf(project_dir, state, user, group, smb3_unix_extensions=samba_knows("smb3 unix extensions"),
                    lock_dir=lock)
    fd = open_private(conf)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    if owner is not None:
        for path in (folder, conf, *[p for p in state.rglob("*")], state):
            os.chown(path, *owner)
    sock = folder / "q.sock"
    if len(os.fsencode(sock)) > SOCKET_PATH_MAX:
        raise ValueError(f"the SMB socket's path {sock} is longer than a Unix socket's {SOCKET_PATH_MAX} bytes; "
                         "give vmd a shorter state_dir.")
    return SmbShare(source=str(project_dir), socket=str(sock), name=SHARE_NAME)


def relay_for(domain: libvirt.virDomain, workdir: Path) -> "SmbRelay | None":
    """The relay to smbd of a domain whose XML has an SMB share (SmbShare), started; run as
    the user the session's SMB folder belongs to (QEMU's: prepare_smb_share), never root.
    None for a guest with 9p or no share."""
    try:
        sock = smb_socket_of(domain.XMLDesc(0))
    except libvirt.libvirtError:
        return None
    folder = smb_dir(workdir)
    if sock is None or not folder.is_dir() or folder.stat().st_uid == 0:
        return None
    st = folder.stat()
    return SmbRelay(Path(sock), folder / "smb.conf", (st.st_uid, st.st_gid)).start()


def is_negotiate(head: bytes) -> bool:
    """Whether a transport frame that begins with `head` (its 4-byte header first) is a
    NEGOTIATE: SMB2's (command 0) or SMB1's (0x72), which only a new connection sends."""
    body = head[4:]
    if body[:4] == b"\xfeSMB" and len(body) >= 14:
        return int.from_bytes(body[12:14], "little") == 0
    return body[:4] == b"\xffSMB" and len(body) >= 5 and body[4] == 0x72


class SmbRelay:
    """Joins QEMU's SMB character device (`socket`) to smbd: a fresh smbd, run as QEMU's
    user (`run_as`) with `conf`, for each SMB connection of the guest. A thread; `stop`
    ends it and its smbd."""

    def __init__(self, socket_path: Path, conf: Path, run_as: tuple[int, int] | None, smbd: str = SMBD):
        self.socket_path = Path(socket_path)
        self.conf = Path(conf)
        self.run_as = run_as
        self.smbd = smbd
        self.connections = 0  # smbd processes started (tests)
        self._stop = threading.Event()
        self._qemu: socket.socket | None = None
        self._server: subprocess.Popen | None = None
        self._server_end: socket.socket | None = None
        self._write_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"smb-relay {socket_path}", daemon=True)

    def start(self) -> "SmbRelay":
        self._make_short_lock_dir()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._end_server()
        if (lock := self._short_lock_dir()) is not None:
            shutil.rmtree(lock, ignore_errors=True)
        if self._qemu is not None:
            try:
                self._qemu.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)

    def _short_lock_dir(self) -> Path | None:
        """The short lock directory (socket_dir) of a session whose SMB folder is deep; it
        exists while the relay runs. None where smbd's sockets fit under the SMB folder."""
        lock = socket_dir(self.conf.parent)
        return lock if lock.parent == SHORT_SOCKET_ROOT else None

    def _make_short_lock_dir(self) -> None:
        lock = self._short_lock_dir()
        if lock is None:
            return
        try:
            SHORT_SOCKET_ROOT.mkdir(mode=0o711, exist_ok=True)
            lock.mkdir(mode=0o700, exist_ok=True)
            if self.run_as is not None:
                os.chown(lock, *self.run_as)
        except OSError as exc:
            log.warning("smb relay: no folder for smbd's sockets at %s (%s)", lock, exc)

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

    def _start_server(self) -> None:
        self._end_server()
        try:
            ours, theirs = private_tcp_pair()
        except OSError as exc:
            log.warning("smb relay: no connection for smbd (%s); vmd must run as root", exc)
            return
        kwargs = {}
        if self.run_as is not None:
            kwargs = dict(user=self.run_as[0], group=self.run_as[1], extra_groups=[])
        # inetd mode: stdin is the connection; no -D, -F or -i. Its logs go to the
        # configuration's log file, never to the socket.
        self._server = subprocess.Popen([self.smbd, f"--configfile={self.conf}"],
                                        stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL,
                                        env=clean_env(), close_fds=True, start_new_session=True,
                                        cwd="/", **kwargs)
        theirs.close()
        self._server_end = ours
        self.connections += 1
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
