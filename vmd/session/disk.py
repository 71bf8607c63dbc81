"""Writing vmd's own files when the host's disk may be full.

vmd writes two kinds of files per session: the record (appended, one JSON line per
event) and session.json (replaced whole). A full disk (ENOSPC, or a quota: EDQUOT) must
cost neither: an append that fails is taken back to where the file ended, so the record
never holds half a line that would swallow the next one; a replace that fails leaves the
old file as it was and removes its temporary copy. The caller learns of it through
`full()` and tells the agent in a sentence (`sentence()`).
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from vmd.private_fs import open_private

# What a host that ran out of space answers, as an errno and as git and other tools print it.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What host tools print for a full disk: the C library's ENOSPC and EDQUOT texts, and git
# fast-import's own "write error. Out of diskspace" (git 2.39).
FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "Out of diskspace")


def full(exc: BaseException | None, by_text: bool = False) -> bool:
    """True when `exc` (or what caused it) is a full disk on this host. `by_text` also reads
    the message, for errors of host tools that arrive as text (git's stderr); never for a
    guest's errors: a guest whose own disk is full is the agent's business, not the host's."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        if by_text and any(text in str(exc) for text in FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def sentence(what: str, exc: BaseException) -> str:
    """`the host's disk is full: <what> (<the error>)`."""
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip()
    return f"the host's disk is full: {what} ({detail or type(exc).__name__})"


def _write(path: Path, fd: int, data: bytes) -> None:
    """All of `data` to `fd`. The one place vmd's session files are written: tests make it
    fail with ENOSPC here."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def append(path: Path, data: bytes) -> None:
    """Appends `data` to `path` whole or not at all: on an error the file is cut back to
    its size before (cutting needs no space), then the error is raised."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # 0600: the record is vmd's
    try:
        size = os.fstat(fd).st_size
        try:
            _write(path, fd, data)
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def replace(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename, so that `path` is the
    old file or the new one, never a truncated one; the temporary file goes on an error."""
    # A name of its own per writer: two writers of one session.json (a vmd being stopped
    # and the one that adopted its session) must not rename each other's copy away.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        fd = open_private(tmp)  # 0600 whatever the umask: session.json is vmd's
        try:
            _write(tmp, fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
