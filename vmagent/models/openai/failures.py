"""Why an OpenAI-compatible server gave no reply: its HTTP statuses, error bodies and
broken streams sorted into the failures every backend raises (vmagent/models/failures.py),
each with a sentence that names the server and the model and says what to do.

Error bodies differ by server; the message is read from each one's shape:
  OpenAI, llama.cpp:  {"error": {"message", "type", "code", ...}}
  vLLM, SGLang:       {"object": "error", "message", "type", "code"} (newer vLLM as OpenAI)
  LM Studio, Ollama:  {"error": "text"} or {"error": {"message"}}
A prompt longer than the model's context is refused with 400 and is the compaction path
(ContextTooLong), never the end of a job: llama.cpp says exceed_context_size_error with
n_prompt_tokens, vLLM "This model's maximum context length is N tokens. However, you
requested M tokens", SGLang "The input (M tokens) is longer than the model's context
length (N tokens)", OpenAI code context_length_exceeded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from vmagent.models.failures import ContextTooLong, Failures, ModelCancelled, ModelError, Retryable, first_line
from vmd.contract.json_depth import loads as bounded_json

# How much of a server's error message a sentence quotes.
MESSAGE_CHARS = 300

_CONTEXT_WORDS = re.compile(r"context (length|size|window)|maximum context|too many tokens", re.I)
_REQUESTED = re.compile(r"(?:requested|input \(|request \()\s*(\d+) tokens", re.I)
# vLLM: "maximum context length is 32768 tokens"; SGLang: "context length (32768 tokens)".
_CONTEXT = re.compile(r"(?:maximum context length is|context length \()\s*(\d+) tokens", re.I)


class StreamError(Exception):
    """An error object inside a 200 stream (`data: {"error": ...}`): the server failed
    after it had started answering."""

    def __init__(self, body: Any):
        super().__init__(error_message(body))
        self.body = body


def error_message(body: Any) -> str:
    """The server's own words from an error body (parsed or raw text)."""
    if isinstance(body, (bytes, str)):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            body = bounded_json(text)
        except ValueError:
            return first_line(text)[:MESSAGE_CHARS] or "no message"
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str) and error[key].strip():
                    return first_line(error[key])[:MESSAGE_CHARS]
        elif isinstance(error, str) and error.strip():
            return first_line(error)[:MESSAGE_CHARS]
        if isinstance(body.get("detail"), str):  # FastAPI's own shape
            return first_line(body["detail"])[:MESSAGE_CHARS]
    return first_line(json.dumps(body))[:MESSAGE_CHARS]


def context_refusal(body: Any, message: str) -> tuple[bool, int | None, int | None]:
    """(whether the server refused a prompt as too long, its prompt tokens, its context)."""
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict):
        kind = f"{error.get('type', '')} {error.get('code', '')}"
        if "exceed_context_size" in kind or "context_length_exceeded" in kind:
            return True, _int(error.get("n_prompt_tokens")), _int(error.get("n_ctx"))
    if _CONTEXT_WORDS.search(message):
        found, context = _REQUESTED.search(message), _CONTEXT.search(message)
        return True, int(found.group(1)) if found else None, int(context.group(1)) if context else None
    return False, None, None


@dataclass(frozen=True)
class OpenAIFailures(Failures):
    """The sentences for one OpenAI-compatible server (host: its base URL) and model."""

    def refused(self, status: int, raw: bytes | str) -> Exception:
        """A non-2xx answer to a request: Retryable (429, 5xx) or a final error."""
        body = _parsed(raw)
        message = error_message(body)
        if status == 400:
            too_long, tokens, context = context_refusal(body, message)
            if too_long:
                return ContextTooLong(
                    f"The model server at {self.host} refused a prompt longer than model {self.model}'s "
                    f"context ({message}).", prompt_tokens=tokens, context=context)
        if status in (401, 403):
            return ModelError(
                f"The model server at {self.host} refused the key for model {self.model} (HTTP {status}: "
                f"{message}). Set VMAGENT_MODEL_KEY to a key it accepts (or leave it unset for a "
                f"server without keys).", status=status)
        if status == 404:
            return ModelError(
                f"The model server at {self.host} has no model {self.model} (HTTP 404: {message}). Set "
                f"VMAGENT_MODEL (or --model) to a model it serves (GET {self.host}/models lists them), and "
                f"check that VMAGENT_MODEL_URL is its base URL, ending in /v1.", status=status)
        if status == 429 or status >= 500:
            return Retryable(f"HTTP {status}: {message}", status=status)
        return ModelError(
            f"The model server at {self.host} refused the request for model {self.model} (HTTP {status}: "
            f"{message}). The request or the server's settings need fixing; retrying will not help.",
            status=status)

    def classify(self, e: Exception, streamed: bool) -> Exception:
        if isinstance(e, (Retryable, ModelError, ModelCancelled)):
            return e
        if isinstance(e, StreamError):
            too_long, tokens, context = context_refusal(e.body, str(e))
            if too_long and not streamed:
                return ContextTooLong(f"The model server at {self.host} refused a prompt longer than model "
                                      f"{self.model}'s context ({e}).", prompt_tokens=tokens, context=context)
            cause = f"error in stream: {e}"
            return self.broken_off(cause) if streamed else Retryable(cause)
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
            return ModelError(
                f"The model server at {self.host} sent nothing for {self.request_timeout_s:g} s with model "
                f"{self.model}. It may be overloaded or stuck; check it, or raise request_timeout_s.",
                streamed=streamed)
        if isinstance(e, (httpx.TransportError, ValueError)):  # ValueError: a chunk that is not JSON
            cause = f"{type(e).__name__}: {first_line(str(e)) or 'no detail'}"
            if isinstance(e, httpx.ConnectError):
                cause = "could not connect"
            return self.broken_off(cause) if streamed else Retryable(cause)
        return ModelError(
            f"Talking to the model server at {self.host} with model {self.model} failed unexpectedly "
            f"({type(e).__name__}: {e}).", streamed=streamed)

    def gave_up(self, last: Retryable, what: str, tries: int, seconds: float) -> ModelError:
        spent = f"{tries} tries in {seconds:.0f} s"
        if last.status is None:
            return ModelError(
                f"Could not reach the model server at {self.host} for model {self.model} while {what} "
                f"({last.cause}; {spent}). Check that it is running there and that VMAGENT_MODEL_URL is "
                f"its base URL, ending in /v1.")
        if last.status == 429:
            return ModelError(
                f"The model server at {self.host} stayed busy with model {self.model} while {what} "
                f"({last.cause}; {spent} with backoff). Retry when it is less busy, or give it more "
                f"parallel slots.", status=429)
        return ModelError(
            f"The model server at {self.host} failed with model {self.model} while {what} ({last.cause}; "
            f"{spent}). Check the server's log (out of memory, a crashed worker) and retry.", status=last.status)

    def broken_off(self, cause: str, status: int | None = None) -> ModelError:
        return ModelError(
            f"The model server at {self.host} broke off a reply from model {self.model} after part of it "
            f"was shown ({cause}). Not retried, as that would show it twice; the turn can be asked again.",
            status=status, streamed=True)


def _parsed(raw: bytes | str) -> Any:
    try:
        return bounded_json(raw)
    except ValueError:
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
