"""The Ollama backend of the model interface (vmagent/model.py): streaming chat with tools
on Ollama's /api/chat, through the official `ollama` package.

Messages are Ollama's own dicts: {"role", "content", "images"?, "tool_calls"?, "tool_name"?,
"thinking"?}. A server that goes away is asked the same request again, within bounds
(`retries`, `model_retry_s`, the job's deadline); the outages are kept for the report.

What is sent is shaped by vmagent/wire.py, the reply is gathered by vmagent/reply.py, and
a failure is sorted and said by vmagent/llm_failures.py.
"""

from __future__ import annotations

from typing import Any, Callable

import httpx
import ollama

from .config import AgentConfig
from .depth_transport import DepthBoundTransport
from .llm_failures import (ContextTooLong, Failures, ModelCancelled, ModelError, OllamaError, Outage,
                           Retryable)
from .model import CONNECT_TIMEOUT_S, Model
from .reply import Reply, StreamState, ToolCall
from .wire import (SCREENSHOT_DROPPED, drop_images_in_batches, drop_old_images, image_count, only_latest_thinking,
                   wire_messages, wire_tools)

# The loop, compaction, the report and the tests import these from here, the one door to
# the model; they live in the modules named for them.
__all__ = [
    "LLM", "Model", "OllamaModel", "ContextTooLong", "ModelCancelled", "ModelError", "OllamaError",
    "Outage", "Reply", "ToolCall", "SCREENSHOT_DROPPED", "drop_images_in_batches", "drop_old_images",
    "image_count", "only_latest_thinking", "wire_messages", "wire_tools",
]


class OllamaModel(Model):
    def __init__(self, config: AgentConfig, client: ollama.Client | None = None):
        super().__init__(config, config.model_server())
        # A host that drops packets should fail in seconds, not after request_timeout_s,
        # which is sized for a long prompt evaluation before the first chunk.
        timeout = httpx.Timeout(config.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        # The transport measures each JSON line before the client parses it (depth_transport.py).
        self.client = client or ollama.Client(host=self.host, timeout=timeout, transport=DepthBoundTransport())
        self.failures = Failures(self.host, config.model, config.request_timeout_s)

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

    def _think_to_send(self, think: bool | None) -> bool | None:
        """What to send as `think`: nothing unless the model can think (Ollama answers 400 otherwise)."""
        wanted = self.config.think if think is None else think
        if wanted is None:
            wanted = True  # config says "use it if the model can"
        if not self.supports_thinking():
            return None
        # Sent as False too: qwen3 and others think by default when `think` is absent.
        return bool(wanted)

    # --- chat -------------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        think: bool | None = None,
        on_text: Callable[[str], None] | None = None,
        on_thinking: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        retry_until: float | None = None,
    ) -> Reply:
        """One streamed reply. `think=None` follows the config; `max_tokens` caps the reply length.

        A server that is away (connection refused or reset, a stream cut before `done`),
        busy (429) or failing (5xx) is asked the same request again, with backoff, up to
        `retries` more times and for up to `model_retry_s` from the first failure, and not
        past `retry_until` (time.monotonic(): the job's deadline). Tool calls only come out
        of a complete reply, so a retry never runs one twice. Retried only while nothing
        has been streamed: a retry after text was shown would show it twice. Raises
        OllamaError otherwise, and ModelCancelled once `abandon` was called.
        """
        think_value = self._think_to_send(think)
        options: dict[str, Any] = {"num_ctx": self.config.num_ctx}
        if max_tokens is not None:
            options["num_predict"] = max_tokens
        wire = wire_messages(messages, self.config.max_images)
        state = StreamState(on_text, on_thinking)

        def attempt() -> Reply:
            state.reset()
            try:
                stream = self.client.chat(
                    model=self.model,
                    messages=wire,
                    tools=tools or None,
                    stream=True,
                    think=think_value,
                    options=options,
                    keep_alive=self.config.keep_alive,
                )
                try:
                    for chunk in stream:
                        self._check_abandoned()
                        state.take(chunk)
                finally:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()  # ends the HTTP response too, when the stream is left early
            except Exception as e:
                raise self.failures.classify(e, streamed=state.streamed) from None
            if not state.done:
                failure = "the stream ended before Ollama said it was done"
                if state.streamed:
                    raise self.failures.broken_off(failure)
                raise Retryable(failure)
            return state.reply()

        return self._waited(lambda: self._with_retries(attempt, what="chatting", until=retry_until))


# The name the loop and the tests have used for the Ollama client.
LLM = OllamaModel
