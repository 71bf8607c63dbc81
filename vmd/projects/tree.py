"""The project folder as vmd sees it: a tree of bytes written by a hostile guest.

The guest writes the folder over virtio 9p with QEMU's `mapped-xattr` security model:
on the host every file belongs to QEMU's unprivileged user, and what the guest believes
(its owners, modes, symbolic links, device nodes) is metadata in `user.virtfs.*`
extended attributes. A guest symlink is a host *regular file* holding the target, with
`S_IFLNK` in `user.virtfs.mode`; a guest device node or FIFO is a regular file too. So
nothing the guest makes is a real link, device or setuid file on the host.

`walk()` reads that folder without following anything and without interpreting any of
it as configuration: it yields what a commit should hold (files and links as bytes) and
notes on what it left out (`.git` entries, sockets and devices, files over the size
limits). `present_to_guest()` is the other direction: after vmd writes files into the
folder itself (a restored history), it gives them the metadata the guest should see.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

# QEMU's names (hw/9pfs/9p-local.c); the values are 32-bit little-endian.
XATTR_UID = "user.virtfs.uid"
XATTR_GID = "user.virtfs.gid"
XATTR_MODE = "user.virtfs.mode"

GUEST_UID = GUEST_GID = 1000  # the guest's `agent` user owns the project folder

# Host permissions QEMU itself gives files and folders it creates in mapped mode
# (SM_LOCAL_MODE_BITS, SM_LOCAL_DIR_MODE_BITS): only QEMU's user reads them.
HOST_FILE_MODE = 0o600
HOST_DIR_MODE = 0o700


@dataclass
class Limits:
    """What one commit may take from the folder; past these a file is left out with a
    note instead of failing the close."""
    max_file_bytes: int = 100 * 1024 * 1024
    max_total_bytes: int = 1024 * 1024 * 1024
    max_entries: int = 200_000
    max_depth: int = 200


@dataclass
class Entry:
    path: bytes  # relative, '/'-separated, as the guest named it
    kind: str  # "file" | "link"
    executable: bool = False
    size: int = 0
    host_path: str = ""  # where to read a file's bytes
    target: bytes = b""  # a link's target


@dataclass
class Walk:
    entries: list[Entry] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # sentences, one per thing left out
    total_bytes: int = 0


def _le32(value: bytes) -> int | None:
    return struct.unpack("<I", value[:4])[0] if len(value) >= 4 else None


def guest_mode(path: str, st: os.stat_result) -> int:
    """The mode the guest sees: `user.virtfs.mode` when QEMU stored one, else the host's."""
    if stat.S_ISLNK(st.st_mode):
        return st.st_mode  # a real host link has no user xattrs; only vmd or tests make those
    try:
        mapped = _le32(os.getxattr(path, XATTR_MODE, follow_symlinks=False))
    except OSError:
        mapped = None
    if mapped is None or stat.S_IFMT(mapped) == 0:
        return st.st_mode
    return mapped


def _is_git_name(name: bytes) -> bool:
    # Git refuses `.git` in any case, and (core.protectNTFS, on by default) with trailing
    # dots or spaces, before a `\` or `:`, and as the 8.3 name `git~1`: a tree holding one
    # would be rejected by a receiving Gitea or by the next checkout, or planted as a
    # repository in someone's checkout.
    folded = name.replace(b"\\", b":").split(b":", 1)[0].rstrip(b". ").lower()
    return folded in (b".git", b"git~1")


def _is_git_control_name(name: bytes) -> bool:
    # Git's checkout refuses these as links (verify_path, and fsck on a receiving Gitea):
    # one committed would make every later restore of the project fail.
    folded = name.rstrip(b". ").lower()
    return folded in (b".gitmodules", b".gitattributes", b".gitignore", b".mailmap") or \
        folded.startswith((b"gitmod~", b"gitatt~", b"gitign~", b"mailma~"))


def walk(root: Path, limits: Limits | None = None) -> Walk:
    """What a commit of `root` holds, in git's order, and what it leaves out."""
    limits = limits or Limits()
    result = Walk()
    _walk_dir(os.fsencode(root), b"", 0, limits, result)
    result.entries.sort(key=lambda e: e.path)
    return result


def _walk_dir(host_dir: bytes, rel: bytes, depth: int, limits: Limits, out: Walk) -> None:
    if depth > limits.max_depth:
        out.left_out.append(f"{_show(rel)}/: nested deeper than {limits.max_depth} folders; left out.")
        return
    try:
        with os.scandir(host_dir) as it:
            names = sorted(e.name for e in it)
    except OSError as exc:
        out.left_out.append(f"{_show(rel) or '.'}/: could not be read ({exc.strerror}); left out.")
        return
    for name in names:
        path = rel + b"/" + name if rel else name
        host = host_dir + b"/" + name
        if len(out.entries) >= limits.max_entries:
            out.left_out.append(f"everything after {_show(path)}: the folder holds more than "
                                f"{limits.max_entries} entries; left out.")
            return
        if _is_git_name(name):
            if rel:  # the top-level .git is the guest's copy of the history: expected, unread
                out.left_out.append(f"{_show(path)}: a nested repository's .git is never committed "
                                    "(its files are); vmd keeps the history itself.")
            continue
        try:
            st = os.lstat(host)
        except OSError:
            continue  # gone since the listing
        mode = guest_mode(os.fsdecode(host), st)
        if stat.S_ISDIR(mode) and stat.S_ISDIR(st.st_mode):
            _walk_dir(host, path, depth + 1, limits, out)
        elif stat.S_ISLNK(mode):
            target = _link_target(host, st)
            if _is_git_control_name(name):
                out.left_out.append(f"{_show(path)}: git refuses to check out a link with this name; "
                                    "left out (make it a regular file).")
            elif target is None:
                out.left_out.append(f"{_show(path)}: a link whose target could not be read; left out.")
            else:
                out.entries.append(Entry(path=path, kind="link", target=target))
        elif stat.S_ISREG(mode) and stat.S_ISREG(st.st_mode):
            size = st.st_size
            if size > limits.max_file_bytes:
                out.left_out.append(f"{_show(path)}: {_mib(size)} is over the {_mib(limits.max_file_bytes)} "
                                    "limit for one file; left out of the commit (it stays in the folder).")
                continue
            if out.total_bytes + size > limits.max_total_bytes:
                out.left_out.append(f"{_show(path)}: {_mib(size)} would take the commit past its "
                                    f"{_mib(limits.max_total_bytes)} total; left out.")
                continue
            out.total_bytes += size
            out.entries.append(Entry(path=path, kind="file", executable=bool(mode & 0o100),
                                     size=size, host_path=os.fsdecode(host)))
        else:
            out.left_out.append(f"{_show(path)}: a {_kind_name(mode)}, which git cannot hold; left out.")


def _link_target(host: bytes, st: os.stat_result) -> bytes | None:
    if stat.S_ISLNK(st.st_mode):
        try:
            return os.readlink(host)
        except OSError:
            return None
    # A mapped guest link: a small regular file whose bytes are the target.
    if st.st_size > 4096 or not stat.S_ISREG(st.st_mode):  # a folder marked as a link
        return None
    try:
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 4097)[:4096] or None
    finally:
        os.close(fd)


def read_file(entry: Entry, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of a walked file, exactly `entry.size` of them: cut if it grew since
    the walk, padded with nothing if it shrank (the caller announced the size)."""
    try:
        fd = os.open(entry.host_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        # Swapped for a link, a socket or nothing since the walk (the guest is paused, so
        # only a host process could): the size was announced, so zeros stand in.
        yield b"\0" * entry.size
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield b"\0" * entry.size
            return
        left = entry.size
        while left > 0:
            data = os.read(fd, min(chunk, left))
            if not data:
                yield b"\0" * left
                return
            left -= len(data)
            yield data
    finally:
        os.close(fd)


def _kind_name(mode: int) -> str:
    for test, name in ((stat.S_ISSOCK, "socket"), (stat.S_ISFIFO, "named pipe (FIFO)"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def _show(path: bytes) -> str:
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")[:300]


# --- the other direction: files vmd writes, as the guest should see them ----------------

def share_owner(user: str) -> tuple[int, int] | None:
    """uid and gid of QEMU's user, or None where it does not exist (tests without
    libvirt, a host where QEMU runs as another user)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def present_to_guest(root: Path, owner: tuple[int, int] | None) -> None:
    """Make vmd-written files under `root` look to the guest as if its user made them:
    real links become mapped links (9p in mapped mode cannot serve a host link), every
    entry gets the guest's owner and mode as metadata, and on the host everything belongs
    to QEMU's user with private modes, as QEMU's own files do."""
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files + dirs:
            _present(os.path.join(folder, name), owner)
    _present(str(root), owner)


def _present(path: str, owner: tuple[int, int] | None) -> None:
    st = os.lstat(path)
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        target = os.fsencode(os.readlink(path))
        os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, HOST_FILE_MODE)
        try:
            os.write(fd, target)
        finally:
            os.close(fd)
        mode = stat.S_IFLNK | 0o777
    elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return
    try:
        os.setxattr(path, XATTR_UID, struct.pack("<I", GUEST_UID), follow_symlinks=False)
        os.setxattr(path, XATTR_GID, struct.pack("<I", GUEST_GID), follow_symlinks=False)
        os.setxattr(path, XATTR_MODE, struct.pack("<I", mode & ~0o7000), follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    if owner is not None and os.geteuid() == 0:
        os.lchown(path, *owner)
    os.chmod(path, HOST_DIR_MODE if stat.S_ISDIR(mode) else HOST_FILE_MODE)
