"""Replacing a file whole, so a reader sees the old file or the new one, never half of one.

The temporary file beside the target has a name of its own per writer (`mkstemp`): two
writers of the same file (a worker and the service, or two threads) each rename their own
copy, the last one wins, and neither finds its temporary file taken from under it. A fixed
`name.tmp` did exactly that in CI (FileNotFoundError at the rename). `mkstemp` also makes
the file 0600 whatever the umask, which is what every file written here wants.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_bytes(path: Path, data: bytes) -> Path:
    """Writes `data` to `path` through a private temporary file and a rename; on an error
    the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def replace_text(path: Path, text: str) -> Path:
    """`replace_bytes` of `text` in UTF-8."""
    return replace_bytes(path, text.encode("utf-8"))
