"""An OpenAI-compatible stream read into the one accumulator (vmagent/models/stream.py).

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

from typing import Any

from vmagent.models.openai.failures import StreamError
from vmagent.models.stream import ReplyStream
from vmd.contract.json_depth import loads as bounded_json


class OpenAIEvents:
    """Reads one reply's event stream, line by line, into `reply`."""

    def __init__(self, reply: ReplyStream):
        self.reply = reply
        self.ended = False  # [DONE] was read
        self._data: list[str] = []

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
            self.reply.finish(self.reply.done_reason or "stop")
            return
        chunk = bounded_json(data)  # ValueError: a broken stream, sorted by the caller
        if isinstance(chunk, dict):
            self.take(chunk)

    # --- chunks -------------------------------------------------------------------------

    def take(self, chunk: dict[str, Any]) -> None:
        if chunk.get("error"):
            raise StreamError(chunk)
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
            self.reply.counts(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n=1 is asked: other choices are not ours
            delta = choice.get("delta") or {}
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thinking, str) and thinking:
                self.reply.thought(thinking)
            text = delta.get("content")
            if isinstance(text, str) and text:
                self.reply.text(text)
            for piece in delta.get("tool_calls") or []:
                if isinstance(piece, dict):
                    self._take_call(piece)
            if choice.get("finish_reason"):
                self.reply.finish(str(choice["finish_reason"]))

    def _take_call(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        calls = self.reply.calls
        if not isinstance(index, int):
            # A server that leaves out the index (a whole call per delta): a new id starts a
            # call, anything else goes on the newest one.
            index = max(calls, default=-1) + 1 if piece.get("id") or not calls else max(calls)
        function = piece.get("function") or {}
        arguments = function.get("arguments")
        self.reply.call(index, id=str(piece["id"]) if piece.get("id") else None,
                        name=str(function["name"]) if function.get("name") else None,
                        arguments=arguments if isinstance(arguments, (str, dict)) else None)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None
