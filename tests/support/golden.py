"""One way to hold text against a golden file (virtinst's `diff_compare`), for every golden
test of the suite. The files live under tests/support/golden/, named relative to it.

- A difference fails with a unified diff of the file against the text now, to read.
- When the change is meant, regenerate: `pytest --regold tests/...` (or VMAGENT_REGOLD=1 in
  the environment) writes the new text; then read `git diff tests/support/golden` before
  committing it.
- A missing file is written and the test fails once, so that nobody commits a golden file
  unread."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
# Set by `pytest --regold` (tests/conftest.py) or by hand.
REGOLD_ENV = "VMAGENT_REGOLD"


def regold() -> bool:
    return os.environ.get(REGOLD_ENV, "") not in ("", "0")


def golden_diff(expected: str, actual: str, name: str) -> str:
    """The unified diff that turns the golden file's text into the text now."""
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        fromfile=f"golden/{name}", tofile="now"))


def assert_golden(name: str, text: str) -> None:
    """`text` must be the golden file `name` (a path under tests/support/golden/) byte for byte."""
    path = GOLDEN_DIR / name
    if regold() or not path.exists():
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not existed and not regold():
            pytest.fail(f"{path} did not exist and was written: read it, then run the test again")
        return
    expected = path.read_text()
    if text != expected:
        pytest.fail(f"the text differs from golden/{name}; when the change is meant, run with --regold "
                    f"({REGOLD_ENV}=1) and read the diff of the files:\n{golden_diff(expected, text, name)}",
                    pytrace=False)
