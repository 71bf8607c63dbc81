"""The OpenAI-compatible backend of the model interface (vmagent/models/model.py): streamed
/v1/chat/completions over httpx, for vLLM, llama.cpp's llama-server, SGLang, LM Studio
and Ollama's own /v1.

What is sent is shaped by wire.py beside this, the stream is read by stream.py into the one
accumulator (vmagent/models/stream.py), and a failure is sorted and said by failures.py.
The capabilities come from GET /v1/models where the server says them (vLLM's
max_model_len, llama.cpp's meta.n_ctx and input modalities), else from the settings
(num_ctx, model_vision, think); a server without /v1/models (404) is used on the
settings alone. The key (VMAGENT_MODEL_KEY) goes in the Authorization header and nowhere
else: no sentence, log line or stored text holds it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from vmagent.config import AgentConfig
from vmagent.models.failures import ModelError
from vmagent.models.model import CONNECT_TIMEOUT_S, Model
from vmagent.models.openai.failures import OpenAIFailures, error_message
from vmagent.models.openai.stream import OpenAIEvents
from vmagent.models.openai.wire import openai_messages, request_body, tools_as_sent
from vmagent.models.stream import ReplyStream

# Where a /v1/models entry gives the model's context, by server: vLLM, llama.cpp, and
# the names LM Studio and others use.
CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length")


class OpenAICompatModel(Model):
    def __init__(self, config: AgentConfig, transport: httpx.BaseTransport | None = None):
        super().__init__(config, config.model_server())
        # A host that drops packets should fail in seconds, not after request_timeout_s,
        # which is sized for a long prompt evaluation before the first chunk.
        timeout = httpx.Timeout(config.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        headers = {"Accept": "text/event-stream"}
        if config.model_key is not None:
            headers["Authorization"] = f"Bearer {config.model_key.get_secret_value()}"
        self.client = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self.failures = OpenAIFailures(self.host, config.model, config.request_timeout_s)
        self._context: int | None = None

    # --- what the model can do --------------------------------------------------------

    def _capabilities_now(self) -> list[str]:
        entry = self._listed_entry()
        vision = self.config.model_vision
        if vision is None and entry is not None:
            modalities = (entry.get("architecture") or {}).get("input_modalities") or []
            vision = "image" in modalities or "multimodal" in (entry.get("capabilities") or [])
        self._context = _context_of(entry) if entry is not None else None
        # Tools: no server says; the agent needs them, and a server that cannot refuses the
        # first request with its own words. Thinking: only a switch the settings name.
        capabilities = ["completion", "tools"]
        if vision:
            capabilities.append("vision")
        if self.config.think is not None:
            capabilities.append("thinking")
        return capabilities

    def _listed_entry(self) -> dict[str, Any] | None:
        """This model's entry in GET /models; None when the server has no such list."""
        try:
            response = self.client.get(f"{self.host}/models")
        except Exception as e:
            raise self.failures.classify(e, streamed=False) from None
        if response.status_code == 404:
            return None  # no /v1/models (some servers): the settings say what the model can do
        if response.status_code >= 400:
            raise self.failures.refused(response.status_code, response.content)
        try:
            listed = [m for m in response.json().get("data") or [] if isinstance(m, dict)]
        except (ValueError, AttributeError):
            raise ModelError(f"The model server at {self.host} answered GET /models with something that is not "
                             f"a model list ({error_message(response.content)}). Check that VMAGENT_MODEL_URL is "
                             f"the base URL of an OpenAI-compatible server, ending in /v1.") from None
        for entry in listed:
            if entry.get("id") == self.model or self.model in (entry.get("aliases") or []):
                return entry
        if not listed:
            return None
        names = ", ".join(str(m.get("id")) for m in listed[:10])
        raise ModelError(f"The model server at {self.host} serves no model {self.model}; it serves {names}. "
                         f"Set VMAGENT_MODEL (or --model) to one of them.")

    def context_length(self) -> int:
        """What /v1/models said, else num_ctx: the server, not the request, sets it here."""
        self.capabilities()
        return self._context or self.config.num_ctx

    def tools_as_sent(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return tools_as_sent(tools)

    # --- one try of a chat ----------------------------------------------------------------

    def _stream(self, reply: ReplyStream, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                think: bool | None, max_tokens: int | None) -> None:
        switch = think if think is not None and self.supports_thinking() else None
        wire = openai_messages(messages, self.config.max_images, self.sees_images())
        body = request_body(self.model, wire, tools, max_tokens, switch, self.config.model_extra_body)
        events = OpenAIEvents(reply)
        try:
            with self.client.stream("POST", f"{self.host}/chat/completions", content=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json"}) as response:
                if response.status_code >= 400:
                    raise self.failures.refused(response.status_code, response.read())
                for line in response.iter_lines():
                    self._check_abandoned()
                    events.take_line(line)
                    if events.ended:
                        break
                events.close()
        except httpx.TransportError:
            # Cut after the server said the reply was whole: only the usage chunk is missing.
            if not reply.finished:
                raise


def _context_of(entry: dict[str, Any]) -> int | None:
    for key in CONTEXT_KEYS:
        if isinstance(entry.get(key), int) and entry[key] > 0:
            return entry[key]
    n_ctx = (entry.get("meta") or {}).get("n_ctx")  # llama.cpp
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None
