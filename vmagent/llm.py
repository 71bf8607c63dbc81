"""The model client: streaming chat with tools on Ollama, through the official `ollama` package.

Messages are Ollama's own dicts: {"role", "content", "images"?, "tool_calls"?, "tool_name"?}.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping

import httpx
import ollama
from pydantic import BaseModel, Field, ValidationError

from .config import AgentConfig

log = logging.getLogger(__name__)

SCREENSHOT_DROPPED = "[screenshot dropped]"
# Seconds to open a connection to Ollama; it answers locally or on a LAN in milliseconds.
CONNECT_TIMEOUT_S = 10.0


class OllamaError(RuntimeError):
    """Ollama could not give a reply; the message says what happened and what to do."""

    def __init__(self, message: str, *, status: int | None = None, streamed: bool = False):
        super().__init__(message)
        self.status = status
        # True when part of the reply had already reached the watcher before the failure.
        self.streamed = streamed


class ToolCall(BaseModel):
    name: str
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

    def as_message(self) -> dict[str, Any]:
        """The assistant message for the history. Thinking is shown, never carried forward."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"function": {"name": call.name, "arguments": call.arguments}} for call in self.tool_calls
            ]
        return message


class _Retryable(Exception):
    """A failure worth another try if nothing has been shown yet."""

    def __init__(self, cause: str, status: int | None = None):
        super().__init__(cause)
        self.cause = cause
        self.status = status


class LLM:
    def __init__(self, config: AgentConfig, client: ollama.Client | None = None):
        self.config = config
        self.host = config.ollama_host
        self.model = config.model
        # A host that drops packets should fail in seconds, not after request_timeout_s,
        # which is sized for a long prompt evaluation before the first chunk.
        timeout = httpx.Timeout(config.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        self.client = client or ollama.Client(host=config.ollama_host, timeout=timeout)
        self._capabilities: list[str] | None = None

    # --- what the model can do --------------------------------------------------------

    def capabilities(self) -> list[str]:
        """The model's capabilities from /api/show, asked once per client."""
        if self._capabilities is None:
            shown = self._with_retries(lambda: self._show(), what="asking for the model's capabilities")
            self._capabilities = list(shown.capabilities or [])
        return self._capabilities

    def sees_images(self) -> bool:
        """Whether the model takes images: Ollama drops them, silently, for one that does not."""
        return "vision" in self.capabilities()

    def supports_thinking(self) -> bool:
        return "thinking" in self.capabilities()

    def _show(self) -> ollama.ShowResponse:
        try:
            return self.client.show(self.model)
        except Exception as e:
            raise self._classify(e, streamed=False) from None

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
    ) -> Reply:
        """One streamed reply. `think=None` follows the config; `max_tokens` caps the reply length.

        Retries connection errors and 5xx only while nothing has been streamed: a retry
        after text was shown would show it twice. Raises OllamaError otherwise.
        """
        think_value = self._think_to_send(think)
        options: dict[str, Any] = {"num_ctx": self.config.num_ctx}
        if max_tokens is not None:
            options["num_predict"] = max_tokens
        wire = wire_messages(messages, self.config.keep_images)
        state = _StreamState(on_text, on_thinking)

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
                for chunk in stream:
                    state.take(chunk)
            except Exception as e:
                raise self._classify(e, streamed=state.streamed) from None
            if not state.done:
                failure = "the stream ended before Ollama said it was done"
                if state.streamed:
                    raise self._error_after_streaming(failure)
                raise _Retryable(failure)
            return state.reply()

        return self._with_retries(attempt, what="chatting")

    # --- failures ---------------------------------------------------------------------

    def _with_retries(self, attempt: Callable[[], Any], what: str) -> Any:
        tries = self.config.retries + 1
        last: _Retryable | None = None
        for n in range(tries):
            if n:
                delay = self.config.retry_backoff_s * 2 ** (n - 1)
                log.warning("Ollama at %s failed (%s); try %d of %d in %.1f s", self.host, last.cause, n + 1, tries, delay)
                time.sleep(delay)
            try:
                return attempt()
            except _Retryable as e:
                last = e
        assert last is not None
        if last.status is None:
            raise OllamaError(
                f"Could not reach Ollama at {self.host} for model {self.model} while {what} "
                f"({last.cause}; {tries} tries). Check that Ollama is running there and that "
                f"OLLAMA_HOST points at it."
            )
        if last.status == 429:
            raise OllamaError(
                f"Ollama at {self.host} stayed busy with model {self.model} while {what} ({last.cause}; "
                f"{tries} tries with backoff): its request queue is full. Retry when it is less busy, "
                f"or raise OLLAMA_NUM_PARALLEL or OLLAMA_MAX_QUEUE on the server.",
                status=429,
            )
        raise OllamaError(
            f"Ollama at {self.host} failed with model {self.model} while {what} ({last.cause}; "
            f"{tries} tries). Check the Ollama server's log (out of memory, a crashed runner) and retry.",
            status=last.status,
        )

    def _classify(self, e: Exception, streamed: bool) -> Exception:
        """Map a client failure to _Retryable (only before streaming) or a final OllamaError."""
        if isinstance(e, (_Retryable, OllamaError)):
            return e
        if isinstance(e, ollama.ResponseError):
            status = e.status_code
            if status == 404:
                return OllamaError(
                    f"Ollama at {self.host} has no model {self.model} ({e.error}). Run `ollama pull "
                    f"{self.model}` on that server, or set VMAGENT_MODEL to a model it has.",
                    status=status,
                )
            # status -1: an {"error": ...} line inside a 200 stream, a server-side failure.
            # 429: Ollama's request queue (OLLAMA_MAX_QUEUE) is full; busy now, not wrong.
            if status >= 500 or status == -1 or status == 429:
                cause = f"HTTP {status}: {e.error}" if status > 0 else f"error in stream: {e.error}"
                if not streamed:
                    return _Retryable(cause, status=status)
                return self._error_after_streaming(cause, status=status)
            return OllamaError(
                f"Ollama at {self.host} refused the request for model {self.model} (HTTP {status}: "
                f"{e.error}). The request or the model's settings need fixing; retrying will not help.",
                status=status,
            )
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
            return OllamaError(
                f"Ollama at {self.host} sent nothing for {self.config.request_timeout_s:g} s with model "
                f"{self.model}. The server may be overloaded or stuck; check it, or raise "
                f"request_timeout_s.",
                streamed=streamed,
            )
        # ConnectionError: what the ollama package raises when it cannot connect (non-streaming).
        if isinstance(e, (httpx.TransportError, ConnectionError, json.JSONDecodeError)):
            cause = _describe(e)
            if not streamed:
                return _Retryable(cause)
            return self._error_after_streaming(cause)
        if isinstance(e, ValidationError):
            return OllamaError(
                f"Ollama at {self.host} sent a reply from model {self.model} that the client cannot "
                f"read ({_first_line(str(e))}). Check that the server is Ollama and up to date.",
                streamed=streamed,
            )
        return OllamaError(
            f"Talking to Ollama at {self.host} with model {self.model} failed unexpectedly "
            f"({type(e).__name__}: {e}).",
            streamed=streamed,
        )

    def _error_after_streaming(self, cause: str, status: int | None = None) -> OllamaError:
        return OllamaError(
            f"Ollama at {self.host} broke off a reply from model {self.model} after part of it was "
            f"shown ({cause}). Not retried, as that would show it twice; the turn can be asked again.",
            status=status,
            streamed=True,
        )


class _StreamState:
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
        if callback is None:
            return
        self.streamed = True
        try:
            callback(piece)
        except Exception:
            # A view never breaks the work (ARCHITECTURE rule 5).
            log.exception("a streaming callback failed; the reply goes on")

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


def _describe(e: Exception) -> str:
    if type(e) is ConnectionError:
        # The ollama package replaces the cause with advice of its own; say it plainly.
        return "could not connect"
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {_first_line(text)}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


# --- messages on the wire -----------------------------------------------------------


def wire_tools(tools: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The tool schemas as the ollama client sends them: its Tool model keeps a property's
    type, items, description and enum only (bounds, defaults and a nested object's own
    properties are dropped), so this, not our schema, is what the model reads and counts."""
    return [ollama.Tool.model_validate(tool).model_dump(exclude_none=True) for tool in tools or []]


def wire_messages(messages: Iterable[Mapping[str, Any]], keep_images: int) -> list[dict[str, Any]]:
    """The history as it is sent: old screenshots dropped, tool-call arguments as objects."""
    return [_wire_message(m) for m in drop_old_images(list(messages), keep_images)]


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
            parsed = json.loads(arguments)
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
    total = sum(len(m.get("images") or []) for m in messages)
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


def image_count(messages: Iterable[Mapping[str, Any]]) -> int:
    return sum(len(m.get("images") or []) for m in messages)
