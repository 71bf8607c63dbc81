"""Why the model gave no reply: the failures every backend raises (the same for Ollama and
an OpenAI-compatible server), and `Failures`, the sentences a backend says them in. Each
backend sorts its own client's exceptions into one worth another try (the server is away,
busy or failing, and nothing was shown yet) or a final one, with a sentence saying what
to do: vmagent/models/ollama/failures.py, vmagent/models/openai/failures.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


class ModelError(RuntimeError):
    """The model server could not give a reply; the message says what happened and what to do."""

    def __init__(self, message: str, *, status: int | None = None, streamed: bool = False):
        super().__init__(message)
        self.status = status
        # True when part of the reply had already reached the watcher before the failure.
        self.streamed = streamed


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
    reading a report knows which setting to look at. A backend says them in its own words."""

    host: str
    model: str
    request_timeout_s: float

    # The cause of a stream that ended before the server said the reply was whole.
    unfinished: ClassVar[str] = "the stream ended before the server said the reply was finished"

    def classify(self, e: Exception, streamed: bool) -> Exception:
        """A client failure as Retryable (only before anything was streamed) or a final ModelError."""
        raise NotImplementedError

    def gave_up(self, last: Retryable, what: str, tries: int, seconds: float) -> ModelError:
        """The last Retryable of a request asked again until the bounds ran out."""
        raise NotImplementedError

    def broken_off(self, cause: str, status: int | None = None) -> ModelError:
        """A failure after part of the reply was shown: final, as a retry would show it twice."""
        raise NotImplementedError


def outage_cause(causes: list[str]) -> str:
    """The first failure, and the last when it differs: "stream cut, then connection refused"."""
    first, last = first_line(causes[0])[:200], first_line(causes[-1])[:200]
    return first if first == last else f"{first}, then {last}"


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
