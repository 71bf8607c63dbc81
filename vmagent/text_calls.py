"""Tool calls a model wrote as text: recovered from the reply's content.

Real models often put a call in `content` instead of `tool_calls` (reported upstream for
qwen3:32b), in three shapes:

    {"name": "run", "arguments": {"command": "ls"}}          the whole content
    <tool_call>{"name": "run", "arguments": {...}}</tool_call>   Hermes-style tags
    ```json\n{"name": "run", "arguments": {...}}\n```           a fenced block

and Ollama leaves a call in the content when the tool is not in the request's tool list
(the planning phase offers fewer tools). Without recovery the loop reads all of these
as prose and ends the job as a stall. Only objects that name a known tool are taken, so
a JSON example in an explanation is not run by accident unless it is shaped as a call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from vmagent.llm import ToolCall
from vmagent.tool_parsing import _tool_name

# Said once per job, in the result of the first recovered call.
USE_THE_TOOL_INTERFACE = (
    "NOTE: you wrote this tool call as text in your message; it was run anyway. Call tools "
    "through the tool-calling interface (tool_calls), not as JSON or <tool_call> tags in your reply."
)

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|JSON|tool_call)?\s*\n(.*?)\n?```", re.DOTALL)


def calls_in_text(content: str, known: Iterable[str]) -> list[ToolCall]:
    """The tool calls written as text in `content`, in order; [] when there are none."""
    text = (content or "").strip()
    if not text:
        return []
    known_names = set(known)
    for pieces in (_TAGGED.findall(text), _FENCED.findall(text), [text]):
        found = [c for piece in pieces for c in _calls_in_json(piece, known_names)]
        if found:
            return found
    return []


def _calls_in_json(piece: str, known: set[str]) -> list[ToolCall]:
    try:
        value = json.loads(piece.strip())
    except ValueError:
        return []
    values = value if isinstance(value, list) else [value]
    calls = [_call_of(v, known) for v in values]
    return [c for c in calls if c is not None]


def _call_of(value: Any, known: set[str]) -> ToolCall | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):  # {"function": {"name": ..., "arguments": ...}}
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or _tool_name(name) not in known:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        return None
    return ToolCall(name=_tool_name(name), arguments=arguments)
