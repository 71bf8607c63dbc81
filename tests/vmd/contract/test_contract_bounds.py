"""Every size in the verb contract (vmd/contract/bounds.py) has an upper bound: vmd is root and
shared by every session, and a number or text it takes from a request is memory or time
it spends (`read_file` with limit=10**12 asked the guest for a terabyte, held in vmd)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vmd.contract.bounds import COMMAND_CHARS, PATH_CHARS, TASKS, TITLE_CHARS, TYPE_CHARS
from vmd.contract.check import Verification
from vmd.contract.params import ReadFile, VERBS

# Fields that size nothing, with the reason; everything else must be bounded.
UNBOUNDED: dict[str, str] = {}


def _problems(node: dict, where: str) -> list[str]:
    if "anyOf" in node:
        return [p for option in node["anyOf"] for p in _problems(option, where)]
    if "enum" in node or "const" in node or "$ref" in node:
        return []  # a choice from a fixed list, or a nested model (walked on its own)
    kind = node.get("type")
    if kind in ("integer", "number") and "maximum" not in node and "exclusiveMaximum" not in node:
        return [f"{where}: a number with no upper bound"]
    if kind == "string" and "maxLength" not in node:
        return [f"{where}: a text with no max_length"]
    if kind == "array":
        own = [] if "maxItems" in node else [f"{where}: a list with no max_length"]
        return own + _problems(node.get("items", {}), f"{where}[]")
    return []


def _models():
    seen = {}
    for verb, model in VERBS.items():
        seen.setdefault(model, verb)
    seen.setdefault(Verification, "finish.verification")
    return seen.items()


@pytest.mark.parametrize("model, verb", _models(), ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_every_size_in_the_contract_has_an_upper_bound(model, verb):
    schema = model.model_json_schema()
    problems = []
    for name, node in schema.get("properties", {}).items():
        where = f"{verb}.{name}"
        if where not in UNBOUNDED:
            problems += _problems(node, where)
    assert not problems, problems


def test_read_file_limit_is_the_read_paths_own_cap():
    from vmd.guests.linux.guest import READ_LIMIT

    assert ReadFile(path="a", limit=READ_LIMIT).limit == READ_LIMIT
    with pytest.raises(ValidationError, match="less than or equal to 200000"):
        ReadFile(path="a", limit=10**12)


@pytest.mark.parametrize("verb, params", [
    ("run", {"command": "x" * (COMMAND_CHARS + 1)}),
    ("plan_tasks", {"tasks": ["t"] * (TASKS + 1)}),
    ("plan_tasks", {"tasks": ["t" * (TITLE_CHARS + 1)]}),
    ("launch_app", {"path": "/bin/true", "args": ["a" * (PATH_CHARS + 1)]}),
    ("scroll", {"x": 1, "y": 1, "amount": 10**9}),
    ("type", {"text": "a" * (TYPE_CHARS + 1)}),
    ("session_ready", {"timeout": 1e12}),
    ("note", {"turn": 10**30, "text": "x"}),
])
def test_a_size_past_its_bound_is_refused_at_the_edge(verb, params):
    with pytest.raises(ValidationError):
        VERBS[verb].model_validate(params)
