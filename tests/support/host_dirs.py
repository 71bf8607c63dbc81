"""Folders for real guests' files outside pytest's temp root: QEMU (an unprivileged user)
must pass through every folder above them, and other pytest runs on this host reset
/tmp/pytest-of-<user> to 0700 whenever they start."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def passable_folder(prefix: str) -> Iterator[Path]:
    """A new folder in /var/tmp that QEMU can pass through (0711), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    os.chmod(folder, 0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
