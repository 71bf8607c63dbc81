"""The model client: streaming chat with tools on Ollama, through the official `ollama` package.

Messages are Ollama's own dicts: {"role", "content", "images"?, "tool_calls"?, "tool_name"?,
"thinking"?}. A server that goes away is asked the same request again, within bounds
(`retries`, `model_retry_s`, the job's deadline); the outages are kept for the report.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import httpx
import ollama
from pydantic import BaseModel, Field, ValidationError

from .config import AgentConfig

log = logging.getLogger(__name__)

SCREENSHOT_DROPPED = "[screenshot dropped]"
# Seconds to open a connection to Ollama; it answers locally or on a LAN in milliseconds.
CONNECT_TIMEOUT_S = 10.0
# The wait between tries grows (retry_backoff_s, doubling) up to this: a restarted Ollama
# is seen within half a minute of coming back, and a dead one is not hammered.
RETRY_BACKOFF_MAX_S = 30.0
# The first contact (the model's capabilities, before a job opens a session) tries at most
# this many times after the first: a server that is not there at the start is a setting to
# fix (OLLAMA_HOST), said at once rather than after model_retry_s.
FIRST_CONTACT_RETRIES = 3
# How often a caller waiting for a reply looks whether the job was cancelled.
ABANDON_POLL_S = 0.1


class OllamaError(RuntimeError):
    """Ollama could not give a reply; the message says what happened and what to do."""

    def __init__(self, message: str, *, status: int | None = None, streamed: bool = False):
        super().__init__(message)
        self.status = status
        # True when part of the reply had already reached the watcher before the failure.
        self.streamed = streamed


class ModelCancelled(Exception):
    """The job was cancelled while the model answered: the answer is not waited for."""


@dataclass
class Outage:
    """One request the model server failed and was asked again, for the report's notes."""

    cause: str  # the last failure, e.g. "could not connect", "HTTP 503: ..."
    tries: int  # tries in all, the last one included
    seconds: float  # from the first failure to the answer (or to giving up)
    back: bool  # the server answered in the end


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

    def as_message(self, with_thinking: bool = False) -> dict[str, Any]:
        """The assistant message for the history; with its thinking when asked (the turn
        loop hands it back while its tool calls are answered: see only_latest_thinking)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if with_thinking and self.thinking.strip():
            message["thinking"] = self.thinking
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
        # Told (a sentence) when the model server stops answering and when it is back.
        self.on_wait: Callable[[str], None] | None = None
        # Every request the server failed and that was asked again, for the report's notes.
        self.outages: list[Outage] = []
        self._abandoned = threading.Event()

    def abandon(self) -> None:
        """Stop waiting for the model (the job was cancelled): the chat waiting now raises
        ModelCancelled at once, and so does every later one."""
        self._abandoned.set()

    # --- what the model can do --------------------------------------------------------

    def capabilities(self) -> list[str]:
        """The model's capabilities from /api/show, asked once per client."""
        if self._capabilities is None:
            shown = self._with_retries(lambda: self._show(), what="asking for the model's capabilities",
                                       retries=min(self.config.retries, FIRST_CONTACT_RETRIES))
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
                try:
                    for chunk in stream:
                        if self._abandoned.is_set():
                            raise ModelCancelled("the job was cancelled while the model answered")
                        state.take(chunk)
                finally:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()  # ends the HTTP response too, when the stream is left early
            except Exception as e:
                raise self._classify(e, streamed=state.streamed) from None
            if not state.done:
                failure = "the stream ended before Ollama said it was done"
                if state.streamed:
                    raise self._error_after_streaming(failure)
                raise _Retryable(failure)
            return state.reply()

        return self._waited(lambda: self._with_retries(attempt, what="chatting", until=retry_until))

    def _waited(self, work: Callable[[], Reply]) -> Reply:
        """`work` in a thread of its own, so that a cancelled job need not wait for it: a
        model evaluating a long prompt sends nothing for minutes. Once abandoned, the
        thread ends with the next chunk or the next retry."""
        if self._abandoned.is_set():
            raise ModelCancelled("the job was cancelled; the model is not asked")
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["reply"] = work()
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=run, name="ollama-chat", daemon=True).start()
        while not done.wait(ABANDON_POLL_S):
            if self._abandoned.is_set():
                raise ModelCancelled("the job was cancelled while the model answered; the answer is not waited for")
        if "error" in box:
            raise box["error"]
        return box["reply"]

    # --- failures ---------------------------------------------------------------------

    def _with_retries(self, attempt: Callable[[], Any], what: str, *, retries: int | None = None,
                      until: float | None = None) -> Any:
        """attempt(), asked again on a _Retryable: at most `retries` more times (the
        config's by default), for at most model_retry_s from the first failure, never past
        `until`, waiting retry_backoff_s, doubling, up to RETRY_BACKOFF_MAX_S between tries."""
        retries = self.config.retries if retries is None else retries
        tries = 0
        first_failure: float | None = None
        give_up_at = 0.0
        causes: list[str] = []
        while True:
            tries += 1
            try:
                result = attempt()
            except _Retryable as e:
                last = e
                causes = [*causes, e.cause] if first_failure is not None else [e.cause]
            else:
                if first_failure is not None:
                    away = time.monotonic() - first_failure
                    self.outages.append(Outage(_causes(causes), tries, away, back=True))
                    self._say(f"the model server at {self.host} answered again after {away:.0f} s "
                              f"({tries} tries); the work goes on")
                return result
            now = time.monotonic()
            if first_failure is None:
                first_failure = now
                give_up_at = now + self.config.model_retry_s
                if until is not None:
                    give_up_at = min(give_up_at, until)
            if tries > retries or now >= give_up_at:
                self.outages.append(Outage(_causes(causes), tries, now - first_failure, back=False))
                raise self._gave_up(last, what, tries, now - first_failure)
            delay = min(self.config.retry_backoff_s * 2 ** (tries - 1), RETRY_BACKOFF_MAX_S, give_up_at - now)
            if tries == 1:
                self._say(f"the model server at {self.host} failed while {what} ({last.cause}); asking "
                          f"again for up to {give_up_at - now:.0f} s")
            log.warning("Ollama at %s failed (%s); try %d in %.1f s", self.host, last.cause, tries + 1, delay)
            if self._abandoned.wait(max(0.0, delay)):
                raise ModelCancelled("the job was cancelled while the model server was away")

    def _say(self, text: str) -> None:
        if self.on_wait is not None:
            try:
                self.on_wait(text)
            except Exception:  # a view never breaks the work
                log.exception("the wait callback failed; the work goes on")

    def _gave_up(self, last: "_Retryable", what: str, tries: int, seconds: float) -> OllamaError:
        spent = f"{tries} tries in {seconds:.0f} s"
        if last.status is None:
            return OllamaError(
                f"Could not reach Ollama at {self.host} for model {self.model} while {what} "
                f"({last.cause}; {spent}). Check that Ollama is running there and that "
                f"OLLAMA_HOST points at it."
            )
        if last.status == 429:
            return OllamaError(
                f"Ollama at {self.host} stayed busy with model {self.model} while {what} ({last.cause}; "
                f"{spent} with backoff): its request queue is full. Retry when it is less busy, "
                f"or raise OLLAMA_NUM_PARALLEL or OLLAMA_MAX_QUEUE on the server.",
                status=429,
            )
        return OllamaError(
            f"Ollama at {self.host} failed with model {self.model} while {what} ({last.cause}; "
            f"{spent}). Check the Ollama server's log (out of memory, a crashed runner) and retry.",
            status=last.status,
        )

    def _classify(self, e: Exception, streamed: bool) -> Exception:
        """Map a client failure to _Retryable (only before streaming) or a final OllamaError."""
        if isinstance(e, (_Retryable, OllamaError, ModelCancelled)):
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


def _causes(causes: list[str]) -> str:
    """The first failure, and the last when it differs: "stream cut, then connection refused"."""
    first, last = _first_line(causes[0])[:200], _first_line(causes[-1])[:200]
    return first if first == last else f"{first}, then {last}"


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
    """The history as it is sent: old screenshots dropped, thinking only where it belongs
    (only_latest_thinking), tool-call arguments as objects."""
    kept = only_latest_thinking(drop_old_images(list(messages), keep_images))
    return [_wire_message(m) for m in kept]


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
