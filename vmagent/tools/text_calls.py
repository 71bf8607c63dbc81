"""Tool calls a model wrote as text: recovered from the reply's content.

Real models often put a call in `content` instead of `tool_calls` (reported upstream for
qwen3:32b; Llama 3.x and Mistral write their own chat template's call syntax when
Ollama's parser misses it), in these shapes:

    {"name": "run", "arguments": {"command": "ls"}}          an object, or several one
    {"name": "read_file", "parameters": {"path": "a"}}        after another (any whitespace,
                                                              `;` or `,` between), or an array
    <tool_call>{"name": "run", "arguments": {...}}</tool_call>   Hermes-style tags
    ```json\n{"name": "run", "arguments": {...}}\n```           a fenced block
    <|python_tag|>{"name": "run", "parameters": {...}}<|eom_id|>   Llama 3.x
    [TOOL_CALLS] [{"name": "run", "arguments": {...}}]          Mistral (and its newer
    [TOOL_CALLS]run[ARGS]{"command": "ls"}                      name[ARGS]{...} form)

with `arguments` or `parameters`, as an object or as a JSON string, and the
{"function": {...}} wrapper of OpenAI's wire format. Ollama also leaves a call in the
content when the tool is not in the request's tool list (the planning phase offers fewer
tools). Without recovery the loop reads all of these as prose and the job stalls.

A JSON example in an explanation must not run by accident: an object is a call when it
names a known tool, or when it has a call's shape exactly (a name and its arguments, no
other fields) or stands inside a call marker (tags, a prefix). A call to a tool that does
not exist is kept, so that the model is told which tools there are (vmagent/tools/results.py),
not dropped silently.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from vmagent.models import ToolCall
from vmagent.tools.parsing import verb_of

# Said once per job, in the result of the first recovered call.
USE_THE_TOOL_INTERFACE = (
    "NOTE: you wrote this tool call as text in your message; it was taken as a call anyway. Call "
    "tools through the tool-calling interface (tool_calls), not as JSON or <tool_call> tags in your reply."
)

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|JSON|tool_call)?\s*\n(.*?)\n?```", re.DOTALL)
# Llama 3.x: a call follows <|python_tag|>; the turn's end tokens may be left in the text.
_PYTHON_TAG = "<|python_tag|>"
_END_TOKENS = re.compile(r"<\|(?:eom_id|eot_id|end_of_text)\|>|</s>")
# Mistral: [TOOL_CALLS] and a JSON array, or (tokenizer v11 on) name[ARGS]{...} per call.
_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]")
# Where a JSON value may start when it is not at the very beginning: at a line's start.
_LINE_START = re.compile(r"^[ \t]*([\[{])", re.MULTILINE)
# What may stand between calls written one after another.
_BETWEEN = " \t\r\n;,"
# A tool's name as models write one: an identifier, perhaps dotted (functions.run).
_NAME = re.compile(r"^[A-Za-z_][\w.\-]{0,63}$")
# The fields a call has, and nothing else, when the name is not a known tool's.
_CALL_FIELDS = {"name", "arguments", "parameters", "type", "id"}


def calls_in_text(content: str, known: Iterable[str]) -> list[ToolCall]:
    """The tool calls written as text in `content`, in order; [] when there are none.
    A call-shaped object naming no known tool is among them, under its own name."""
    text = _END_TOKENS.sub("\n", content or "").strip()
    if not text:
        return []
    known_names = set(known)
    marked = [*_TAGGED.findall(text), *_after(text, _MISTRAL), *_after(text, _PYTHON_TAG)]
    for pieces, in_marker in ((marked, True), (_FENCED.findall(text), False), ([text], False)):
        found = [c for piece in pieces for c in _calls_in_piece(piece, known_names, in_marker)]
        if found:
            return found
    return []


def _after(text: str, marker: str) -> list[str]:
    """The text after each `marker`, up to the next one."""
    return [part for part in text.split(marker)[1:] if part.strip()] if marker in text else []


def _calls_in_piece(piece: str, known: set[str], in_marker: bool) -> list[ToolCall]:
    named = _MISTRAL_NAMED.match(piece)
    if named and in_marker:  # run[ARGS]{"command": "ls"}
        values = _json_values(piece[named.end():])
        return [ToolCall(name=verb_of(named.group(1)), arguments=_arguments(values[0]) if values else {})]
    calls = []
    for value in _json_values(piece):
        for item in value if isinstance(value, list) else [value]:
            found = _call_of(item, known, in_marker)
            if found is not None:
                calls.append(found)
    return calls


def _json_values(text: str) -> list[Any]:
    """The JSON values in `text`, in order: one after another (whitespace, `;` or `,`
    between), or each at the start of a line among prose."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    at = 0
    while at < len(text):
        while at < len(text) and text[at] in _BETWEEN:
            at += 1
        if at < len(text) and text[at] in "{[":
            try:
                value, at = decoder.raw_decode(text, at)
                values.append(value)
                continue
            except ValueError:
                pass
        following = _LINE_START.search(text, at + 1)
        if following is None:
            break
        at = following.start(1)
    return values


def _call_of(value: Any, known: set[str], in_marker: bool) -> ToolCall | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):  # {"type": "function", "function": {"name": ..., ...}}
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name.strip()):
        return None
    has_arguments = "arguments" in value or "parameters" in value
    if verb_of(name) not in known:
        # Not a tool: a call only by its shape or its marker; then the model hears there is none.
        if not (has_arguments and (in_marker or set(value) <= _CALL_FIELDS)):
            return None
    if not has_arguments:  # {"name": "run", "command": "ls"}: the arguments beside the name
        arguments = {k: v for k, v in value.items() if k not in _CALL_FIELDS}
    else:
        arguments = _arguments(value.get("arguments", value.get("parameters")))
    if arguments is None:
        return None
    return ToolCall(name=verb_of(name), arguments=arguments)


def _arguments(raw: Any) -> dict | str | None:
    """A call's arguments as an object, or as the JSON string the model wrote (tools reads
    it, repairing it when broken); None when they are neither."""
    if raw is None:
        return {}
    return raw if isinstance(raw, (dict, str)) else None
