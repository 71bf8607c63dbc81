"""Why the model gave no reply: the failures every model client raises (the same for
Ollama and an OpenAI-compatible server), and the sorting of an Ollama client exception
into one worth another try (the server is away, busy or failing, and nothing was shown
yet) or a final one, with a sentence saying what to do. The OpenAI-compatible sorting is
in vmagent/openai_failures.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import ollama
from pydantic import ValidationError

from vmd.verbs import TooDeep


class ModelError(RuntimeError):
    """The model server could not give a reply; the message says what happened and what to do."""

    def __init__(self, message: str, *, status: int | None = None, streamed: bool = False):
        super().__init__(message)
        self.status = status
        # True when part of the reply had already reached the watcher before the failure.
        self.streamed = streamed


# The name the loop, compaction and the tests have always caught; every backend raises it.
OllamaError = ModelError


class ContextTooLong(ModelError):
    """The server refused the prompt as longer than the model's context (llama.cpp's
    exceed_context_size_error, vLLM's "maximum context length"): the compaction path, not
    the end of the job. `prompt_tokens` is the server's own count when it said it."""

    def __init__(self, message: str, *, status: int | None = 400, prompt_tokens: int | None = None,
                 context: int | None = None):
        super().__init__(message, status=status)
        self.prompt_tokens = prompt_tokens
        self.context = context


class ModelCancelled(Exception):
    """The job was cancelled while the model answered: the answer is not waited for."""


@dataclass
class Outage:
    """One request the model server failed and was asked again, for the report's notes."""

    cause: str  # the last failure, e.g. "could not connect", "HTTP 503: ..."
    tries: int  # tries in all, the last one included
    seconds: float  # from the first failure to the answer (or to giving up)
    back: bool  # the server answered in the end


class Retryable(Exception):
    """A failure worth another try if nothing has been shown yet."""

    def __init__(self, cause: str, status: int | None = None):
        super().__init__(cause)
        self.cause = cause
        self.status = status


@dataclass(frozen=True)
class Failures:
    """The sentences for one server and model: every one names both, so that a person
    reading a report knows which setting to look at."""

    host: str
    model: str
    request_timeout_s: float

    def classify(self, e: Exception, streamed: bool) -> Exception:
        """Map a client failure to Retryable (only before streaming) or a final OllamaError."""
        if isinstance(e, (Retryable, OllamaError, ModelCancelled)):
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
                    return Retryable(cause, status=status)
                return self.broken_off(cause, status=status)
            return OllamaError(
                f"Ollama at {self.host} refused the request for model {self.model} (HTTP {status}: "
                f"{e.error}). The request or the model's settings need fixing; retrying will not help.",
                status=status,
            )
        if isinstance(e, TooDeep):
            return OllamaError(
                f"Ollama at {self.host} sent a reply from model {self.model} whose JSON is {e} (the "
                f"client reads at most {e.limit}). Check that the server is Ollama and up to date.",
                streamed=streamed,
            )
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
            return OllamaError(
                f"Ollama at {self.host} sent nothing for {self.request_timeout_s:g} s with model "
                f"{self.model}. The server may be overloaded or stuck; check it, or raise "
                f"request_timeout_s.",
                streamed=streamed,
            )
        # ConnectionError: what the ollama package raises when it cannot connect (non-streaming).
        if isinstance(e, (httpx.TransportError, ConnectionError, json.JSONDecodeError)):
            cause = _describe(e)
            if not streamed:
                return Retryable(cause)
            return self.broken_off(cause)
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

    def gave_up(self, last: Retryable, what: str, tries: int, seconds: float) -> OllamaError:
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

    def broken_off(self, cause: str, status: int | None = None) -> OllamaError:
        """A failure after part of the reply was shown: final, as a retry would show it twice."""
        return OllamaError(
            f"Ollama at {self.host} broke off a reply from model {self.model} after part of it was "
            f"shown ({cause}). Not retried, as that would show it twice; the turn can be asked again.",
            status=status,
            streamed=True,
        )


def outage_cause(causes: list[str]) -> str:
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
