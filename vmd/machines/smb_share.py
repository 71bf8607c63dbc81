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
smbd in inetd mode (its stdin a connected socket, one SMB connection, no listener) in a
sandbox of its own as the share's own uid (vmd/machines/smbd_jail.py), with a configuration
written here: the share is only this session's folder, the one user is the share's account
(vmd/machines/smb_account.py: a random password, so every connection is signed, and smbd
requires it), links are never followed or made, no unix extensions, no printers, and files
are made 0600, folders 0700 (no setuid, setgid or exec bits), whatever the guest asks.

The relay that joins QEMU's socket to a fresh smbd per SMB connection is smb_relay.py.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import libvirt

from vmd.host_env import clean_env
from vmd.machines.domain_xml import SmbShare, smb_socket_of
from vmd.machines.smb_account import (SmbAccount, group_text, load_account, new_account, passwd_text,
                                      release_account, smbpasswd_text)
from vmd.machines.smb_relay import SmbRelay
from vmd.machines.smbd_jail import HOSTS, NSSWITCH, SHARE_IN_JAIL, STATE_IN_JAIL, jailed_smbd
from vmd.private_fs import open_private, private_dir

TESTPARM = "/usr/bin/testparm"
SHARE_NAME = "project"
# A Unix socket's path holds at most 107 bytes (sun_path is 108 with its NUL).
SOCKET_PATH_MAX = 107
# smbd's log per session: enough for a failed mount's reasons, bounded on disk (KiB).
LOG_MAX_KIB = 1024
# How many smbd the share's relays started (smb_relay.SmbRelay.count_file), in vmd's folder.
STARTS_FILE = "starts"
# smbd's folders under its state (STATE_IN_JAIL in the sandbox).
STATE_DIRS = ("private", "lock", "state", "cache", "pid", "ncalrpc", "bind-dns")


def smb_dir(workdir: Path) -> Path:
    """QEMU's SMB folder in the session's workdir: its socket (QEMU's user's, 0700)."""
    return workdir / "smb"


def smbd_dir(workdir: Path) -> Path:
    """vmd's SMB folder in the session's workdir (root's, 0700): the share's account and
    password, smbd's configuration and /etc files, and smbd's own state folder (`state`,
    the share's uid's)."""
    return workdir / "smbd"


@functools.lru_cache(maxsize=None)
def samba_knows(parameter: str) -> bool:
    """Whether this host's Samba has `parameter` (`smb3 unix extensions` came after 4.17)."""
    try:
        done = subprocess.run([TESTPARM, "-s", f"--parameter-name={parameter}", "/dev/null"],
                              capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "Unknown parameter" not in done.stderr + done.stdout


def smb_conf(account: SmbAccount, *, smb3_unix_extensions: bool) -> str:
    """smbd's configuration for one session's share, with the paths smbd sees in its
    sandbox (smbd_jail.py): the share at SHARE_IN_JAIL, its own state at STATE_IN_JAIL. The
    one user is `account`'s; nobody logs on without its password."""
    state = STATE_IN_JAIL
    lines = [
        "[global]",
        "server role = standalone server",
        # Only the share's account logs on: no guest, no anonymous session (a guest logon
        # cannot be signed, and Windows 11 24H2 refuses both).
        "security = user",
        "map to guest = Never",
        "restrict anonymous = 2",
        # The guest account must name a user smbd can find; it is the share's own, never used.
        f"guest account = {account.user}",
        f"passdb backend = smbpasswd:{state}/smbpasswd",
        # Every connection signed (SMB3's AES-CMAC, keyed by the logon's session key): what
        # Windows 11 24H2 and Server 2025 require of a server by default.
        "server signing = mandatory",
        # SMB3 only (what Windows 8 and later and Linux cifs vers=3.0 speak): SMB1 brings unix
        # extensions (links, devices, modes), and nothing here needs SMB2.0 or 2.1.
        "server min protocol = SMB3_00",
        # One connection at a time: QEMU's character device carries one stream, and a second
        # channel of a multichannel client would be interleaved into it.
        "server multi channel support = no",
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
        f"lock directory = {state}/lock",
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
        f"path = {SHARE_IN_JAIL}",
        "read only = no",
        f"valid users = {account.user}",
        "guest ok = no",
        "browseable = no",
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


def prepare_smb_share(workdir: Path, project_dir: Path, qemu_owner: tuple[int, int] | None) -> SmbShare:
    """Makes the share's account (smb_account.py) and smbd's configuration under the
    session's workdir, gives the project folder to the account's uid, and returns the share
    for the domain XML. `qemu_owner`: QEMU's user (uid, gid), who makes the socket in
    smb_dir; None where it does not exist here (tests without libvirt)."""
    qemu_folder = private_dir(smb_dir(workdir))
    if qemu_owner is not None:
        os.chown(qemu_folder, *qemu_owner)
    sock = qemu_folder / "q.sock"
    if len(os.fsencode(sock)) > SOCKET_PATH_MAX:
        raise ValueError(f"the SMB socket's path {sock} is longer than a Unix socket's {SOCKET_PATH_MAX} bytes; "
                         "give vmd a shorter state_dir.")
    folder = smbd_dir(workdir)
    release_account(folder)  # a share made again (a warm slot handed out) gets a new account
    (folder / STARTS_FILE).unlink(missing_ok=True)  # and its own count of smbd starts
    account = new_account(folder, project_dir)
    owner = (account.uid, account.gid)
    state = private_dir(folder / "state")
    for sub in STATE_DIRS:
        private_dir(state / sub)
    texts = {"smb.conf": smb_conf(account, smb3_unix_extensions=samba_knows("smb3 unix extensions")),
             "passwd": passwd_text(account), "group": group_text(account), "nsswitch.conf": NSSWITCH,
             "hosts": HOSTS}
    for name, text in texts.items():
        _write(folder / name, text, 0o644)  # read-only in the sandbox; the folder is root's 0700
    _write(state / "smbpasswd", smbpasswd_text(account), 0o600)
    for path in (state, *state.rglob("*")):
        os.lchown(path, *owner)
    give_share(project_dir, owner)
    return SmbShare(source=str(project_dir), socket=str(sock), name=SHARE_NAME)


def _write(path: Path, text: str, mode: int) -> None:
    path.unlink(missing_ok=True)
    fd = open_private(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def give_share(project_dir: Path, owner: tuple[int, int]) -> None:
    """Every entry of the project folder to the share's uid and gid, links not followed: the
    guest's smbd writes there as that uid, and vmd reads it as root at the close."""
    for folder, dirs, files in os.walk(project_dir):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), *owner)
    os.lchown(project_dir, *owner)


def share_account(workdir: Path) -> SmbAccount | None:
    """The account of a session's SMB share (the guest maps the share with it), or None."""
    return load_account(smbd_dir(workdir))


def release_share(workdir: Path) -> None:
    """The share's uid claim and password gone (smb_account.release_account): at the end
    of its machine."""
    release_account(smbd_dir(workdir))


def relay_for(domain: libvirt.virDomain, workdir: Path, max_starts: int) -> SmbRelay | None:
    """The relay to smbd of a domain whose XML has an SMB share (SmbShare), started with
    the share's account (prepare_smb_share). None for a guest with 9p or no share."""
    try:
        sock = smb_socket_of(domain.XMLDesc(0))
    except libvirt.libvirtError:
        return None
    account = share_account(workdir)
    if sock is None or account is None:
        return None
    folder = smbd_dir(workdir)
    return SmbRelay(Path(sock), jailed_smbd(folder, folder / "state", account), max_starts,
                    count_file=folder / STARTS_FILE).start()
