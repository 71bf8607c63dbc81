"""The history and the tools as they are sent to Ollama: what the model really reads.

The loop's messages are Ollama's own shape already; what changes on the way is what the
ollama client asks for: tool-call arguments as objects, tool schemas as its Tool model
trims them (vmagent/models/ollama/model.py `tools_as_sent`, which compaction counts).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import ollama

from vmagent.models.history import drop_old_images, only_latest_thinking
from vmd.contract.json_depth import loads as bounded_json


def wire_tools(tools: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The tool schemas as the ollama client sends them: its Tool model keeps a property's
    type, items, description and enum only (bounds, defaults and a nested object's own
    properties are dropped), so this, not our schema, is what the model reads and counts."""
    return [ollama.Tool.model_validate(tool).model_dump(exclude_none=True) for tool in tools or []]


def wire_messages(messages: Iterable[Mapping[str, Any]], max_images: int) -> list[dict[str, Any]]:
    """The history as it is sent: no more than `max_images` screenshots (the loop keeps
    fewer already, dropped in batches: drop_images_in_batches), thinking only where it
    belongs (only_latest_thinking), tool-call arguments as objects."""
    kept = only_latest_thinking(drop_old_images(list(messages), max_images))
    return [_wire_message(m) for m in kept]


def _wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    out = dict(message)
    out["tool_calls"] = [_wire_tool_call(call) for call in calls]
    return out


def _wire_tool_call(call: Any) -> dict[str, Any]:
    # The client refuses anything but an object as arguments; the history may hold the
    # model's raw string when it sent one.
    function = dict(call.get("function", {})) if isinstance(call, Mapping) else {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = bounded_json(arguments)
        except ValueError:
            parsed = None
        arguments = parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}
    elif not isinstance(arguments, Mapping):
        arguments = {} if arguments is None else {"_raw_arguments": str(arguments)}
    return {"function": {"name": str(function.get("name", "")), "arguments": dict(arguments)}}
