"""The loop's history as every backend sends it: old screenshots dropped (in batches, so
that the model server's cache of the prompt's head holds between drops), thinking only
where it belongs. Both wires (vmagent/models/ollama/wire.py, vmagent/models/openai/wire.py),
compaction and the turn loop read the history through these; none of them knows a server.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

SCREENSHOT_DROPPED = "[screenshot dropped]"


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
