"""Leniency: tool arguments are untrusted input. A JSON string, broken JSON, a bare value
where an object belongs, a wrapper around the real arguments, aliased or unknown field
names, and values in the shapes models use ("#3" for a task, 412.5 for a pixel) are all
read as well as they can be; then the verb's own params model (vmd/contract/params.py) validates.
What cannot be read becomes an error text that shows the expected shape, never an
exception."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import json_repair
from pydantic import ValidationError

from vmagent.tools.schemas import json_schema, shape
from vmagent.tools.table import TOOLS, Tool
from vmd.contract.json_depth import TooDeep, loads as bounded_json


# What a result text may show of a value the model sent, in error texts.
_ECHO_LIMIT = 300

# Wrappers some models put around the real arguments: {"arguments": {...}}.
_WRAPPER_KEYS = ("arguments", "args", "params", "parameters", "input", "kwargs")


@dataclass
class ParsedArguments:
    """What parse_arguments made of the model's arguments: params to send to vmd, or an
    error text for the model; notes say what was dropped along the way."""
    params: dict | None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def _echo(raw: Any) -> str:
    try:
        if isinstance(raw, str) and _looks_like_json(raw.strip()):
            text = raw.strip()  # broken JSON is shown as it came, not escaped again
        else:
            text = json.dumps(raw, ensure_ascii=False, default=str)
    except Exception:
        text = repr(raw)
    if len(text) > _ECHO_LIMIT:
        text = text[:_ECHO_LIMIT] + f"... ({len(text)} chars)"
    return text


def _looks_like_json(text: str) -> bool:
    return text[:1] in ("{", "[", '"')


def _decode(raw: Any) -> Any:
    """Strings that hold JSON are decoded (repaired when broken); other strings and
    non-strings come back as they are; a blank string is an empty object."""
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if not text:
        return {}
    if not _looks_like_json(text):
        return raw
    try:
        value = bounded_json(text)
    except TooDeep:
        return raw  # json_repair parses by recursion too: a text this deep is no call's arguments
    except ValueError:
        try:
            value = json_repair.repair_json(text, return_objects=True)
        except Exception:
            return raw
        if not isinstance(value, dict):
            # A repaired fragment that is not an object was most likely never JSON:
            # `{ make; } 2>&1` is a shell command, not a broken object.
            return raw
    if isinstance(value, str) and _looks_like_json(value.strip()):  # JSON inside JSON
        return _decode(value)
    return value


# --- what a model means, read before the verb's model validates --------------------------
# vmd/contract/params.py's models take each value in one shape (and forbid what they do not know);
# models send others. A normaliser gives the value the model meant, or the value as it
# came for the verb's model to refuse. NORMALISERS holds them by tool and field; one more,
# numbers read as text, holds for every text field of every tool.


def _whole_number(v: Any) -> Any:
    # Models send pixel coordinates as 412.5 or "412"; a pixel is a pixel.
    if isinstance(v, float):
        return round(v)
    if isinstance(v, str):
        try:
            return round(float(v.strip()))
        except ValueError:
            return v
    return v


def _task_number(v: Any) -> Any:
    if isinstance(v, str):  # "#3", "task 3"
        digits = re.search(r"\d+", v)
        return int(digits.group()) if digits else v
    return _whole_number(v)


_STATUS_WORDS = {
    "todo": "pending", "open": "pending", "not_started": "pending",
    "inprogress": "in_progress", "in progress": "in_progress", "in-progress": "in_progress",
    "started": "in_progress", "doing": "in_progress", "active": "in_progress",
    "working": "in_progress",
    "complete": "done", "completed": "done", "finished": "done", "verified": "done",
    "ok": "done", "success": "done",
    "stuck": "blocked", "failed": "blocked",
}


def _status_word(v: Any) -> Any:
    if isinstance(v, str):
        word = v.strip().lower()
        return _STATUS_WORDS.get(word, word.replace("-", "_").replace(" ", "_"))
    return v


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|\[[ xX]?\])\s+")


def _task_titles(v: Any) -> Any:
    if isinstance(v, str):  # one task per line, bullets and numbers stripped
        v = [_BULLET.sub("", line) for line in v.splitlines()]
    if not isinstance(v, list):
        return v
    titles = []
    for item in v:
        if isinstance(item, dict):  # [{"title": ...}] is a common shape
            item = next((item[k] for k in ("title", "name", "task", "description")
                         if isinstance(item.get(k), str)), None)
        if isinstance(item, (str, int, float)) and str(item).strip():
            titles.append(str(item).strip())
    return titles


def _chord(v: Any) -> Any:
    if isinstance(v, list) and all(isinstance(k, str) for k in v):  # ["ctrl", "s"]
        return "+".join(k.strip() for k in v)
    return v


def _argv(v: Any) -> Any:
    if isinstance(v, str):  # one command line where a list of arguments belongs
        try:
            return shlex.split(v, posix=True)
        except ValueError:
            return v.split()
    return v


NORMALISERS: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("plan_tasks", "tasks"): _task_titles,
    ("update_task", "id"): _task_number,
    ("update_task", "status"): _status_word,
    **{(verb, axis): _whole_number for verb in ("click", "move", "scroll") for axis in ("x", "y")},
    ("scroll", "amount"): _whole_number,
    ("key", "keys"): _chord,
    ("launch_app", "args"): _argv,
}


def _numbers_as_text(value: Any, node: dict) -> Any:
    """A number where text belongs is read as text (type(text=42) types "42"), at any depth
    of the field's schema; a choice among words (an enum) is left to refuse it."""
    kind = node.get("type")
    if kind == "string" and "enum" not in node and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if kind == "array" and isinstance(value, list):
        return [_numbers_as_text(item, node.get("items", {})) for item in value]
    if kind == "object" and isinstance(value, dict):
        inner = node.get("properties", {})
        return {k: _numbers_as_text(v, inner[k]) if k in inner else v for k, v in value.items()}
    return value


def _normalised(tool: Tool, params: dict[str, Any], properties: dict[str, dict]) -> dict[str, Any]:
    out = {}
    for key, value in params.items():
        normalise = NORMALISERS.get((tool.name, key))
        out[key] = _numbers_as_text(normalise(value) if normalise else value, properties[key])
    return out


def parse_arguments(name: str, raw: Any) -> ParsedArguments:
    """Read a tool call's arguments tolerantly and validate them against the tool's shape.

    Never raises. Accepts a dict, a JSON string (repaired when broken), a bare value where
    the tool has one obvious field (run("ls") -> {"command": "ls"}), aliased field names
    ("cmd" -> "command", "file" -> "path"); unknown fields are dropped with a note.
    """
    tool = TOOLS.get(name)
    if tool is None:
        return ParsedArguments(None, unknown_tool_text(name))
    try:
        return _parse(tool, raw)
    except Exception as exc:  # untrusted input must never cost the session
        return ParsedArguments(
            None, f"{name} needs {shape(name)}; could not read what you sent ({exc}): {_echo(raw)}"
        )


def _parse(tool: Tool, raw: Any) -> ParsedArguments:
    name = tool.name
    fields = set(tool.args.model_fields)
    properties = json_schema(tool.args)["properties"]
    value = _decode(raw)
    if value is None:
        value = {}

    if not isinstance(value, dict):
        primary_is_list = tool.primary is not None and properties[tool.primary].get("type") == "array"
        if isinstance(value, list) and not primary_is_list and isinstance(raw, str):
            value = raw  # a list-looking string for a text field: the text itself
        if tool.primary is None:
            return ParsedArguments(
                None, f"{name} needs {shape(name)}; you sent {_echo(raw)}. Send an object "
                "with those fields."
            )
        if isinstance(value, str) and name != "type":  # typed text keeps its spaces
            value = value.strip()
        value = {tool.primary: value}

    # {"arguments": {...}} around the real arguments.
    if len(value) == 1:
        (key, inner), = value.items()
        if key in _WRAPPER_KEYS and key not in fields:
            inner = _decode(inner)
            if isinstance(inner, dict):
                value = inner

    notes: list[str] = []
    params: dict[str, Any] = {k: v for k, v in value.items() if k in fields}
    unknown: list[str] = []
    for key, item in value.items():
        if key in fields:
            continue
        lowered = str(key).strip().lower()
        canonical = lowered if lowered in fields else tool.aliases.get(lowered)
        if canonical in fields and canonical not in params:
            params[canonical] = item
        else:  # unknown, or an alias of a field that was given by its proper name
            unknown.append(str(key))
    if unknown:
        notes.append(
            f"note: ignored unknown field(s) {', '.join(repr(k) for k in unknown)}; "
            f"{name} takes {shape(name)}."
        )

    try:
        validated = tool.args.model_validate(_normalised(tool, params, properties))
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        return ParsedArguments(
            None,
            f"{name} needs {shape(name)}; you sent {_echo(raw)}. Problem: {problems}.",
            notes,
        )
    return ParsedArguments(validated.model_dump(mode="json", exclude_unset=True), None, notes)


def _problem(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
    if error.get("type") == "missing":
        return f"{where} is missing"
    return f"{where}: {error.get('msg', 'invalid')}"


def unknown_tool_text(name: Any, offered: Iterable[str] | None = None) -> str:
    valid = list(offered) if offered is not None else list(TOOLS)
    return f"there is no tool named {_echo(name)}. Valid tools: {', '.join(valid)}."


def verb_of(name: Any) -> str:
    # "functions.run", " Run " -> "run"
    text = str(name or "").strip()
    return text.rsplit(".", 1)[-1].strip().lower()
