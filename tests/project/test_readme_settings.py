"""README's Configuration table against the code: it is the table scripts/settings_table.py
makes from the settings models (a field added without regenerating it fails here), and every
variable the code reads is in it exactly once: each field's variables, and the names that
vmd/ and vmagent/ spell out themselves (an `os.environ.get("VMAGENT_X")` beside the models,
a recipe's `${VMD_X:-...}`), which the generator knows only through its own tables."""

from __future__ import annotations

import collections
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Literals of the scanned shape that are not settings, with why.
NOT_SETTINGS = {
    # The runner's marker on a command's processes in the guest, set by vmd (vmd/guests/linux).
    "VMD_RUN",
    # Ray's own switch, set (never read) before Ray is imported for a loopback head
    # (vmagent/fleet/placement.py).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    # Ray's own: the auth mode vmagent sets for Ray's processes, the token Ray takes inline
    # (named in the row of RAY_AUTH_TOKEN_PATH), and Ray's temp folder passed through to a
    # `ray status` probe (vmagent/fleet/cluster_auth.py).
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_TMPDIR",
}
PREFIXES = r"(?:VMD|VMAGENT|GITEA|OLLAMA|RAY)_[A-Z0-9_]+"


def _generator():
    spec = importlib.util.spec_from_file_location("settings_table", ROOT / "scripts" / "settings_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _table_lines() -> list[str]:
    gen = _generator()
    readme = (ROOT / "README.md").read_text()
    assert readme.count(gen.BEGIN) == 1 and readme.count(gen.END) == 1, \
        "README.md lost the settings table's markers"
    return readme.split(gen.BEGIN, 1)[1].split(gen.END, 1)[0].splitlines()


def _listed() -> list[str]:
    """The variables in the table's first column, each time it names one."""
    names = []
    for row in _table_lines():
        if row.startswith("| ") and not row.startswith(("| variable", "|---")):
            names += re.findall(rf"`({PREFIXES})`", row.split(" | ")[0])
    return names


def _read_by_the_code() -> set[str]:
    """Names spelled out in vmd/ and vmagent/: string literals in Python, `${NAME` in the
    recipes' shell scripts."""
    found = set()
    for top in ("vmd", "vmagent"):
        for path in (ROOT / top).rglob("*.py"):
            found |= set(re.findall(rf"[\"']({PREFIXES})[\"']", path.read_text()))
        for path in (ROOT / top).rglob("*.sh"):
            found |= set(re.findall(rf"\$\{{({PREFIXES})", path.read_text()))
    return found - NOT_SETTINGS


def test_the_table_is_the_one_the_settings_models_make():
    gen = _generator()
    made = gen.table().splitlines()
    listed = _table_lines()[1:]  # the marker's own line ends before the first row
    assert listed == made, (
        "README.md's Configuration table is not the one the settings models make; run "
        f"`{gen.REGENERATE}` (a new setting needs Field(description=...) first).")


def test_every_setting_has_a_meaning():
    from vmagent.config import AgentConfig
    from vmagent.service.config import ServiceConfig
    from vmd.config import VmdConfig

    undescribed = [f"{model.__name__}.{name}" for model in (VmdConfig, AgentConfig, ServiceConfig)
                   for name, info in model.model_fields.items() if not (info.description or "").strip()]
    assert not undescribed, f"settings without Field(description=...), the README's meaning: {undescribed}"


def test_every_variable_the_code_reads_is_listed_exactly_once():
    from vmagent.config import CONFIG_ENV, ENV_ALIASES, AgentConfig
    from vmagent.service.config import ENV_FIELDS as SERVICE_ENV
    from vmd.config import ENV_FIELDS as VMD_ENV

    read = (_read_by_the_code() | set(VMD_ENV) | set(SERVICE_ENV) | set(ENV_ALIASES) | {CONFIG_ENV}
            | {f"VMAGENT_{name.upper()}" for name in AgentConfig.model_fields})
    counts = collections.Counter(_listed())
    missing = sorted(read - set(counts))
    twice = sorted(name for name, n in counts.items() if n > 1)
    unread = sorted(set(counts) - read)
    assert len(counts) > 100, "the Configuration table was not found in README.md"
    assert not missing, f"README's Configuration table lacks variables the code reads: {missing}"
    assert not twice, f"README's Configuration table lists these more than once: {twice}"
    assert not unread, f"README's Configuration table names variables no code reads: {unread}"


def test_the_check_fails_with_a_diff_when_the_table_is_stale(tmp_path, monkeypatch, capsys):
    gen = _generator()
    stale = (ROOT / "README.md").read_text().replace("| `VMD_ACCEL` [`accel`] |", "| `VMD_ACCEL` |", 1)
    assert "| `VMD_ACCEL` |" in stale
    readme = tmp_path / "README.md"
    readme.write_text(stale)
    monkeypatch.setattr(gen, "README", readme)
    assert gen.main(["--check"]) == 1
    said = capsys.readouterr().out
    assert "-| `VMD_ACCEL` |" in said and "+| `VMD_ACCEL` [`accel`] |" in said and gen.REGENERATE in said
    assert readme.read_text() == stale, "--check changed the file"
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()
