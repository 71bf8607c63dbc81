"""The model's reply: what the loop reads of it, whatever the server (vmagent/model.py), and its
accumulation from Ollama's stream (an OpenAI-compatible stream: vmagent/openai_stream.py)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import ollama
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)


class ToolCall(BaseModel):
    name: str
    # The server's id for the call (OpenAI-compatible servers): its result is sent back
    # with it as tool_call_id. Ollama has none.
    id: str | None = None
    # Ollama sends an object, but this is the model's output: treat it as untrusted,
    # possibly a JSON string. vmagent.tools parses and validates it.
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class Reply(BaseModel):
    content: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    done_reason: str | None = None

    def as_message(self, with_thinking: bool = False) -> dict[str, Any]:
        """The assistant message for the history; with its thinking when asked (the turn
        loop hands it back while its tool calls are answered: see only_latest_thinking)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if with_thinking and self.thinking.strip():
            message["thinking"] = self.thinking
        if self.tool_calls:
            message["tool_calls"] = [
                {**({"id": call.id} if call.id else {}), "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls
            ]
        return message


def show_piece(callback: Callable[[str], None] | None, piece: str) -> bool:
    """Hands a streamed piece of a reply to a watcher; True when there was one to hand it to.
    Both backends' streams show their pieces through this."""
    if callback is None:
        return False
    try:
        callback(piece)
    except Exception:
        # A view never breaks the work (ARCHITECTURE rule 5).
        log.exception("a streaming callback failed; the reply goes on")
    return True


class StreamState:
    """Accumulates one streamed reply; a failing watcher callback never breaks the stream."""

    def __init__(self, on_text: Callable[[str], None] | None, on_thinking: Callable[[str], None] | None):
        self.on_text = on_text
        self.on_thinking = on_thinking
        self.reset()

    def reset(self) -> None:
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.tool_calls: list[ToolCall] = []
        # Whether a piece reached a watcher: from then on a retry would show it twice.
        self.streamed = False
        self.done = False
        self.final: ollama.ChatResponse | None = None

    def take(self, chunk: ollama.ChatResponse) -> None:
        message = chunk.message
        if message.thinking:
            self.thinking.append(message.thinking)
            self._show(self.on_thinking, message.thinking)
        if message.content:
            self.content.append(message.content)
            self._show(self.on_text, message.content)
        for call in message.tool_calls or []:
            arguments = call.function.arguments
            self.tool_calls.append(
                ToolCall(
                    name=call.function.name,
                    arguments=dict(arguments) if isinstance(arguments, Mapping) else str(arguments),
                )
            )
        if chunk.done:
            self.done = True
            self.final = chunk

    def _show(self, callback: Callable[[str], None] | None, piece: str) -> None:
        self.streamed = show_piece(callback, piece) or self.streamed

    def reply(self) -> Reply:
        final = self.final
        return Reply(
            content="".join(self.content),
            thinking="".join(self.thinking),
            tool_calls=self.tool_calls,
            prompt_eval_count=final.prompt_eval_count if final else None,
            eval_count=final.eval_count if final else None,
            done_reason=final.done_reason if final else None,
        )
