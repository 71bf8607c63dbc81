"""The account of one session's SMB share (vmd/machines/smb_share.py): the user the guest logs
on to vmd's smbd as, with a random password, and the host uid that smbd runs as.

Why an account and not guest access: Windows 11 24H2 and Server 2025 refuse guest logons
(AllowInsecureGuestAuth off) and unsigned connections (RequireSecuritySignature on) by
default, and a guest logon cannot be signed, since it makes no session key. A logon with a
password does, so every connection is signed; vmd's smbd requires it (`server signing =
mandatory`), and the guest's image needs neither exception. The password is the guest's only
to map its own share (the run wrapper, vmd/guests/windows/scripts.py; the cifs mount of a Linux
guest), which it reaches anyway: it opens nothing else.

Why a uid per share: smbd parses what the guest sends, so a bug in it is the guest's way onto
the host. It runs as a uid no account of the host has, which owns that session's share and
smbd's own state and nothing else, inside a sandbox that shows it nothing else either
(vmd/machines/smbd_jail.py). The uids come from UID_MIN on, in a range systemd's UIDS-GIDS
document leaves unassigned (0x70000000-0x7FFDFFFF: above its container range, below the
signed-int edge), and each is claimed host-wide by a file under CLAIMS while the folder the
claim names holds the account (`new_account`, `release_account`).
"""

from __future__ import annotations

import os
import secrets
import string
import struct
import time
from pathlib import Path

from pydantic import BaseModel, Field

from vmd.private_fs import open_private, private_dir

SMB_USER = "vmd"
UID_MIN = 0x70010000
UID_COUNT = 0x10000
CLAIMS = Path("/run/vmd-smb/uids")
ACCOUNT_FILE = "account.json"
# Letters and digits only: the password passes through a Linux cifs mount's option string
# (a comma ends it) and Windows' net.exe command line unquoted by anything but vmd. 32 of
# them are 190 bits.
PASSWORD_CHARS = string.ascii_letters + string.digits
PASSWORD_LENGTH = 32


class SmbAccount(BaseModel):
    """Kept in the share's vmd folder (`account.json`, root's, 0600): a restarted vmd relays
    again with it (smb_share.relay_for), and the guest backend maps the share with it."""

    user: str = SMB_USER
    password: str = Field(repr=False)  # never in a log line, an error or a record
    uid: int
    share: str  # the host folder served, as smbd sees it at SHARE_IN_JAIL

    @property
    def gid(self) -> int:
        return self.uid  # a group of its own, of the same number, that no host group has


def new_account(folder: Path, share: Path) -> SmbAccount:
    """A new account for the share `share`, kept in `folder` (vmd's, private): a random
    password and a uid claimed for it. OSError when every uid of the range is claimed."""
    private_dir(folder)
    account = SmbAccount(password="".join(secrets.choice(PASSWORD_CHARS) for _ in range(PASSWORD_LENGTH)),
                         uid=_claim_uid(folder), share=str(share))
    fd = open_private(folder / ACCOUNT_FILE)
    with os.fdopen(fd, "w") as fh:
        fh.write(account.model_dump_json())
    return account


def load_account(folder: Path) -> SmbAccount | None:
    """The account kept in `folder`, or None where there is none (a guest on 9p; a folder
    made by a vmd before accounts, whose smbd served guests)."""
    try:
        return SmbAccount.model_validate_json((folder / ACCOUNT_FILE).read_text())
    except (OSError, ValueError):
        return None


def release_account(folder: Path) -> None:
    """The account's uid free for another share and its password gone: at the end of its
    machine. What the share's files are owned by stays (they are the project's)."""
    account = load_account(folder)
    if account is None:
        return
    claim = CLAIMS / str(account.uid)
    try:
        if claim.read_text() == str(folder):
            claim.unlink()
    except OSError:
        pass
    (folder / ACCOUNT_FILE).unlink(missing_ok=True)


def _claim_uid(folder: Path) -> int:
    """A uid of the range that no live share holds, claimed for `folder`: a claim is live
    while the folder it names holds an account of that uid (a folder gone, renamed or
    released leaves a claim that the next one takes over)."""
    CLAIMS.parent.mkdir(mode=0o711, exist_ok=True)
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    start = secrets.randbelow(UID_COUNT)
    for step in range(UID_COUNT):
        uid = UID_MIN + (start + step) % UID_COUNT
        claim = CLAIMS / str(uid)
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if _claim_live(claim, uid):
                continue
            claim.unlink(missing_ok=True)
            try:
                fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another vmd took it over first
        with os.fdopen(fd, "w") as fh:
            fh.write(str(folder))
        return uid
    raise OSError(f"every uid from {UID_MIN} to {UID_MIN + UID_COUNT - 1} holds a live SMB share")


def _claim_live(claim: Path, uid: int) -> bool:
    try:
        holder = Path(claim.read_text())
    except OSError:
        return True  # being written: another vmd's, a moment ago
    account = load_account(holder)
    return account is not None and account.uid == uid


# --- what smbd reads -------------------------------------------------------------------

def passwd_text(account: SmbAccount) -> str:
    """The /etc/passwd smbd sees (smbd_jail.py): Samba finds the Unix account of every SMB
    user by name (getpwnam), and the host has no account of this uid."""
    return (f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"{account.user}:x:{account.uid}:{account.gid}:vmd project share:/nonexistent:/usr/sbin/nologin\n")


def group_text(account: SmbAccount) -> str:
    return f"root:x:0:\n{account.user}:x:{account.gid}:\n"


def smbpasswd_text(account: SmbAccount, now: float | None = None) -> str:
    """Samba's smbpasswd file (smbpasswd(5)) with the account: no LanMan hash (32 X), the NT
    hash, flags `[U          ]` (a normal user), the last change time in hex."""
    changed = int(time.time() if now is None else now)
    return (f"{account.user}:{account.uid}:{'X' * 32}:{nt_hash(account.password).hex().upper()}:"
            f"[U          ]:LCT-{changed:08X}:\n")


def nt_hash(password: str) -> bytes:
    """MS-NLMP's NTOWFv1: MD4 of the password in UTF-16LE (what NTLMv2 is built on)."""
    return md4(password.encode("utf-16-le"))


def md4(data: bytes) -> bytes:
    """RFC 1320's MD4. Here because OpenSSL 3 (Debian 12's) serves MD4 only from its legacy
    provider, which Python's hashlib does not load: hashlib.new('md4') is refused."""
    def rotl(x: int, n: int) -> int:
        x &= 0xFFFFFFFF
        return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF

    message = data + b"\x80" + b"\0" * ((55 - len(data)) % 64) + struct.pack("<Q", len(data) * 8)
    a, b, c, d = 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476
    for offset in range(0, len(message), 64):
        x = struct.unpack("<16I", message[offset:offset + 64])
        aa, bb, cc, dd = a, b, c, d
        for i in range(16):  # round 1: F(x, y, z) = (x & y) | (~x & z)
            k, s = i, (3, 7, 11, 19)[i % 4]
            f = (b & c) | (~b & d)
            a, b, c, d = d, rotl(a + f + x[k], s), b, c
        for i in range(16):  # round 2: G = majority, + 0x5A827999
            k, s = (i % 4) * 4 + i // 4, (3, 5, 9, 13)[i % 4]
            g = (b & c) | (b & d) | (c & d)
            a, b, c, d = d, rotl(a + g + x[k] + 0x5A827999, s), b, c
        for i in range(16):  # round 3: H = x ^ y ^ z, + 0x6ED9EBA1
            k, s = (0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15)[i], (3, 9, 11, 15)[i % 4]
            a, b, c, d = d, rotl(a + (b ^ c ^ d) + x[k] + 0x6ED9EBA1, s), b, c
        a, b, c, d = (a + aa) & 0xFFFFFFFF, (b + bb) & 0xFFFFFFFF, (c + cc) & 0xFFFFFFFF, (d + dd) & 0xFFFFFFFF
    return struct.pack("<4I", a, b, c, d)
