"""vmd's smbd for the SMB project share, without a guest: the configuration as Samba reads
it, and the relay from QEMU's character device to a real smbd (Debian's samba), which
answers an SMB2 NEGOTIATE as a guest's client sends it (MS-SMB2 2.2.3) and gets a fresh
smbd for each new connection of the guest. The guest's side is in test_smb_share_vm.py.
"""

from __future__ import annotations

import grp
import os
import socket
import stat
import struct
import subprocess
import uuid
from pathlib import Path

import pytest

from vmd.machines.netns_pair import private_tcp_pair
from vmd.machines.smb_share import (MSG_SOCKET_TAIL, SESSION_REFUSED, SHORT_SOCKET_ROOT, SMBD, SOCKET_PATH_MAX,
                                    TESTPARM, SmbRelay,
                                    is_negotiate, prepare_smb_share, smb_dir, socket_dir)
from vmd.projects.tree import share_owner


def _needs(reason_missing: str | None) -> None:
    if reason_missing:
        if os.environ.get("CI"):
            pytest.fail(f"must run in CI, but {reason_missing}", pytrace=False)
        pytest.skip(reason_missing)


def _missing() -> str | None:
    if not Path(SMBD).is_file() or not Path(TESTPARM).is_file():
        return "Samba is not installed (apt-get install samba)"
    if os.geteuid() != 0:
        return "vmd's smbd relay runs as root (it makes a network namespace and runs smbd as QEMU's user)"
    if share_owner("libvirt-qemu") is None:
        return "libvirt's QEMU user (libvirt-qemu) does not exist here"
    return None


def negotiate_frame() -> bytes:
    """An SMB2 NEGOTIATE request for dialects 2.0.2 and 3.0, in its direct-TCP frame."""
    header = b"\xfeSMB" + struct.pack("<HHIHHIIQIIQ16s", 64, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, b"")
    body = struct.pack("<HHHHI16sQ", 36, 2, 1, 0, 0, uuid.uuid4().bytes, 0) + struct.pack("<HH", 0x0202, 0x0300)
    message = header + body
    return b"\0" + len(message).to_bytes(3, "big") + message


def read_frame(sock: socket.socket) -> bytes:
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    length = int.from_bytes(head[1:], "big")
    data = b""
    while len(data) < length:
        data += sock.recv(length - len(data))
    return data


def make_share(workdir: Path):
    _needs(_missing())
    owner = share_owner("libvirt-qemu")
    workdir.mkdir(parents=True, exist_ok=True)
    for folder in [workdir, *workdir.parents]:  # smbd runs as QEMU's user: it must pass through
        os.chmod(folder, os.stat(folder).st_mode | 0o001)
    project = workdir / "project"
    project.mkdir(mode=0o700)
    os.chown(project, *owner)
    made = prepare_smb_share(workdir, project, owner, "libvirt-qemu", grp.getgrgid(owner[1]).gr_name)
    return made, owner


@pytest.fixture
def share(tmp_path):
    return make_share(tmp_path)


def negotiates(made, conf: Path, owner, times: int = 1) -> SmbRelay:
    """A relay started on `made`'s socket, through which `times` connections negotiate SMB 3.0
    with a fresh smbd each; returns the relay, stopped."""
    qemu = socket.socket(socket.AF_UNIX)  # QEMU's end of the character device
    qemu.bind(made.socket)
    qemu.listen(1)
    relay = SmbRelay(Path(made.socket), conf, owner).start()
    try:
        chardev, _ = qemu.accept()
        chardev.settimeout(30)
        for connection in range(1, times + 1):
            chardev.sendall(negotiate_frame())
            reply = read_frame(chardev)
            assert reply[:4] == b"\xfeSMB" and int.from_bytes(reply[12:14], "little") == 0  # NEGOTIATE
            assert int.from_bytes(reply[8:12], "little") == 0  # STATUS_SUCCESS
            assert int.from_bytes(reply[64 + 4:64 + 6], "little") == 0x0300  # SMB 3.0
            assert relay.connections == connection
            status = Path(f"/proc/{relay._server.pid}/status").read_text()
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            assert set(uid_line.split()[1:]) == {str(owner[0])}  # never root
    finally:
        relay.stop()
        qemu.close()
    return relay


def test_samba_reads_vmds_configuration_as_meant(share, tmp_path):
    made, owner = share
    conf = smb_dir(tmp_path) / "smb.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600 and conf.stat().st_uid == owner[0]
    done = subprocess.run([TESTPARM, "-s", str(conf)], capture_output=True, text=True, timeout=60)
    assert "Unknown parameter" not in done.stderr, done.stderr
    seen = {line.strip() for line in done.stdout.splitlines()}
    for line in ("follow symlinks = No", "smb1 unix extensions = No", "load printers = No",
                 "create mask = 0600", "force create mode = 0600", "directory mask = 0700", "guest only = Yes",
                 "guest account = libvirt-qemu", f"path = {tmp_path / 'project'}", "server min protocol = SMB3_00"):
        assert line in seen, (line, done.stdout)
    # Samba's defaults that matter stay: wide links off (so not listed by -s), no home shares.
    assert "wide links = Yes" not in seen and "[homes]" not in seen and "[printers]" not in seen


def test_each_new_connection_of_the_guest_gets_a_fresh_smbd_as_qemus_user(share, tmp_path):
    made, owner = share
    relay = negotiates(made, smb_dir(tmp_path) / "smb.conf", owner, times=2)
    assert relay._server is None
    assert socket_dir(smb_dir(tmp_path)).parent != SHORT_SOCKET_ROOT  # a short path keeps its own


def test_a_guest_speaking_in_a_session_no_smbd_holds_is_told_at_once_and_its_reconnect_is_served(share, tmp_path):
    # A relay started after the guest's client negotiated (vmd restarted) first sees a frame
    # in the middle of a session: no smbd can take it up, and a guest left unanswered waits
    # out its echo timeout. It hears RFC 1002's negative session response at once instead,
    # the frame goes nowhere, and the NEGOTIATE of its reconnect gets a fresh smbd.
    made, owner = share
    qemu = socket.socket(socket.AF_UNIX)
    qemu.bind(made.socket)
    qemu.listen(1)
    relay = SmbRelay(Path(made.socket), smb_dir(tmp_path) / "smb.conf", owner).start()
    try:
        chardev, _ = qemu.accept()
        chardev.settimeout(30)
        mid_session = bytearray(negotiate_frame())
        mid_session[4 + 12] = 8  # SMB2 READ, as a client mid-session sends it
        chardev.sendall(bytes(mid_session))
        answer = b""
        while len(answer) < len(SESSION_REFUSED):
            answer += chardev.recv(16)
        assert answer == SESSION_REFUSED and relay.connections == 0
        chardev.sendall(negotiate_frame())
        reply = read_frame(chardev)
        assert reply[:4] == b"\xfeSMB" and int.from_bytes(reply[8:12], "little") == 0  # NEGOTIATE answered
        assert relay.connections == 1
    finally:
        relay.stop()
        qemu.close()


def test_a_session_folder_too_deep_for_smbds_sockets_still_serves_and_leaves_nothing(tmp_path):
    # Seen under pytest-xdist's deeper temp folders: smbd ended at start ("messaging_dgm_init
    # failed: File name too long") and the guest's mount failed with no word why.
    # 85 bytes: QEMU's socket (`<workdir>/smb/q.sock`) fits, smbd's would not.
    workdir = tmp_path / ("d" * (85 - len(str(tmp_path)) - 1))
    assert len(os.fsencode(str(smb_dir(workdir) / "state" / "lock") + MSG_SOCKET_TAIL)) > SOCKET_PATH_MAX
    made, owner = make_share(workdir)
    conf = smb_dir(workdir) / "smb.conf"
    lock = socket_dir(smb_dir(workdir))
    assert lock.parent == SHORT_SOCKET_ROOT and f"lock directory = {lock}" in conf.read_text()
    negotiates(made, conf, owner)
    assert not lock.exists(), "the short socket folder outlived its relay"


def test_the_pair_smbd_gets_is_on_no_host_address():
    _needs(None if os.geteuid() == 0 else "making a network namespace needs root")
    ours, theirs = private_tcp_pair()
    with ours, theirs:
        ours.sendall(b"ping")
        assert theirs.recv(4) == b"ping"
        port = ours.getsockname()[1]
        # The host's own TCP table (this process's namespace) has neither end nor a listener.
        table = Path("/proc/self/net/tcp").read_text() + Path("/proc/self/net/tcp6").read_text()
        assert f":{port:04X} " not in table and f":{theirs.getsockname()[1]:04X} " not in table


def test_a_negotiate_is_told_from_other_frames():
    assert is_negotiate(negotiate_frame()[:20])
    smb1 = b"\0\0\0\x20" + b"\xffSMB" + b"\x72" + b"\0" * 27  # SMB1 multi-protocol NEGOTIATE (Windows)
    assert is_negotiate(smb1)
    session_setup = bytearray(negotiate_frame()[:20])
    session_setup[4 + 12] = 1  # SMB2 SESSION_SETUP
    assert not is_negotiate(bytes(session_setup))
    assert not is_negotiate(b"\x85\0\0\0")  # a NetBIOS keep-alive
