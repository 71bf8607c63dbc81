"""The model interface: what the turn loop, compaction and the job service call, whatever
the server speaks.

    model = open_model(config)            # OllamaModel or OpenAICompatModel, by model_api
    model.capabilities()                  # ["tools", "vision", ...], asked once
    model.context_length()                # tokens the prompt and reply share
    reply = model.chat(messages, tools)   # a Reply (vmagent/models/reply.py)

Messages and tools go in the loop's own shape (Ollama's dicts: role, content, images,
tool_calls, tool_name, thinking; tool schemas in OpenAI's function form), and a Reply
comes out; each backend translates both ways and never shows the loop a wire format. The
failures are the same for every backend (vmagent/models/failures.py): ModelError with a
sentence, ContextTooLong (the compaction path), ModelCancelled; a server that is away,
busy (429) or failing (5xx) is asked the same request again here, within bounds.

`chat` is written once, here. A backend implements it through one hook, `_stream`: send
one request and feed what the server streams into the one accumulator
(vmagent/models/stream.py `ReplyStream`); the tries, the waiting, the cancel and the
sorting of failures (the backend's `failures`) are this class's. A backend also says what
it can do (`_capabilities_now`) and how the tools reach the server (`tools_as_sent`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from vmagent.config import AgentConfig
from vmagent.models.failures import Failures, ModelCancelled, Outage, Retryable, outage_cause
from vmagent.models.reply import Reply
from vmagent.models.stream import ReplyStream

log = logging.getLogger(__name__)

# Seconds to open a connection to the model server; it answers locally or on a LAN in
# milliseconds.
CONNECT_TIMEOUT_S = 10.0
# The wait between tries grows (retry_backoff_s, doubling) up to this: a restarted server
# is seen within half a minute of coming back, and a dead one is not hammered.
RETRY_BACKOFF_MAX_S = 30.0
# The first contact (the model's capabilities, before a job opens a session) tries at most
# this many times after the first: a server that is not there at the start is a setting to
# fix (VMAGENT_MODEL_URL, OLLAMA_HOST), said at once rather than after model_retry_s.
FIRST_CONTACT_RETRIES = 3
# How often a caller waiting for a reply looks whether the job was cancelled.
ABANDON_POLL_S = 0.1


class Model:
    """One model on one server. Subclasses give `_capabilities_now`, `_stream` (one try of
    a chat) and `failures`, and may say `tools_as_sent`; the rest is shared."""

    failures: Failures

    def __init__(self, config: AgentConfig, host: str):
        self.config = config
        self.host = host
        self.model = config.model
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
        """What the model can do, in Ollama's words ("tools", "vision", "thinking"), asked
        once per client; the first contact with the server, so its failure is said at once."""
        if self._capabilities is None:
            self._capabilities = self._with_retries(self._capabilities_now, what="asking for the model's capabilities",
                                                    retries=min(self.config.retries, FIRST_CONTACT_RETRIES))
        return self._capabilities

    def _capabilities_now(self) -> list[str]:
        raise NotImplementedError

    def sees_images(self) -> bool:
        return "vision" in self.capabilities()

    def supports_thinking(self) -> bool:
        return "thinking" in self.capabilities()

    def context_length(self) -> int:
        """Tokens the prompt and the reply share: what compaction keeps the prompt under."""
        return self.config.num_ctx

    def tools_as_sent(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """The tool schemas as the server receives them: what compaction counts."""
        return list(tools or [])

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

        A server that is away (connection refused or reset, a stream cut before it was
        done), busy (429) or failing (5xx) is asked the same request again, with backoff,
        up to `retries` more times and for up to `model_retry_s` from the first failure, and
        not past `retry_until` (time.monotonic(): the job's deadline). Tool calls only come
        out of a complete reply, so a retry never runs one twice. Retried only while nothing
        has been streamed: a retry after text was shown would show it twice. Raises
        ContextTooLong for a prompt the server refused as too long, ModelError otherwise,
        and ModelCancelled once `abandon` was called.
        """
        # What is sent depends on what the model can do (thinking, images): asked once,
        # before the first try, so that a try is only the request.
        self.capabilities()
        wanted = self.config.think if think is None else think
        reply = ReplyStream(on_text, on_thinking)

        def attempt() -> Reply:
            reply.reset()
            try:
                self._stream(reply, messages, tools, wanted, max_tokens)
            except Exception as e:
                raise self.failures.classify(e, streamed=reply.streamed) from None
            if not reply.finished:
                if reply.streamed:
                    raise self.failures.broken_off(self.failures.unfinished)
                raise Retryable(self.failures.unfinished)
            return reply.reply()

        return self._waited(lambda: self._with_retries(attempt, what="chatting", until=retry_until))

    def _stream(self, reply: ReplyStream, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                think: bool | None, max_tokens: int | None) -> None:
        """One try: send the request and feed the server's stream into `reply` (calling
        `_check_abandoned` between pieces), up to the server's word that it is whole.
        `think`: the setting or the caller's wish (None: use it if the model can). Raises
        what the client raises; `failures.classify` sorts it."""
        raise NotImplementedError

    # --- waiting and retries ------------------------------------------------------------

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

        threading.Thread(target=run, name="model-chat", daemon=True).start()
        while not done.wait(ABANDON_POLL_S):
            if self._abandoned.is_set():
                raise ModelCancelled("the job was cancelled while the model answered; the answer is not waited for")
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def _check_abandoned(self) -> None:
        if self._abandoned.is_set():
            raise ModelCancelled("the job was cancelled while the model answered")

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
            log.warning("the model server at %s failed (%s); try %d in %.1f s", self.host, last.cause, tries + 1, delay)
            if self._abandoned.wait(max(0.0, delay)):
                raise ModelCancelled("the job was cancelled while the model server was away")

    def _say(self, text: str) -> None:
        if self.on_wait is not None:
            try:
                self.on_wait(text)
            except Exception:  # a view never breaks the work
                log.exception("the wait callback failed; the work goes on")

