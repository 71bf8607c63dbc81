"""The model's reply: what the loop reads of it, whatever the server (vmagent/models/model.py).
It is gathered from the server's stream by vmagent/models/stream.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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
