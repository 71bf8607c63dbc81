"""README.md's Configuration table, written from the settings models, so that a setting the
code reads is listed once and said the way its model says it.

    .venv/bin/python scripts/settings_table.py           # rewrite the table in README.md
    .venv/bin/python scripts/settings_table.py --check   # exit 1 with a diff when it differs

Where each row comes from:
- vmd: `VmdConfig` (vmd/config/settings.py), its variables from `ENV_FIELDS`, its file
  VMD_CONFIG (TOML, the field names as keys);
- the agent: `AgentConfig` (vmagent/config.py), VMAGENT_<FIELD> for every field and the
  names of `ENV_ALIASES`, its file VMAGENT_CONFIG;
- the job service: `ServiceConfig` (vmagent/service/config.py), its variables from
  `ENV_FIELDS` there, its file `vmagent serve --config`;
- the variables read outside the models (VMD_CONFIG, VMAGENT_CONFIG) and by the guest image
  recipes' build scripts: the two tables below.

A field's meaning is its `Field(description=...)`; its default is the field's default, or
`json_schema_extra={"shown_default": ...}` where the default is computed. A variable read by
several parts gets one row, in the group of the part it is named for (VMAGENT_*/OLLAMA_* the
agent's, the rest vmd's), which names the others. This is a script, not product code: it
imports both packages.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN = "<!-- settings:begin: written by scripts/settings_table.py from the settings models; do not edit -->"
END = "<!-- settings:end -->"
REGENERATE = ".venv/bin/python scripts/settings_table.py"

# The groups, in the table's order: a heading and the file that holds the same settings.
GROUPS = {
    "vmd": ("vmd (`vmd serve`, `vmd doctor`, `vmd images`)",
            "Each also goes in the TOML file `VMD_CONFIG` names, under the key in brackets; the "
            "environment wins over the file."),
    "agent": ("The agent (`vmagent run`, and each job's worker)",
              "Each also goes in the TOML or YAML file `VMAGENT_CONFIG` names (at its top level or "
              "under `[agent]`), under the key in brackets; the environment wins over the file, and of "
              "two variables in a row the second."),
    "service": ("The job service (`vmagent serve`)",
                "Each also goes in the YAML or JSON file of `vmagent serve --config`, under the key in "
                "brackets; the environment wins over the file, and `--host`, `--port`, `--data-dir`, "
                "`--max-concurrent` over both."),
    "recipes": ("The guest image recipes (`vmd images build`)",
                "Read by the recipes' build scripts (`vmd/images/<name>/build.sh`); vmd passes its "
                "`VMD_*` variables on to them. They are not part of the recipe's hash: after changing "
                "one, delete the built image's folder to build it again."),
}
# Who reads a variable besides the row's own part, in a row's "also read by".
READERS = {"vmd": "vmd", "agent": "the agent", "service": "the job service", "recipes": "the recipes"}


@dataclass(frozen=True)
class Direct:
    """A variable read outside the settings models, with its meaning."""
    group: str
    meaning: str
    default: str = "—"


# Read where the models are loaded (VmdConfig.load, AgentConfig.load), not fields of them.
DIRECT = {
    "VMD_CONFIG": Direct("vmd", "an optional TOML file with the settings of this table's vmd part (a "
                                "missing file is an error that names it)"),
    "VMAGENT_CONFIG": Direct("agent", "an optional TOML or YAML file with the agent's settings (`num_ctx`, "
                                      "the turn cap `max_steps`, the deadline, the guards: every key below)"),
}
# Read by the guest image recipes' build scripts (vmd/images/*/build.sh).
RECIPES = {
    "VMD_APT_MIRROR": Direct("recipes", "the Debian mirror `debian`'s debootstrap installs from", "the host's apt "
                             "sources' first `main` mirror"),
    "VMD_APT_SUITE": Direct("recipes", "the Debian suite of the `debian` guest", "the host's own (`VERSION_CODENAME`)"),
    "VMD_UBUNTU_IMAGE_URL": Direct("recipes", "the Ubuntu cloud image `ubuntu` starts from; pin a dated release "
                                   "(`.../noble/20240423/...`) for a repeatable build, `current` moves",
                                   "24.04 `noble`, current"),
    "VMD_UBUNTU_SUMS_URL": Direct("recipes", "the image's `SHA256SUMS`", "next to the image"),
    "VMD_UBUNTU_CACHE": Direct("recipes", "where the download is kept between builds",
                               "`~/.cache/vmagent/ubuntu`"),
    "VMD_UBUNTU_RESOLUTION": Direct("recipes", "the `ubuntu` guest's screen, `WIDTHxHEIGHT`", "`1280x800`"),
    "VMD_UBUNTU_DISK_SIZE": Direct("recipes", "the virtual size of the `ubuntu` guest's disk", "`16G`"),
    "VMD_UBUNTU_MEMORY_MIB": Direct("recipes", "the memory of the `ubuntu` build's one boot", "`4096`"),
    "VMD_UBUNTU_CPUS": Direct("recipes", "the vCPUs of the `ubuntu` build's one boot", "the host's, at most 4"),
    "VMD_UBUNTU_TIMEOUT": Direct("recipes", "seconds the `ubuntu` build's boot may take", "`7200`"),
    "VMD_PYTHON": Direct("recipes", "a Python with pydantic and PyYAML for the `ubuntu` recipe's seed",
                         "the clone's `.venv`"),
}


@dataclass
class Row:
    group: str
    names: list[str]  # the variables, in the order they are read (the last one set wins)
    key: str | None  # the key in the group's file; None for a variable read outside the models
    meaning: str
    default: str
    also: list[str] = field(default_factory=list)  # other parts that read the same variable


class MissingDescription(SystemExit):
    pass


def _default(info) -> str:
    """A field's default as the table shows it."""
    extra = info.json_schema_extra or {}
    if isinstance(extra, dict) and "shown_default" in extra:
        return str(extra["shown_default"])
    value = info.get_default(call_default_factory=True)
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if value is None or value == "" or value == [] or value == {}:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _model_rows(group: str, model: Any, env_names: dict[str, list[str]]) -> list[Row]:
    rows, undescribed = [], []
    for key, info in model.model_fields.items():
        if not info.description:
            undescribed.append(key)
            continue
        rows.append(Row(group, env_names.get(key, []), key, " ".join(info.description.split()), _default(info)))
    if undescribed:
        raise MissingDescription(f"{model.__module__}.{model.__name__}: these settings have no "
                                 f"Field(description=...), which the README's table is made of: "
                                 f"{', '.join(undescribed)}")
    return rows


def _inverted(env_fields: dict[str, str]) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for var, key in env_fields.items():
        names.setdefault(key, []).append(var)
    return names


def _vmd_rows() -> list[Row]:
    from vmd.config.settings import ENV_FIELDS, VmdConfig

    return _model_rows("vmd", VmdConfig, _inverted(ENV_FIELDS))


def _agent_rows() -> list[Row]:
    from vmagent.config import ENV_ALIASES, AgentConfig

    names = {key: [f"VMAGENT_{key.upper()}"] for key in AgentConfig.model_fields}
    for var, key in ENV_ALIASES.items():  # read after VMAGENT_<FIELD>, so they win
        if var not in names[key]:
            names[key].append(var)
    return _model_rows("agent", AgentConfig, names)


def _service_rows() -> list[Row]:
    from vmagent.service.config import ENV_FIELDS, ServiceConfig

    return _model_rows("service", ServiceConfig, _inverted(ENV_FIELDS))


def _owner_order(var: str) -> tuple[str, ...]:
    if var.startswith(("VMAGENT_", "OLLAMA_")):
        return ("agent", "service", "vmd", "recipes")
    return ("vmd", "agent", "service", "recipes")


def rows() -> list[Row]:
    """Every setting, once: a variable read by several parts is kept in its owner's row."""
    every = _vmd_rows() + _agent_rows() + _service_rows()
    every += [Row(d.group, [var], None, d.meaning, d.default) for var, d in {**DIRECT, **RECIPES}.items()]
    readers: dict[str, list[Row]] = {}
    for row in every:
        for var in row.names:
            readers.setdefault(var, []).append(row)
    kept = []
    for row in every:
        if not row.names:  # read from the file only
            kept.append(row)
            continue
        own = [var for var in row.names
               if min(readers[var], key=lambda r: _owner_order(var).index(r.group)) is row]
        if not own:
            continue  # its variables are all listed in other parts' rows
        row.names = own
        others = {r.group for var in own for r in readers[var] if r.group != row.group}
        row.also = [READERS[g] for g in GROUPS if g in others]
        kept.append(row)
    return kept


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _variable(row: Row) -> str:
    names = ", ".join(f"`{var}`" for var in row.names)
    if row.key is None:
        return names
    if not names:
        return f"(file only) [`{row.key}`]"
    return f"{names} [`{row.key}`]"


def table() -> str:
    """The lines between the markers."""
    out = []
    listed = rows()
    for group, (heading, note) in GROUPS.items():
        mine = [row for row in listed if row.group == group]
        if not mine:
            continue
        out += [f"### {heading}", "", textwrap.fill(note, 92), "", "| variable | meaning | default |", "|---|---|---|"]
        for row in sorted(mine, key=lambda r: (r.key is not None, not r.names)):
            meaning = row.meaning.rstrip(".")
            if row.also:
                meaning += f" (also read by {' and '.join(row.also)})"
            out.append(f"| {_variable(row)} | {_cell(meaning)} | {_cell(row.default)} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def replaced(readme: str, generated: str) -> str:
    """`readme` with the lines between the markers replaced by `generated`."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise SystemExit(f"README.md must hold the markers once each, in order:\n{BEGIN}\n{END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 with a diff when README.md differs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    current = README.read_text()
    wanted = replaced(current, table())
    if current == wanted:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), wanted.splitlines(True),
                                                   "README.md", "README.md (generated)"))
        print(f"\nREADME.md's Configuration table is not the one the settings models make: run {REGENERATE}")
        return 1
    README.write_text(wanted)
    print("README.md: Configuration table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
