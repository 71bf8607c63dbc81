"""Folders and files of the job service that no other user of the host may read.

The service's data holds every job's preview secret (in `jobs.sqlite3`: a secret mints
valid preview links), the guest's terminal and screen, and the workers' logs. Measured on
the code before this: `jobs.sqlite3` 0644 and job folders 0755 under the usual umask 022,
and 0666/0777 under umask 0. So modes are set explicitly at creation (`mkdir`'s and
`open`'s modes are masked by the umask, and an umask only takes bits away) and then
`chmod`ed to exactly 0700 / 0600.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vmagent.atomic_file import replace_bytes

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# What a worker process starts with, so that what it writes (its transcript) is private
# too, whatever the service's own umask.
WORKER_UMASK = 0o077

log = logging.getLogger("vmagent.service")


def private_dir(path: Path) -> Path:
    """`path` as a folder of mode 0700, created with any missing parents (each 0700: the
    service made them, no one else needs them). An existing folder is narrowed to 0700
    when it is the service's own; one owned by another user is left as it is."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
        os.chmod(folder, PRIVATE_DIR_MODE)
    if not missing:
        _narrow(path, PRIVATE_DIR_MODE)
    return path


def _narrow(path: Path, mode: int) -> None:
    try:
        if path.stat().st_mode & 0o7777 != mode:
            os.chmod(path, mode)
    except PermissionError:
        log.warning("%s is not the job service's to change (mode left as it is); make it %o and owned "
                    "by the service's user", path, mode)


def private_file(path: Path) -> None:
    """Narrows an existing file to 0600 (a database from before modes were set)."""
    if Path(path).exists():
        _narrow(Path(path), PRIVATE_FILE_MODE)


def open_private(path: Path, flags: int) -> int:
    """`os.open(path, flags | O_CREAT)` with the file 0600 whatever the umask; the fd."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_private_append(path: Path) -> int:
    """A file opened for appending (a worker's stdout or stderr), 0600; the fd."""
    return open_private(path, os.O_WRONLY | os.O_APPEND)


def write_private(path: Path, data: bytes) -> None:
    """Writes `data` to `path` whole, through a temporary file beside it, mode 0600."""
    path = Path(path)
    replace_bytes(path, data)
