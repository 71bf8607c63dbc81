"""The history and the tools as they are sent to Ollama: what the model really reads.

Kept apart from the client (vmagent/llm.py) because compaction (vmagent/compact.py)
counts the prompt from the same shapes: old screenshots dropped, thinking only where it
belongs, tool-call arguments as objects, tool schemas as the ollama client trims them.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import ollama
from vmd.verbs import bounded_json

SCREENSHOT_DROPPED = "[screenshot dropped]"


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


def only_latest_thinking(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with `thinking` kept on the newest assistant message only, and only
    while no user message follows it.

    Ollama's tool-calling docs hand the thinking back with the tool calls whose results
    are being sent, so that the model reads why it made them: that is the newest assistant
    message, answered by tool results alone. Older thinking is dropped: the models'
    templates (qwen3 and others) leave out the thinking before the last user message
    anyway, and kept on every turn it would fill the context and the transcript with text
    the model no longer reads. Returns a new list; the input is left as it was.
    """
    latest = None
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i].get("role")
        if role == "assistant":
            latest = i
            break
        if role == "user":
            break
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if "thinking" in message and i != latest:
            message = {k: v for k, v in message.items() if k != "thinking"}
        out.append(message)
    return out


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


def drop_old_images(messages: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """Keep only the newest `keep` images in the history; older ones become a text note.

    Returns a new list; messages that change are copied, the input is left as it was.
    """
    total = image_count(messages)
    to_drop = max(0, total - max(0, keep))
    if not to_drop:
        return list(messages)
    out: list[dict[str, Any]] = []
    for message in messages:
        images = list(message.get("images") or [])
        if not images or not to_drop:
            out.append(message)
            continue
        dropped = min(to_drop, len(images))  # the oldest images of the oldest messages go first
        to_drop -= dropped
        copy = dict(message)
        kept = images[dropped:]
        if kept:
            copy["images"] = kept
        else:
            copy.pop("images", None)
        note = " ".join([SCREENSHOT_DROPPED] * dropped)
        content = copy.get("content") or ""
        copy["content"] = f"{content}\n{note}" if content else note
        out.append(copy)
    return out


def drop_images_in_batches(messages: list[dict[str, Any]], keep: int, ceiling: int) -> list[dict[str, Any]]:
    """The history unchanged while it holds at most `ceiling` images; past it, all but the
    newest `keep` dropped at once (drop_old_images). A drop rewrites old messages, which
    makes the model server evaluate the prompt again from the first one changed: one drop
    per batch of looks costs that once, one drop per look would cost it at every look."""
    if image_count(messages) <= max(ceiling, keep):
        return messages
    return drop_old_images(messages, keep)


def image_count(messages: Iterable[Mapping[str, Any]]) -> int:
    return sum(len(m.get("images") or []) for m in messages)
