"""One way to hold text against a golden file (virtinst's `diff_compare`): a difference fails
with a unified diff to read; VMD_WRITE_GOLDEN=1 writes the new text when the change is
meant (then read the diff of the files before committing them); a missing file is written
and the test fails once, so that nobody commits a golden file unread."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


def assert_golden(path: Path, text: str) -> None:
    if os.environ.get("VMD_WRITE_GOLDEN") or not path.exists():
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not existed and not os.environ.get("VMD_WRITE_GOLDEN"):
            pytest.fail(f"{path} did not exist and was written: read it, then run the test again")
        return
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                            fromfile=str(path), tofile="now"))
        pytest.fail(f"the text differs from {path.name} (VMD_WRITE_GOLDEN=1 writes it when meant):\n{diff}")
