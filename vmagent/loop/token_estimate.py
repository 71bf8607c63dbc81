"""The prompt's size in tokens before it is sent: characters over a ratio, each image at a
fixed cost, the ratio learnt from what the model server counted (Ollama's
prompt_eval_count, an OpenAI-compatible server's usage.prompt_tokens) and from a prompt it
refused as longer than its context. Compaction (vmagent/loop/compact.py) keeps the estimate
under its target. The tools are counted as the server receives them: the model's backend
says how (`Model.tools_as_sent`), and the compactor hands them over in that shape."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

from vmagent.config import AgentConfig
from vmagent.models import image_count

# Characters per token before anything was measured. Qwen and Llama tokenizers give
# 3.5-4.5 on English and code; counted on the JSON of the messages (quotes, escapes,
# keys) the ratio errs towards too many tokens, the safe side.
DEFAULT_CHARS_PER_TOKEN = 4.0
# A measured ratio outside this range means the measurement is wrong (a truncated or
# cached prompt), not the tokenizer.
RATIO_BOUNDS = (1.5, 8.0)
# prompt_eval_count this close to num_ctx means Ollama truncated the prompt, so the
# count says nothing about the ratio.
TRUNCATION_SUSPECT = 0.95


def _text_chars(messages: Iterable[Mapping[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    chars = 0
    for message in messages:
        if message.get("images"):
            message = {k: v for k, v in message.items() if k != "images"}
        chars += len(json.dumps(message, ensure_ascii=False, default=str))
    if tools:
        chars += len(json.dumps(tools, ensure_ascii=False, default=str))
    return chars


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN, image_tokens: int = 1300,
                    keep_images: int | None = None) -> int:
    """Tokens the prompt will take: characters / ratio, each image at a fixed cost.
    tools: the schemas as the server receives them (Model.tools_as_sent).
    keep_images: count at most this many images (the client sends no more: max_images)."""
    images = image_count(messages)
    if keep_images is not None:
        images = min(images, keep_images)
    return math.ceil(_text_chars(messages, tools) / chars_per_token) + images * image_tokens


class Calibration:
    """Learns characters per token from the prompt_eval_count Ollama reports."""

    def __init__(
        self,
        chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
        image_tokens: int = 1300,
        keep_images: int | None = None,
        num_ctx: int | None = None,
    ):
        self.chars_per_token = chars_per_token
        self.image_tokens = image_tokens
        self.keep_images = keep_images
        self.num_ctx = num_ctx
        self.samples = 0

    @classmethod
    def from_config(cls, config: AgentConfig) -> "Calibration":
        # The history holds at most max_images (dropped in batches), and so does a request.
        return cls(image_tokens=config.image_tokens, keep_images=config.max_images, num_ctx=config.num_ctx)

    def estimate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        return estimate_tokens(
            messages,
            tools,
            chars_per_token=self.chars_per_token,
            image_tokens=self.image_tokens,
            keep_images=self.keep_images,
        )

    def observe(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prompt_eval_count: int | None
    ) -> None:
        """Learn from what Ollama counted for exactly these messages and tools."""
        if not prompt_eval_count or prompt_eval_count <= 0:
            return
        if self.num_ctx and prompt_eval_count >= TRUNCATION_SUSPECT * self.num_ctx:
            return
        images = image_count(messages)
        if self.keep_images is not None:
            images = min(images, self.keep_images)
        text_tokens = prompt_eval_count - images * self.image_tokens
        if text_tokens < 50:  # too small a prompt to measure anything
            return
        self._adopt(_text_chars(messages, tools) / text_tokens)

    def observe_refused(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        prompt_tokens: int | None, context: int | None) -> None:
        """The server refused these messages as longer than its context: the estimate was
        short. Its own count (llama.cpp and vLLM say it) is exact; without one, the prompt
        was at least `context` tokens."""
        tokens = prompt_tokens or context or self.num_ctx
        if not tokens:
            return
        images = image_count(messages)
        if self.keep_images is not None:
            images = min(images, self.keep_images)
        text_tokens = max(1, tokens - images * self.image_tokens)
        self._adopt(_text_chars(messages, tools) / text_tokens)

    def _adopt(self, ratio: float) -> None:
        measured = min(max(ratio, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
        if measured < self.chars_per_token:
            # Denser than thought: adopt at once, an underestimate overflows the context.
            self.chars_per_token = measured
        else:
            # Sparser: move slowly, one odd prompt (mostly whitespace) should not loosen it.
            self.chars_per_token = 0.7 * self.chars_per_token + 0.3 * measured
        self.samples += 1
