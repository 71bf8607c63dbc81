"""vmd's smbd for the SMB project share, without a guest: the configuration as Samba reads it,
the share's account, the sandbox smbd runs in, and the relay from QEMU's character device to
a real smbd (Debian's samba), driven by a real SMB client (Debian's smbclient) through a
stand-in for QEMU's forward (a TCP listener on loopback whose connections are carried over the
one character-device stream, as QEMU's guestfwd carries a guest's). The guest's side is in
test_smb_share_vm.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from vmd.machines import smb_account
from vmd.machines.netns_pair import private_tcp_pair
from vmd.machines.smb_account import SMB_USER, UID_COUNT, UID_MIN, load_account, md4, new_account, nt_hash
from vmd.machines.smb_relay import SESSION_REFUSED, SmbRelay, is_negotiate
from vmd.machines.smb_share import (SOCKET_PATH_MAX, STARTS_FILE, TESTPARM,
                                    prepare_smb_share, release_share, share_account, smbd_dir)
from vmd.machines.smbd_jail import BWRAP, SMBD, jailed_smbd

SMBCLIENT = "/usr/bin/smbclient"


def _needs(reason_missing: str | None) -> None:
    if reason_missing:
        if os.environ.get("CI"):
            pytest.fail(f"must run in CI, but {reason_missing}", pytrace=False)
        pytest.skip(reason_missing)


def _missing() -> str | None:
    for tool, package in ((SMBD, "samba"), (TESTPARM, "samba"), (BWRAP, "bubblewrap"), (SMBCLIENT, "smbclient")):
        if not Path(tool).is_file():
            return f"{tool} is not installed (apt-get install {package})"
    if os.geteuid() != 0:
        return "vmd's smbd relay runs as root (it makes the sandbox and gives the share to its own uid)"
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


class Share:
    """A session's share as vmd prepares it (prepare_smb_share), its relay, and QEMU's end of
    the character device (`chardev`), which a test writes frames to or joins to smbclient."""

    def __init__(self, workdir: Path, max_starts: int = 256):
        _needs(_missing())
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.project = workdir / "project"
        self.project.mkdir(mode=0o700)
        (self.project / "README.md").write_text("the session's own\n")
        self.made = prepare_smb_share(workdir, self.project, None)
        self.account = share_account(workdir)
        self.qemu = socket.socket(socket.AF_UNIX)
        self.qemu.bind(self.made.socket)
        self.qemu.listen(1)
        folder = smbd_dir(workdir)
        self.relay = SmbRelay(Path(self.made.socket), jailed_smbd(folder, folder / "state", self.account),
                              max_starts, count_file=folder / STARTS_FILE).start()
        self.chardev, _ = self.qemu.accept()
        self.chardev.settimeout(60)
        self.port: int | None = None

    def forward(self) -> int:
        """QEMU's guestfwd as a test can drive it: each connection to the returned loopback
        port is carried over the one character-device stream, one after the other."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        current: list[socket.socket] = []  # the one client connection the stream carries now

        def down():  # smbd -> the current client: one reader of the stream, all along
            while True:
                try:
                    data = self.chardev.recv(1 << 16)
                except OSError:
                    return
                if not data:
                    return
                try:
                    current[0].sendall(data)
                except (OSError, IndexError):
                    pass  # that client left: what it was sent goes nowhere, as QEMU drops it

        def serve():
            while True:
                try:
                    client, _ = listener.accept()
                except OSError:
                    return
                current[:] = [client]
                while True:  # the client -> smbd, until the client's connection ends
                    try:
                        data = client.recv(1 << 16)
                    except OSError:
                        data = b""
                    if not data:
                        break
                    self.chardev.sendall(data)
                client.close()

        threading.Thread(target=down, daemon=True).start()
        threading.Thread(target=serve, daemon=True).start()
        self.port = listener.getsockname()[1]
        self.listener = listener
        return self.port

    def client(self, *args: str, command: str = "ls") -> subprocess.CompletedProcess:
        """smbclient on the forward, SMB3, with `args` (the login), running `command`."""
        port = self.port or self.forward()
        return subprocess.run([SMBCLIENT, "//127.0.0.1/project", "-p", str(port), "-m", "SMB3", "-c", command,
                               *args], capture_output=True, text=True, timeout=120)

    def login(self) -> list[str]:
        return ["-U", f"{self.account.user}%{self.account.password}"]

    def close(self) -> None:
        self.relay.stop()
        self.qemu.close()
        if self.port is not None:
            self.listener.close()
        release_share(self.workdir)


@pytest.fixture
def share(tmp_path):
    made = Share(tmp_path / "w")
    yield made
    made.close()


def test_samba_reads_vmds_configuration_as_meant(share):
    conf = smbd_dir(share.workdir) / "smb.conf"
    done = subprocess.run([TESTPARM, "-sv", str(conf)], capture_output=True, text=True, timeout=60)  # -v: defaults too
    assert "Unknown parameter" not in done.stderr, done.stderr
    seen = {line.strip() for line in done.stdout.splitlines()}
    for line in ("follow symlinks = No", "smb1 unix extensions = No", "load printers = No",
                 "create mask = 0600", "force create mode = 0600", "directory mask = 0700",
                 "server signing = required", "map to guest = Never", f"valid users = {SMB_USER}",
                 "path = /share", "server min protocol = SMB3_00", "server multi channel support = No",
                 "restrict anonymous = 2"):
        assert line in seen, (line, done.stdout)
    # Samba's defaults that matter stay: wide links off, no home shares.
    assert "wide links = No" in seen and "guest ok = No" in seen
    assert "[homes]" not in seen and "[printers]" not in seen


def test_the_shares_own_login_reads_and_writes_signed_and_no_guest_gets_in(share):
    # What Windows 11 24H2 asks of an SMB server: a logon with a password and every message
    # signed (smbclient's --client-protection=sign refuses a connection that is not). Before
    # vmd gave each share an account, its smbd let the guest in as a guest, which cannot sign.
    (share.workdir / "up.txt").write_text("from the client\n")
    done = share.client(*share.login(), "--client-protection=sign",
                        command=f"get README.md {share.workdir / 'down.md'}; put {share.workdir / 'up.txt'} up.txt; "
                                "mkdir src; ls")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (share.workdir / "down.md").read_text() == "the session's own\n"
    # On the host: what the client wrote, owned by the share's own uid, 0600/0700 whatever it asked.
    written = os.lstat(share.project / "up.txt")
    assert (share.project / "up.txt").read_text() == "from the client\n"
    assert (written.st_uid, written.st_gid) == (share.account.uid, share.account.gid)
    assert stat.S_IMODE(written.st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(share.project / "src").st_mode) == 0o700
    assert share.account.uid >= UID_MIN and share.account.uid < UID_MIN + UID_COUNT
    # A guest, an anonymous client or a wrong password gets no share.
    guest = share.client("-U", "guest%")
    anonymous = share.client("-N")
    wrong = share.client("-U", f"{SMB_USER}%{share.account.password}x")
    for refused in (guest, anonymous, wrong):
        assert refused.returncode != 0 and ("LOGON_FAILURE" in refused.stdout + refused.stderr
                                            or "ACCESS_DENIED" in refused.stdout + refused.stderr), refused
    # Windows sends its own machine as the user's domain: a standalone smbd takes any.
    assert share.client(*share.login(), "-W", "WIN-GUEST", "--client-protection=sign").returncode == 0
    assert share.relay.connections == 5  # one smbd for each of the five connections


def test_smbd_runs_as_the_shares_uid_in_namespaces_of_its_own(share):
    # A client connected: its smbd is the sandbox's (bwrap's child), as the share's uid, with
    # no capability and no_new_privs, in network, PID and mount namespaces not the host's.
    client = subprocess.Popen([SMBCLIENT, "//127.0.0.1/project", "-p", str(share.forward()), "-m", "SMB3",
                               *share.login()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        smbd = _smbd_of(share.relay)
        status = dict(line.split(":", 1) for line in Path(f"/proc/{smbd}/status").read_text().splitlines())
        assert set(status["Uid"].split()) == {str(share.account.uid)}
        assert set(status["Gid"].split()) == {str(share.account.gid)}
        assert status["Groups"].split() in ([], [str(share.account.gid)])
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"].strip() == "1"
        for ns in ("net", "pid", "mnt", "ipc"):
            assert os.readlink(f"/proc/{smbd}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        # Its root holds the sandbox's few folders, not the host's.
        assert sorted(os.listdir(f"/proc/{smbd}/root")) == sorted(
            ["bin", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "share", "smb", "tmp", "usr", "var"])
        assert sorted(os.listdir(f"/proc/{smbd}/root/etc")) == sorted(
            ["group", "hosts", "ld.so.cache", "nsswitch.conf", "passwd", "vmd-smb.conf"])
    finally:
        client.stdin.close()
        client.wait(timeout=60)


def _smbd_of(relay: SmbRelay, wait_s: float = 30) -> int:
    """The pid of the smbd the relay started (under bubblewrap's processes), once it runs."""
    until = time.monotonic() + wait_s
    while True:
        server = relay._server
        if server is not None:
            try:
                return _descendant_named(server.pid, "smbd")
            except (AssertionError, OSError):
                pass
        assert time.monotonic() < until, "no smbd was started for the client"
        time.sleep(0.1)


def _descendant_named(pid: int, name: str) -> int:
    """The first process under `pid` (itself included) whose name is `name`."""
    todo = [pid]
    while todo:
        current = todo.pop(0)
        if Path(f"/proc/{current}/comm").read_text().strip() == name:
            return current
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(child) for child in (task / "children").read_text().split()]
    raise AssertionError(f"no {name} under {pid}")


def test_what_runs_in_smbds_sandbox_can_write_the_share_and_nothing_else(share, tmp_path):
    # A bug in smbd is the guest's code running there: a shell in the same sandbox, as the
    # same uid, stands in for it. It writes the share and smbd's state; the host's files, the
    # host's /tmp, another session's project and every host process are out of its reach.
    other = tmp_path / "other-session-project"
    other.mkdir(mode=0o777)
    (other / "keep.txt").write_text("another session's work\n")
    os.chmod(other / "keep.txt", 0o666)  # writable by anyone who can reach it
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    script = f"""
    try() {{ label=$1; shift; if "$@" 2>/dev/null; then echo "$label=done"; else echo "$label=refused"; fi; }}
    try share sh -c 'echo x > /share/by-smbd.txt'
    try state sh -c 'echo x > /smb/by-smbd.txt'
    try usr sh -c 'echo x > /usr/by-smbd'
    try etc-passwd sh -c 'echo "evil:x:0:0::/:/bin/sh" >> /etc/passwd'
    try conf sh -c 'echo "path = /" >> /etc/vmd-smb.conf'
    try other-project sh -c 'echo x >> {other}/keep.txt'
    try see-other test -e {other}
    try host-tmp sh -c 'echo x > {tmp_path}/by-smbd'
    try signal-host-init kill -0 1
    try connect-host python3 -c 'import socket; socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), 3)'
    try setuid-root sh -c 'cp /usr/bin/id /share/rootid && chmod 4755 /share/rootid && test -u /share/rootid'
    id -u
    """
    argv = jailed_smbd(smbd_dir(share.workdir), smbd_dir(share.workdir) / "state", share.account)
    done = subprocess.run(argv[:argv.index(SMBD)] + ["/bin/sh", "-c", script], capture_output=True, text=True,
                          timeout=60)
    listener.close()
    said = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert said.pop("share") == "done" and said.pop("state") == "done", done.stdout + done.stderr
    setuid = said.pop("setuid-root")
    assert said == {name: "refused" for name in said} and len(said) == 8, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == str(share.account.uid)
    assert (other / "keep.txt").read_text() == "another session's work\n"
    assert not (tmp_path / "by-smbd").exists()
    # A mode bit the sandbox's uid may set on its own file is its own: never root's.
    if setuid == "done":
        st = os.lstat(share.project / "rootid")
        assert st.st_uid == share.account.uid != 0


def test_each_new_connection_gets_a_fresh_smbd_up_to_the_cap_then_is_refused_across_vmd_restarts(tmp_path):
    made = Share(tmp_path / "w", max_starts=2)
    try:
        for connection in (1, 2):
            made.chardev.sendall(negotiate_frame())
            reply = read_frame(made.chardev)
            assert reply[:4] == b"\xfeSMB" and int.from_bytes(reply[12:14], "little") == 0  # NEGOTIATE
            assert int.from_bytes(reply[8:12], "little") == 0  # STATUS_SUCCESS
            assert int.from_bytes(reply[64 + 4:64 + 6], "little") == 0x0300  # SMB 3.0
            assert made.relay.connections == connection
        # The third connection: no smbd is started; the guest hears so at once.
        made.chardev.sendall(negotiate_frame())
        answer = b""
        while len(answer) < len(SESSION_REFUSED):
            answer += made.chardev.recv(16)
        assert answer == SESSION_REFUSED
        assert made.relay.connections == 2 and made.relay.refused == 1 and made.relay.capped
        assert made.relay._server is None
        # A vmd restarted under the running guest relays again and goes on counting.
        made.relay.stop()
        made.chardev.close()
        folder = smbd_dir(made.workdir)
        made.relay = SmbRelay(Path(made.made.socket), made.relay.command, 2, count_file=folder / STARTS_FILE).start()
        made.chardev, _ = made.qemu.accept()
        made.chardev.settimeout(60)
        assert made.relay.connections == 2 and made.relay.capped
        made.chardev.sendall(negotiate_frame())
        answer = b""
        while len(answer) < len(SESSION_REFUSED):
            answer += made.chardev.recv(16)
        assert answer == SESSION_REFUSED and made.relay.connections == 2
    finally:
        made.close()


def test_a_guest_speaking_in_a_session_no_smbd_holds_is_told_at_once_and_its_reconnect_is_served(share):
    # A relay started after the guest's client negotiated (vmd restarted) first sees a frame
    # in the middle of a session: no smbd can take it up, and a guest left unanswered waits
    # out its echo timeout. It hears RFC 1002's negative session response at once instead,
    # the frame goes nowhere, and the NEGOTIATE of its reconnect gets a fresh smbd.
    mid_session = bytearray(negotiate_frame())
    mid_session[4 + 12] = 8  # SMB2 READ, as a client mid-session sends it
    share.chardev.sendall(bytes(mid_session))
    answer = b""
    while len(answer) < len(SESSION_REFUSED):
        answer += share.chardev.recv(16)
    assert answer == SESSION_REFUSED and share.relay.connections == 0
    share.chardev.sendall(negotiate_frame())
    reply = read_frame(share.chardev)
    assert reply[:4] == b"\xfeSMB" and int.from_bytes(reply[8:12], "little") == 0  # NEGOTIATE answered
    assert share.relay.connections == 1


def test_a_session_folder_too_deep_for_smbds_sockets_on_the_host_still_serves(tmp_path):
    # Seen under pytest-xdist's deeper temp folders before the sandbox: smbd ended at start
    # ("messaging_dgm_init failed: File name too long") and the guest's mount failed with no
    # word why. In the sandbox its sockets are under /smb, whatever the host path.
    workdir = tmp_path / ("d" * (85 - len(str(tmp_path)) - 1))  # QEMU's socket still fits
    assert len(os.fsencode(str(smbd_dir(workdir) / "state" / "lock" / "msg.sock" / "4194304"))) > SOCKET_PATH_MAX
    made = Share(workdir)
    try:
        assert made.client(*made.login(), "--client-protection=sign").returncode == 0
    finally:
        made.close()


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


# --- the account -------------------------------------------------------------------------

def test_md4_and_the_nt_hash_match_their_published_vectors():
    # RFC 1320 A.5, and MS-NLMP 4.2.2.1.2's NTOWFv1 of "Password".
    assert md4(b"").hex() == "31d6cfe0d16ae931b73c59d7e0c089c0"
    assert md4(b"abc").hex() == "a448017aaf21d8525fc10ae87aa6729d"
    assert md4(b"1234567890" * 8).hex() == "e33b4ddc9c38f2199c3e7b164fcc0536"
    assert nt_hash("Password").hex() == "a4f49c406510bdcab6824ee7c30fd852"


def test_each_share_gets_a_uid_of_its_own_and_a_released_or_abandoned_one_is_taken_again(tmp_path, monkeypatch):
    _needs(None if os.geteuid() == 0 else "uid claims live in a root-only folder")
    claims = tmp_path / "claims"
    monkeypatch.setattr(smb_account, "CLAIMS", claims)
    monkeypatch.setattr(smb_account, "UID_COUNT", 2)  # a range of two: every uid is met
    a = new_account(tmp_path / "a", tmp_path / "pa")
    b = new_account(tmp_path / "b", tmp_path / "pb")
    assert {a.uid, b.uid} == {UID_MIN, UID_MIN + 1}
    assert a.password != b.password and len(a.password) == 32 and a.password.isalnum()
    assert a.password not in repr(a) and a.password not in str(a)
    assert stat.S_IMODE((tmp_path / "a" / "account.json").stat().st_mode) == 0o600
    with pytest.raises(OSError, match="holds a live SMB share"):
        new_account(tmp_path / "c", tmp_path / "pc")
    smb_account.release_account(tmp_path / "a")
    assert load_account(tmp_path / "a") is None  # the password is gone with it
    assert new_account(tmp_path / "c", tmp_path / "pc").uid == a.uid
    shutil.rmtree(tmp_path / "b")  # a folder gone (a slot handed out, a crash) holds no uid
    assert new_account(tmp_path / "d", tmp_path / "pd").uid == b.uid


def test_a_host_without_smbds_sandbox_is_told_what_to_install(monkeypatch, tmp_path):
    from vmd.machines import smbd_jail
    from vmd.images.windows.readiness import windows_readiness
    monkeypatch.setattr(smbd_jail, "BWRAP", str(tmp_path / "no-bwrap"))
    status, text = windows_readiness(tmp_path, lambda: True)
    assert status == "warn" and f"{tmp_path / 'no-bwrap'} missing): install Debian's bubblewrap" in text
