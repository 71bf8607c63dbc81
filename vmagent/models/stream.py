"""One streamed reply as it arrives, whatever the server: the one accumulator both backends
feed (Ollama's chunks: vmagent/models/ollama/model.py; an OpenAI-compatible server's events:
vmagent/models/openai/stream.py), and the Reply it makes once the server said it was whole.

Each piece of text or thinking goes to the watcher as it comes; a failing watcher callback
never breaks the stream (ARCHITECTURE rule 5). `streamed` says whether a piece reached one:
from then on a retry would show it twice, so Model.chat asks again only before that.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from vmagent.models.reply import Reply, ToolCall
from vmd.contract.json_depth import loads as bounded_json

log = logging.getLogger(__name__)


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)  # the JSON text, in the pieces it came in


class ReplyStream:
    """Accumulates one streamed reply: its text, its thinking, its tool calls (whole, or in
    pieces told apart by their index), the server's token counts and why it stopped."""

    def __init__(self, on_text: Callable[[str], None] | None, on_thinking: Callable[[str], None] | None):
        self.on_text = on_text
        self.on_thinking = on_thinking
        self.reset()

    def reset(self) -> None:
        """Forget what a failed try gathered: the request is asked again from the start."""
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.prompt_tokens: int | None = None
        self.reply_tokens: int | None = None
        self.done_reason: str | None = None
        # Whether a piece reached a watcher: from then on a retry would show it twice.
        self.streamed = False
        self.finished = False  # the server said the reply is whole

    # --- what the server sends --------------------------------------------------------

    def text(self, piece: str) -> None:
        self.content.append(piece)
        self._show(self.on_text, piece)

    def thought(self, piece: str) -> None:
        self.thinking.append(piece)
        self._show(self.on_thinking, piece)

    def call(self, index: int, *, id: str | None = None, name: str | None = None,
             arguments: Mapping[str, Any] | str | None = None) -> None:
        """A tool call, or a piece of one: a call's first piece carries its name (and id),
        its arguments come whole as an object or as fragments of a JSON text."""
        call = self.calls.setdefault(index, _Call())
        if id:
            call.id = id
        if name and not call.name:
            # The name comes whole in the call's first piece; a server that repeats it does
            # not make it longer.
            call.name = name
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, Mapping):  # a server that sends the object itself
            call.arguments.append(json.dumps(arguments))

    def whole_call(self, name: str, arguments: Mapping[str, Any] | str) -> None:
        """A call that came whole in one piece (Ollama's): the next in order."""
        self.call(max(self.calls, default=-1) + 1, name=name, arguments=arguments)

    def counts(self, prompt_tokens: int | None, reply_tokens: int | None) -> None:
        """The server's own token counts for the request: they calibrate compaction."""
        self.prompt_tokens, self.reply_tokens = prompt_tokens, reply_tokens

    def finish(self, reason: str | None) -> None:
        """The server said the reply is whole (and why it stopped, when it said)."""
        self.finished = True
        self.done_reason = reason

    def _show(self, callback: Callable[[str], None] | None, piece: str) -> None:
        if callback is None:
            return
        self.streamed = True
        try:
            callback(piece)
        except Exception:
            # A view never breaks the work (ARCHITECTURE rule 5).
            log.exception("a streaming callback failed; the reply goes on")

    # --- the reply ----------------------------------------------------------------------

    def reply(self) -> Reply:
        return Reply(
            content="".join(self.content),
            thinking="".join(self.thinking),
            tool_calls=[_tool_call(self.calls[i]) for i in sorted(self.calls)],
            prompt_eval_count=self.prompt_tokens,
            eval_count=self.reply_tokens,
            done_reason=self.done_reason,
        )


def _tool_call(call: _Call) -> ToolCall:
    text = "".join(call.arguments)
    try:
        parsed = bounded_json(text) if text.strip() else {}
    except ValueError:
        parsed = None
    # Not an object: kept as the model's string; vmagent.tools answers it with an error line.
    return ToolCall(id=call.id, name=call.name, arguments=parsed if isinstance(parsed, dict) else text)
