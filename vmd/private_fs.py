"""vmd's state is its own: every folder it makes 0700, every file 0600, whatever the umask.

vmd runs as root and keeps things another local user must not read: the sessions'
records (every command and its output), the guests' disks and memory images, vmd's
repositories. A mode given to mkdir or open is masked by the umask, and `mkdir(parents=True)`
gives the folders above the last one the default mode, so the modes are set here
explicitly, once the entry exists. Folders that QEMU (an unprivileged user) must pass
through or write into get their own modes where they are made (vmd/machines/domain_life.py).
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def qemu_gid(user: str) -> int | None:
    """The primary group of QEMU's user (VmdConfig.share_user), or None where there is none."""
    try:
        return pwd.getpwnam(user).pw_gid
    except KeyError:
        return None


def state_root(path: Path | str) -> Path:
    """The state dir itself: 0711. Everything in it is private; it is passed through by QEMU's
    user (to the sessions' disks and the project shares) and by the job service's user (to
    repos/, for /ask), neither of which may list it. Its entries' names are vmd's fixed ones."""
    path = private_dir(path)
    os.chmod(path, 0o711)
    return Path(path)


def private_dir(path: Path | str, mode: int = DIR_MODE) -> Path:
    """`path` as a folder with `mode`, made with its missing parents (each with `mode` too);
    an existing one is given `mode`, so that state made by an older vmd becomes private."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            if not folder.is_dir():
                raise
    os.chmod(path, mode)
    for folder in missing[1:]:
        os.chmod(folder, mode)
    return path


def passable_dir(path: Path | str, gid: int | None) -> Path:
    """A private folder that QEMU's user may pass through but not list: 0710 with QEMU's
    group (`gid`), or 0700 where QEMU's user does not exist here. QEMU runs as an
    unprivileged user and must open what lies below (a guest's disk overlay and console
    log, which libvirt's DAC relabelling gives it; the project share); a group's x bit
    lets it reach them by name without seeing the folder's other entries, and every file
    beside them stays 0600 root's. Group rather than ownership: a folder QEMU's user owned
    would let an escaped QEMU rename or delete vmd's records in it.

    The parents it makes are passable the same way: QEMU must pass through them too, and a
    private one (0700) would stop it above the folder (a configured room_templates_dir in a
    folder that did not exist yet was made unreachable so)."""
    path = Path(path)
    made = [folder for folder in (path, *path.parents) if not folder.exists()]
    path = private_dir(path, DIR_MODE)
    if gid is not None:
        for folder in [path, *made]:
            os.chown(folder, -1, gid)
            os.chmod(folder, 0o710)
    return path


def private_file(path: Path | str, mode: int = FILE_MODE) -> Path:
    """Gives an existing file `mode` (a file another program wrote, such as qemu-img)."""
    os.chmod(path, mode)
    return Path(path)


def open_private(path: Path | str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 mode: int = FILE_MODE) -> int:
    """os.open with `mode` really applied: a file that existed keeps its old mode through
    O_CREAT, and a new one's is masked by the umask, so the mode is set on the descriptor."""
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path | str, data: str | bytes, mode: int = FILE_MODE) -> Path:
    """Writes `data` to `path` (replacing what was there) as a file of `mode`."""
    fd = open_private(path, mode=mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)
