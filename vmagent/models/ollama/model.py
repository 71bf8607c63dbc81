"""The Ollama backend of the model interface (vmagent/models/model.py): streaming chat with
tools on Ollama's /api/chat, through the official `ollama` package.

Messages are Ollama's own dicts: {"role", "content", "images"?, "tool_calls"?, "tool_name"?,
"thinking"?}. What is sent is shaped by wire.py beside this, each chunk goes into the one
accumulator (vmagent/models/stream.py), and a failure is sorted and said by failures.py.
"""

from __future__ import annotations

from typing import Any, Mapping

import httpx
import ollama

from vmagent.config import AgentConfig
from vmagent.models.model import CONNECT_TIMEOUT_S, Model
from vmagent.models.ollama.depth_transport import DepthBoundTransport
from vmagent.models.ollama.failures import OllamaFailures
from vmagent.models.ollama.wire import wire_messages, wire_tools
from vmagent.models.stream import ReplyStream


class OllamaModel(Model):
    def __init__(self, config: AgentConfig, client: ollama.Client | None = None):
        super().__init__(config, config.model_server())
        # A host that drops packets should fail in seconds, not after request_timeout_s,
        # which is sized for a long prompt evaluation before the first chunk.
        timeout = httpx.Timeout(config.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        # The transport measures each JSON line before the client parses it (depth_transport.py).
        self.client = client or ollama.Client(host=self.host, timeout=timeout, transport=DepthBoundTransport())
        self.failures = OllamaFailures(self.host, config.model, config.request_timeout_s)

    # --- what the model can do --------------------------------------------------------

    def _capabilities_now(self) -> list[str]:
        """The model's capabilities from /api/show. "vision" matters most: Ollama drops
        images, silently, for a model without it."""
        return list(self._show().capabilities or [])

    def _show(self) -> ollama.ShowResponse:
        try:
            return self.client.show(self.model)
        except Exception as e:
            raise self.failures.classify(e, streamed=False) from None

    def _think_to_send(self, wanted: bool | None) -> bool | None:
        """What to send as `think`: nothing unless the model can think (Ollama answers 400 otherwise)."""
        if wanted is None:
            wanted = True  # config says "use it if the model can"
        if not self.supports_thinking():
            return None
        # Sent as False too: qwen3 and others think by default when `think` is absent.
        return bool(wanted)

    def tools_as_sent(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return wire_tools(tools)

    # --- one try of a chat ----------------------------------------------------------------

    def _stream(self, reply: ReplyStream, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                think: bool | None, max_tokens: int | None) -> None:
        options: dict[str, Any] = {"num_ctx": self.config.num_ctx}
        if max_tokens is not None:
            options["num_predict"] = max_tokens
        stream = self.client.chat(
            model=self.model,
            messages=wire_messages(messages, self.config.max_images),
            tools=tools or None,
            stream=True,
            think=self._think_to_send(think),
            options=options,
            keep_alive=self.config.keep_alive,
        )
        try:
            for chunk in stream:
                self._check_abandoned()
                _take(reply, chunk)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # ends the HTTP response too, when the stream is left early


def _take(reply: ReplyStream, chunk: ollama.ChatResponse) -> None:
    """One chunk of Ollama's stream: a piece of thinking or text, whole tool calls, and, in
    the last one (`done`), the server's counts and why it stopped."""
    message = chunk.message
    if message.thinking:
        reply.thought(message.thinking)
    if message.content:
        reply.text(message.content)
    for call in message.tool_calls or []:
        arguments = call.function.arguments
        reply.whole_call(call.function.name, dict(arguments) if isinstance(arguments, Mapping) else str(arguments))
    if chunk.done:
        reply.counts(chunk.prompt_eval_count, chunk.eval_count)
        reply.finish(chunk.done_reason)
