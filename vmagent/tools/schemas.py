"""The function schemas offered to the model: each verb's params model (vmd/contract/params.py) as
JSON schema, with the tool table's descriptions of its fields; and `shape(name)`: a
tool's fields in one line, for error texts."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from vmagent.os_family import os_family_of
from vmagent.tools.table import OFFERED_TOOLS, SCREEN_TOOLS, TOOLS, Phase, Tool, tool_names, worded


def json_schema(model: type[BaseModel], os_family: str = "linux") -> dict:
    """A flat JSON schema of a pydantic model, as small models read best: refs inlined,
    `X | None` shown as X, no titles."""
    raw = model.model_json_schema()
    defs = raw.get("$defs", {})

    def clean(node: Any) -> Any:
        if isinstance(node, list):
            return [clean(n) for n in node]
        if not isinstance(node, dict):
            return node
        node = dict(node)
        if "$ref" in node:
            target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
            node = {**target, **node}
        if "allOf" in node and len(node["allOf"]) == 1:
            node = {**node.pop("allOf")[0], **node}
            return clean(node)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o != {"type": "null"}]
            if len(options) == 1:
                node.pop("anyOf")
                return clean({**options[0], **node})
        node.pop("title", None)
        node.pop("$defs", None)
        node.pop("additionalProperties", None)
        if node.get("default", 0) is None:
            node.pop("default")
        out = {}
        for key, value in node.items():
            if key == "properties":
                out[key] = {name: clean(v) for name, v in value.items()}
            elif key == "description" and isinstance(value, str):
                out[key] = worded(value, os_family)
            else:
                out[key] = clean(value)
        return out

    schema = clean(raw)
    schema.pop("description", None)  # a class docstring is not a parameter description
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


# Bounds that guard vmd from a runaway value, not words a model needs: each costs prompt
# tokens in every request, and llama.cpp turns a maxLength into a grammar rule it walks at
# every token (tests/vmagent/models/test_llamacpp_real.py). vmd validates them all the same (vmd/contract/params.py).
_GUARD_KEYS = ("maxLength", "minLength", "maxItems")
_GUARD_LIMIT = 1_000  # a maximum or minimum this far out is a guard, not a range to use


def _lean(node: Any) -> Any:
    """The schema as offered: without vmd's guard bounds, a floor of 0 (no count, offset or
    time is negative) and empty defaults ("", [], false): none says what a model does not
    assume, and each costs tokens in every request."""
    if isinstance(node, list):
        return [_lean(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _GUARD_KEYS or (key in ("maximum", "minimum") and type(value) in (int, float)
                                  and abs(value) >= _GUARD_LIMIT):
            continue
        if key in ("minimum", "exclusiveMinimum") and value == 0 and type(value) in (int, float):
            continue
        if key == "default" and (value in ("", [], None) or value is False):
            continue
        out[key] = {name: _lean(v) for name, v in value.items()} if key == "properties" else _lean(value)
    return out


def parameters(tool: Tool, os_family: str) -> dict:
    """The tool's params schema with the table's description of each field (worded for the
    guest, with the field's default and maximum as the model states them), less the guard
    bounds (`_lean`)."""
    schema = json_schema(tool.args, os_family)
    for path, text in tool.fields.items():
        node = schema
        for name in path.split("."):
            node = node["properties"][name]
        limits = {key: f"{node[key]:g}" for key in ("default", "maximum") if type(node.get(key)) in (int, float)}
        node["description"] = worded(text, os_family, limits)
        for key in limits:  # said in the words once: not again as a key of the schema
            if "{" + key + "}" in text:
                node.pop(key)
    return _lean(schema)


def offered_names(web_tools: "tuple[str, ...] | list[str]" = (), screen: bool = True) -> list[str]:
    """The names of the tools every request of a job offers: OFFERED_TOOLS, less the screen
    tools for a guest known to have no desktop (`screen` False), then the web tools."""
    return [n for n in OFFERED_TOOLS if screen or n not in SCREEN_TOOLS] + list(web_tools)


def offered_schemas(os_family: str, web_tools: "tuple[str, ...] | list[str]" = (), screen: bool = True) -> list[dict]:
    """The tool list of every request of a job, whatever its phase: the same bytes from
    the planning turn to the last, so the model server's cache of the prompt's head holds.
    `web_tools`: the host's web tools this job offers; `screen`: whether it offers the screen
    tools (False for a guest whose image has no desktop); both decided once when it starts."""
    return _schemas_of(os_family, offered_names(web_tools, screen))


def schemas(os_family: str, phase: Phase, desktop: bool) -> list[dict]:
    """Function tool schemas (Ollama/OpenAI shape) of the tools a phase allows."""
    return _schemas_of(os_family, tool_names(phase, desktop))


def _schemas_of(os_family: str, names: "tuple[str, ...] | list[str]") -> list[dict]:
    family = os_family_of(os_family)
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": TOOLS[name].describe(family),
                "parameters": parameters(TOOLS[name], family),
            },
        }
        for name in names
    ]


def _type_word(node: dict) -> str:
    if "enum" in node:
        return "|".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    kind = node.get("type")
    if kind == "array":
        return "[" + _type_word(node.get("items", {})) + ", ...]"
    if kind == "object":
        return _shape_of(node)
    return kind or "any"


def _shape_of(schema: dict) -> str:
    required = set(schema.get("required", []))
    parts = [
        json.dumps(name) + ("" if name in required else "?") + ": " + _type_word(node)
        for name, node in schema.get("properties", {}).items()
    ]
    return "{" + ", ".join(parts) + "}"


def shape(name: str) -> str:
    """The expected arguments of a tool in one line, e.g.
    {"command": string, "timeout"?: number, "cwd"?: string}."""
    return _shape_of(json_schema(TOOLS[name].args))
