"""An OpenAI-compatible stream read into the loop's Reply (vmagent/reply.py).

The stream is server-sent events: `data: {chunk}` lines, a blank line after each event,
comment lines (`: ping`) to keep the connection open, and `data: [DONE]` at the end. A
chunk's `choices[0].delta` holds a piece of `content`, of `reasoning_content` (vLLM,
DeepSeek, llama.cpp; `reasoning` in newer vLLM) or of `tool_calls`; `finish_reason`
comes once, with the last delta or after it; with stream_options.include_usage a last
chunk has no choices and the `usage` of the whole request.

Tool calls arrive in pieces: the first delta of a call carries its `index`, `id` and
`function.name`, then its `function.arguments` come as fragments of a JSON text over many
chunks, and several calls may interleave, told apart by `index` alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from .openai_failures import StreamError
from .reply import Reply, ToolCall, show_piece
from vmd.verbs import bounded_json



@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIStream:
    """Accumulates one streamed reply; a failing watcher callback never breaks the stream."""

    def __init__(self, on_text: Callable[[str], None] | None, on_thinking: Callable[[str], None] | None):
        self.on_text = on_text
        self.on_thinking = on_thinking
        self.reset()

    def reset(self) -> None:
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        # Whether a piece reached a watcher: from then on a retry would show it twice.
        self.streamed = False
        self.ended = False  # [DONE] was read
        self._data: list[str] = []

    @property
    def finished(self) -> bool:
        """The server said the reply is whole: a finish_reason, or [DONE]."""
        return self.finish_reason is not None or self.ended

    # --- server-sent events -------------------------------------------------------------

    def take_line(self, line: str) -> None:
        """One line of the event stream (without its line break)."""
        if line == "":
            self._dispatch()
            return
        if line.startswith(":"):  # a comment: a keep-alive ping
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        # event:, id:, retry: carry nothing a chat completion needs.

    def close(self) -> None:
        """The response body ended: an event not followed by a blank line still counts."""
        self._dispatch()

    def _dispatch(self) -> None:
        if not self._data:
            return
        data, self._data = "\n".join(self._data), []
        if data.strip() == "[DONE]":
            self.ended = True
            return
        chunk = bounded_json(data)  # ValueError: a broken stream, sorted by the caller
        if isinstance(chunk, dict):
            self.take(chunk)

    # --- chunks -------------------------------------------------------------------------

    def take(self, chunk: dict[str, Any]) -> None:
        if chunk.get("error"):
            raise StreamError(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n=1 is asked: other choices are not ours
            delta = choice.get("delta") or {}
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thinking, str) and thinking:
                self.thinking.append(thinking)
                self._show(self.on_thinking, thinking)
            text = delta.get("content")
            if isinstance(text, str) and text:
                self.content.append(text)
                self._show(self.on_text, text)
            for piece in delta.get("tool_calls") or []:
                if isinstance(piece, dict):
                    self._take_call(piece)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _take_call(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        if not isinstance(index, int):
            # A server that leaves out the index (a whole call per delta): a new id starts a
            # call, anything else goes on the newest one.
            index = max(self.calls, default=-1) + 1 if piece.get("id") or not self.calls else max(self.calls)
        call = self.calls.setdefault(index, _Call())
        if piece.get("id"):
            call.id = str(piece["id"])
        function = piece.get("function") or {}
        if function.get("name"):
            # The name comes whole in the call's first delta; a server that repeats it does
            # not make it longer.
            call.name = str(function["name"]) if not call.name else call.name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):  # a server that sends the object itself
            call.arguments.append(json.dumps(arguments))

    def _show(self, callback: Callable[[str], None] | None, piece: str) -> None:
        self.streamed = show_piece(callback, piece) or self.streamed

    # --- the reply ----------------------------------------------------------------------

    def reply(self) -> Reply:
        usage = self.usage or {}
        return Reply(
            content="".join(self.content),
            thinking="".join(self.thinking),
            tool_calls=[self._tool_call(self.calls[i]) for i in sorted(self.calls)],
            prompt_eval_count=_count(usage.get("prompt_tokens")),
            eval_count=_count(usage.get("completion_tokens")),
            done_reason=self.finish_reason or "stop",
        )

    @staticmethod
    def _tool_call(call: _Call) -> ToolCall:
        text = "".join(call.arguments)
        try:
            parsed = bounded_json(text) if text.strip() else {}
        except ValueError:
            parsed = None
        # Not an object: kept as the model's string; vmagent.tools answers it with an error line.
        return ToolCall(id=call.id, name=call.name, arguments=parsed if isinstance(parsed, dict) else text)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None
