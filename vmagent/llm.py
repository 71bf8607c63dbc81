"""The model client: streaming chat with tools on Ollama, through the official `ollama` package.

Messages are Ollama's own dicts: {"role", "content", "images"?, "tool_calls"?, "tool_name"?,
"thinking"?}. A server that goes away is asked the same request again, within bounds
(`retries`, `model_retry_s`, the job's deadline); the outages are kept for the report.

What is sent is shaped by vmagent/wire.py, the reply is gathered by vmagent/reply.py, and
a failure is sorted and said by vmagent/llm_failures.py.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import httpx
import ollama

from .config import AgentConfig
from .llm_failures import Failures, ModelCancelled, OllamaError, Outage, Retryable, outage_cause
from .reply import Reply, StreamState, ToolCall
from .wire import (SCREENSHOT_DROPPED, drop_images_in_batches, drop_old_images, image_count, only_latest_thinking,
                   wire_messages, wire_tools)

# The loop, compaction, the report and the tests import these from here, the one door to
# the model; they live in the modules named for them.
__all__ = [
    "LLM", "ModelCancelled", "OllamaError", "Outage", "Reply", "ToolCall", "SCREENSHOT_DROPPED",
    "drop_images_in_batches", "drop_old_images", "image_count", "only_latest_thinking", "wire_messages",
    "wire_tools",
]

log = logging.getLogger(__name__)

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


class LLM:
    def __init__(self, config: AgentConfig, client: ollama.Client | None = None):
        self.config = config
        self.host = config.ollama_host
        self.model = config.model
        # A host that drops packets should fail in seconds, not after request_timeout_s,
        # which is sized for a long prompt evaluation before the first chunk.
        timeout = httpx.Timeout(config.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        self.client = client or ollama.Client(host=config.ollama_host, timeout=timeout)
        self.failures = Failures(config.ollama_host, config.model, config.request_timeout_s)
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
                        if self._abandoned.is_set():
                            raise ModelCancelled("the job was cancelled while the model answered")
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

    # --- retries ----------------------------------------------------------------------

    def _with_retries(self, attempt: Callable[[], Any], what: str, *, retries: int | None = None,
                      until: float | None = None) -> Any:
        """attempt(), asked again on a Retryable: at most `retries` more times (the
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
            except Retryable as e:
                last = e
                causes = [*causes, e.cause] if first_failure is not None else [e.cause]
            else:
                if first_failure is not None:
                    away = time.monotonic() - first_failure
                    self.outages.append(Outage(outage_cause(causes), tries, away, back=True))
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
                self.outages.append(Outage(outage_cause(causes), tries, now - first_failure, back=False))
                raise self.failures.gave_up(last, what, tries, now - first_failure)
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
