"""An Ollama client exception sorted into the failures every backend raises
(vmagent/models/failures.py): one worth another try (the server is away, busy or failing,
and nothing was shown yet) or a final one, with a sentence that names Ollama, the server
and the model and says what to do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import httpx
import ollama
from pydantic import ValidationError

from vmagent.models.failures import Failures, ModelCancelled, ModelError, Retryable, first_line
from vmd.contract.json_depth import TooDeep


@dataclass(frozen=True)
class OllamaFailures(Failures):
    unfinished: ClassVar[str] = "the stream ended before Ollama said it was done"

    def classify(self, e: Exception, streamed: bool) -> Exception:
        """Map a client failure to Retryable (only before streaming) or a final ModelError."""
        if isinstance(e, (Retryable, ModelError, ModelCancelled)):
            return e
        if isinstance(e, ollama.ResponseError):
            status = e.status_code
            if status == 404:
                return ModelError(
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
            return ModelError(
                f"Ollama at {self.host} refused the request for model {self.model} (HTTP {status}: "
                f"{e.error}). The request or the model's settings need fixing; retrying will not help.",
                status=status,
            )
        if isinstance(e, TooDeep):
            return ModelError(
                f"Ollama at {self.host} sent a reply from model {self.model} whose JSON is {e} (the "
                f"client reads at most {e.limit}). Check that the server is Ollama and up to date.",
                streamed=streamed,
            )
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
            return ModelError(
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
            return ModelError(
                f"Ollama at {self.host} sent a reply from model {self.model} that the client cannot "
                f"read ({first_line(str(e))}). Check that the server is Ollama and up to date.",
                streamed=streamed,
            )
        return ModelError(
            f"Talking to Ollama at {self.host} with model {self.model} failed unexpectedly "
            f"({type(e).__name__}: {e}).",
            streamed=streamed,
        )

    def gave_up(self, last: Retryable, what: str, tries: int, seconds: float) -> ModelError:
        spent = f"{tries} tries in {seconds:.0f} s"
        if last.status is None:
            return ModelError(
                f"Could not reach Ollama at {self.host} for model {self.model} while {what} "
                f"({last.cause}; {spent}). Check that Ollama is running there and that "
                f"OLLAMA_HOST points at it."
            )
        if last.status == 429:
            return ModelError(
                f"Ollama at {self.host} stayed busy with model {self.model} while {what} ({last.cause}; "
                f"{spent} with backoff): its request queue is full. Retry when it is less busy, "
                f"or raise OLLAMA_NUM_PARALLEL or OLLAMA_MAX_QUEUE on the server.",
                status=429,
            )
        return ModelError(
            f"Ollama at {self.host} failed with model {self.model} while {what} ({last.cause}; "
            f"{spent}). Check the Ollama server's log (out of memory, a crashed runner) and retry.",
            status=last.status,
        )

    def broken_off(self, cause: str, status: int | None = None) -> ModelError:
        return ModelError(
            f"Ollama at {self.host} broke off a reply from model {self.model} after part of it was "
            f"shown ({cause}). Not retried, as that would show it twice; the turn can be asked again.",
            status=status,
            streamed=True,
        )


def _describe(e: Exception) -> str:
    if type(e) is ConnectionError:
        # The ollama package replaces the cause with advice of its own; say it plainly.
        return "could not connect"
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {first_line(text)}"
