"""README's Configuration table against the code: each setting is listed once, and each
one listed is a variable the code reads (a row left behind by a rename is caught here)."""

from __future__ import annotations

import collections
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table_names() -> list[str]:
    section = (ROOT / "README.md").read_text().split("\n## Configuration", 1)[1].split("\n## ", 1)[0]
    names = []
    for row in section.splitlines():
        if row.startswith("| `"):
            names += re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])
    return names


def _code_text() -> str:
    return "\n".join(p.read_text() for top in ("vmd", "vmagent") for p in (ROOT / top).rglob("*.py"))


def test_each_setting_is_listed_once():
    names = _table_names()
    assert len(names) > 20, "the Configuration table was not found in README.md"
    twice = sorted(n for n, count in collections.Counter(names).items() if count > 1)
    assert not twice, f"README's Configuration table lists these more than once: {twice}"


def test_each_listed_setting_is_read_by_the_code():
    from vmagent.config import AgentConfig

    code = _code_text()
    # vmagent reads VMAGENT_<FIELD> for every field of its config (vmagent/config.py).
    agent_fields = {f"VMAGENT_{name.upper()}" for name in AgentConfig.model_fields}
    unread = [n for n in _table_names() if n not in agent_fields and f'"{n}"' not in code]
    assert not unread, f"README names settings no code reads: {unread}"
