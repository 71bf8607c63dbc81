"""Compaction: keep a long session's prompt under a target fraction of num_ctx.

Before each model call the prompt is estimated in tokens (characters / a ratio learnt
from the server's own count: vmagent/loop/token_estimate.py). Past the target, the middle of the conversation
is summarised by the model -- or, if that call fails, written out as a mechanical
transcript -- while the system prompt and the task (byte for byte: the model server's
cache of that head holds) and a recent tail stay verbatim, and the machine's facts, the
task list and the planned verification are re-stated after the summary.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import BaseModel

from vmagent.config import AgentConfig
from vmagent.models import ContextTooLong, Model, ModelError, Reply, drop_old_images
# The estimate and its calibration live in token_estimate.py; the tests and the
# benchmarks have always imported them from here.
from vmagent.loop.token_estimate import Calibration, estimate_tokens  # noqa: F401
from vmd.contract.json_depth import loads as bounded_json

log = logging.getLogger(__name__)

# A summary shorter than this says too little to carry on with; below it the verbatim
# tail is shortened instead.
MIN_SUMMARY_TOKENS = 300
# Tool results inside the text given to the summariser are cut to this: the summary
# needs what happened, not whole logs, and the request itself must fit num_ctx.
SUMMARY_INPUT_RESULT_CHARS = 2000
# The smallest cap a tool result in the verbatim tail is cut to when the tail alone is
# too big for the target.
MIN_TAIL_RESULT_CHARS = 400

COMPACTED_HEADER = "[Earlier work, condensed by vmagent"
TASK_LIST_HEADER = "[Current task list]"
MACHINE_HEADER = "[The machine]"
VERIFICATION_HEADER = "[Planned verification]"

SUMMARY_INSTRUCTIONS = """\
You condense the working history of an autonomous coding agent so that it can carry \
on with a shorter context. Write a factual summary in plain text: what was done; which \
commands ran and their results (exit codes, key output); which files were created or \
changed (full paths); what was learnt about the machine and the project; errors met and \
how they were resolved or not; and what was in progress when the history stops. Keep \
exact paths, commands, names, versions and error messages. Do not invent anything and do \
not plan beyond what the history shows. At most {words} words."""


class PinnedContext(BaseModel):
    """What must survive every compaction, supplied by the loop from vmd's state."""

    task_list: str
    verification: str | None = None
    # The loop's word of the machine (facts, the screen's rules): a message after the
    # task, not the system prompt, so a compaction restates it.
    machine: str | None = None


@dataclass
class Compaction:
    """What one compaction did, for the log and the watcher."""

    before_tokens: int
    after_tokens: int
    summarised_messages: int
    by: str  # "model" or "transcript"
    error: str | None = None


# --- capping tool results ---------------------------------------------------------------


def cap_tool_result(text: str, cap: int) -> str:
    """Keep the head and the tail of `text` within `cap` characters, saying what was cut.

    The head shows what the command started doing, the tail how it ended (errors, exit
    summaries); the middle of a long log is the least read.
    """
    if len(text) <= cap:
        return text
    # The note's length depends on the number it carries; size it for the worst case.
    note_room = len(_cut_note(len(text)))
    keep = cap - note_room
    if keep <= 0:
        return text[: max(0, cap)]
    head_len = keep // 2
    tail_len = keep - head_len
    head = text[:head_len]
    tail = text[len(text) - tail_len :] if tail_len else ""
    # Prefer cutting at line ends when one is near, so lines are not half shown.
    nl = head.rfind("\n")
    if nl >= head_len * 0.8:
        head = head[: nl + 1]
    nl = tail.find("\n")
    if 0 <= nl <= tail_len * 0.2:
        tail = tail[nl + 1 :]
    cut = len(text) - len(head) - len(tail)
    return f"{head}{_cut_note(cut)}{tail}"


def _cut_note(cut: int) -> str:
    return f"\n[… {cut} characters cut …]\n"


# --- compacting -----------------------------------------------------------------------


class Compactor:
    def __init__(self, config: AgentConfig, llm: Model, calibration: Calibration | None = None):
        self.config = config
        self.llm = llm
        self.calibration = calibration or Calibration.from_config(config)
        self.history: list[Compaction] = []
        # A reply cut at the context's end (finish "length"): compact before the next turn.
        self.due = False
        # The context a server said it has when it refused a prompt, below what it was
        # thought to have (a server without /v1/models, num_ctx set too high).
        self.refused_at: int | None = None

    @property
    def num_ctx(self) -> int:
        """The model's context: num_ctx for Ollama (sent with every request), what the
        server says for an OpenAI-compatible one (vmagent/models/model.py)."""
        known = self.llm.context_length()
        return min(known, self.refused_at) if self.refused_at else known

    @property
    def target(self) -> int:
        return int(self.config.compact_at * self.num_ctx)

    def estimate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        return self.calibration.estimate(messages, self.llm.tools_as_sent(tools))

    def observe(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, reply: Any) -> None:
        """Feed back the prompt_eval_count of a reply (a Reply or an int) for these messages."""
        count = getattr(reply, "prompt_eval_count", reply)
        if isinstance(count, int):
            self.calibration.num_ctx = self.num_ctx
            self.calibration.observe(messages, self.llm.tools_as_sent(tools), count)
        if getattr(reply, "done_reason", None) == "length":
            self.due = True

    def ask(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, pinned: PinnedContext,
            retry_until: float | None = None) -> tuple[list[dict[str, Any]], Reply, bool]:
        """The model's reply to `messages`; a prompt the server refuses as longer than the
        context (ContextTooLong) is compacted, whatever the estimate said, and asked once
        more. Returns (messages as sent, reply, whether they were compacted here)."""
        try:
            return messages, self.llm.chat(messages, tools=tools, retry_until=retry_until), False
        except ContextTooLong as refused:
            log.warning("the server refused the prompt as too long (%s); compacting", refused)
            if refused.context and refused.context < self.num_ctx:
                self.refused_at = refused.context
            self.calibration.num_ctx = self.num_ctx
            self.calibration.observe_refused(messages, self.llm.tools_as_sent(tools), refused.prompt_tokens,
                                             refused.context)
            messages, _ = self.maybe_compact(messages, tools, pinned, force=True)
            return messages, self.llm.chat(messages, tools=tools, retry_until=retry_until), True

    def maybe_compact(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        pinned: PinnedContext,
        force: bool = False,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Compact when the estimate passes the target, or when `force`d (the server refused
        the prompt) or due (the last reply was cut at the context's end); returns
        (messages, compacted)."""
        before = self.estimate(messages, tools)
        if before <= self.target and not (force or self.due):
            return messages, False
        self.due = False

        head, body = _split_head(messages)
        tail_start = _tail_start(body, self.config.keep_tail_messages)
        tail = list(body[tail_start:])
        middle = list(body[:tail_start])
        tail, middle, room = self._fit_tail(head, tail, middle, tools, pinned)

        # The prompt is evaluated again from the note on anyway: old screenshots go now.
        tail = drop_old_images(tail, self.config.keep_images)
        summary, by, error = self._summarise(head, middle, room)
        note = _compaction_message(summary, len(middle), by, pinned)
        result = head + [note] + tail
        # The estimate of a cut summary can still overshoot by a little: cut again.
        for _ in range(4):
            over = self.estimate(result, tools) - self.target
            if over <= 0:
                break
            summary = _cut_to(summary, max(0, len(summary) - int((over + 20) * self.calibration.chars_per_token)))
            note = _compaction_message(summary, len(middle), by, pinned)
            result = head + [note] + tail
        after = self.estimate(result, tools)
        if after > self.target:
            log.warning(
                "after compaction the prompt is still ~%d tokens (target %d): the system prompt, "
                "task and task list alone are too big for num_ctx=%d",
                after, self.target, self.num_ctx,
            )
        self.history.append(Compaction(before, after, len(middle), by, error))
        log.info("compacted %d messages by %s: ~%d -> ~%d tokens", len(middle), by, before, after)
        return result, True

    # --- the tail -------------------------------------------------------------------

    def _fit_tail(
        self,
        head: list[dict[str, Any]],
        tail: list[dict[str, Any]],
        middle: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        pinned: PinnedContext,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """Shorten the verbatim tail until a useful summary fits; returns (tail, middle, room)."""
        wanted = max(MIN_SUMMARY_TOKENS, self.target // 5)

        def room() -> int:
            skeleton = head + [_compaction_message("", len(middle), "model", pinned)] + tail
            return self.target - self.estimate(skeleton, tools)

        cap = self.config.tool_result_cap_chars
        tail = _cap_results(tail, cap)
        # Oldest groups (a call with its results) move to the middle while more than one is left.
        while room() < wanted and _group_count(tail) > 1:
            first = _first_group_length(tail)
            middle, tail = middle + tail[:first], tail[first:]
        while room() < MIN_SUMMARY_TOKENS and cap > MIN_TAIL_RESULT_CHARS:
            cap = max(MIN_TAIL_RESULT_CHARS, cap // 2)
            tail = _cap_results(tail, cap)
        return tail, middle, max(0, min(room(), wanted))

    # --- the summary ----------------------------------------------------------------

    def _summarise(
        self, head: list[dict[str, Any]], middle: list[dict[str, Any]], room: int
    ) -> tuple[str, str, str | None]:
        """(summary text within `room` tokens, "model" | "transcript", error of the model call)."""
        room_chars = int(room * self.calibration.chars_per_token)
        if not middle:
            return "", "model", None
        try:
            text = self._ask_model(head, middle, room)
            if not text.strip():
                raise ModelError("the model returned an empty summary")
            return _cut_to(text.strip(), room_chars), "model", None
        except ModelError as e:
            log.warning("summary by the model failed (%s); using a mechanical transcript", e)
            return _cut_to(mechanical_transcript(middle), room_chars), "transcript", str(e)

    def _ask_model(self, head: list[dict[str, Any]], middle: list[dict[str, Any]], room: int) -> str:
        task = next((m.get("content") or "" for m in head if m.get("role") == "user"), "")
        instructions = SUMMARY_INSTRUCTIONS.format(words=max(50, int(room * 0.6)))
        # The request must fit num_ctx with the reply: the history is cut to what remains.
        budget_tokens = self.num_ctx - room - self.estimate(
            [{"role": "system", "content": instructions}, {"role": "user", "content": task[:4000]}]
        ) - 256
        budget_chars = max(2000, int(budget_tokens * self.calibration.chars_per_token * 0.9))
        history = render_history(middle, SUMMARY_INPUT_RESULT_CHARS)
        if len(history) > budget_chars:
            history = render_history(middle, SUMMARY_INPUT_RESULT_CHARS // 4)
        history = cap_tool_result(history, budget_chars)
        request = [
            {"role": "system", "content": instructions},
            {
                "role": "user",
                "content": f"The agent's task:\n{task[:4000]}\n\nThe history to condense:\n{history}",
            },
        ]
        reply = self.llm.chat(request, tools=None, think=False, max_tokens=max(64, room))
        return _strip_think(reply.content)


# --- pieces ---------------------------------------------------------------------------


def _split_head(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system prompt and the task up to the first user message, everything after)."""
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            return list(messages[: i + 1]), list(messages[i + 1 :])
        if message.get("role") != "system":
            break
    leading = 0
    while leading < len(messages) and messages[leading].get("role") == "system":
        leading += 1
    return list(messages[:leading]), list(messages[leading:])


def _is_compaction(message: Mapping[str, Any]) -> bool:
    return str(message.get("content") or "").startswith(COMPACTED_HEADER)


def _tail_start(body: list[dict[str, Any]], keep: int) -> int:
    start = max(0, len(body) - keep)
    # Never split a tool call from its results: start at the call.
    while start > 0 and body[start].get("role") == "tool":
        start -= 1
    # An earlier compaction note is re-summarised, never kept beside the new one.
    for i in range(len(body) - 1, start - 1, -1):
        if _is_compaction(body[i]):
            start = i + 1
            break
    return start


def _first_group_length(tail: list[dict[str, Any]]) -> int:
    n = 1
    while n < len(tail) and tail[n].get("role") == "tool":
        n += 1
    return n


def _group_count(tail: list[dict[str, Any]]) -> int:
    return sum(1 for i, m in enumerate(tail) if i == 0 or m.get("role") != "tool")


def _cap_results(messages: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, str) and len(content) > cap:
            message = {**message, "content": cap_tool_result(content, cap)}
        out.append(message)
    return out


def _cut_to(text: str, chars: int) -> str:
    return cap_tool_result(text, chars) if len(text) > chars else text


def _strip_think(text: str) -> str:
    # A reasoning model that ignores think=False may still write its thoughts inline.
    return re.sub(r"<think>.*?</think>", "", text or "", flags=re.DOTALL).strip()


def _compaction_message(summary: str, count: int, by: str, pinned: PinnedContext) -> dict[str, Any]:
    how = "summarised by the model" if by == "model" else "as a mechanical transcript (the summary call failed)"
    verification = pinned.verification or (
        "None planned yet: decide the command that proves the result before calling finish."
    )
    machine = f"{MACHINE_HEADER}\n{pinned.machine.strip()}\n\n" if pinned.machine and pinned.machine.strip() else ""
    content = (
        f"{COMPACTED_HEADER}: {count} messages {how}]\n{summary or '(nothing to add)'}\n\n"
        f"{machine}"
        f"{TASK_LIST_HEADER}\n{pinned.task_list.strip() or '(no tasks planned yet)'}\n\n"
        f"{VERIFICATION_HEADER}\n{verification.strip()}\n\n"
        "Carry on from where the history stops; the most recent messages follow verbatim."
    )
    return {"role": "user", "content": content}


def _previous_summary(message: Mapping[str, Any]) -> str:
    """The summary part of an earlier compaction note, without its stale task list."""
    content = str(message.get("content") or "")
    body = content.split("\n", 1)[1] if "\n" in content else ""
    body = body.split(f"\n\n{MACHINE_HEADER}", 1)[0]
    return body.split(f"\n\n{TASK_LIST_HEADER}", 1)[0].strip()


def render_history(messages: list[dict[str, Any]], result_chars: int) -> str:
    """The messages as readable text for the summariser, tool results cut to `result_chars`."""
    lines: list[str] = []
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        if _is_compaction(message):
            lines.append(f"[earlier summary]\n{_previous_summary(message)}")
        elif role == "assistant":
            if content.strip():
                lines.append(f"[assistant]\n{cap_tool_result(content.strip(), result_chars)}")
            for call in message.get("tool_calls") or []:
                lines.append(f"[tool call] {_describe_call(call, 1000)}")
        elif role == "tool":
            name = message.get("tool_name") or "tool"
            lines.append(f"[{name} result]\n{cap_tool_result(content, result_chars)}")
        else:
            lines.append(f"[{role}]\n{cap_tool_result(content, result_chars)}")
        if message.get("images"):
            lines.append(f"({len(message['images'])} screenshot(s) not shown)")
    return "\n\n".join(lines)


def mechanical_transcript(messages: list[dict[str, Any]]) -> str:
    """A summary without the model: calls, commands, exit codes and first lines of results."""
    lines: list[str] = []
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        if _is_compaction(message):
            lines.append("earlier: " + _first_lines(_previous_summary(message), 6, 600))
        elif role == "assistant":
            if content.strip():
                lines.append("said: " + _first_lines(content, 1, 200))
            for call in message.get("tool_calls") or []:
                lines.append("called " + _describe_call(call, 300))
        elif role == "tool":
            name = message.get("tool_name") or "tool"
            code = _exit_code(content)
            status = f" exit {code}" if code is not None else ""
            lines.append(f"  {name}{status}: {_first_lines(content, 2, 240)}")
        elif role == "user":
            lines.append("user: " + _first_lines(content, 2, 300))
    return "\n".join(lines)


def _describe_call(call: Any, limit: int) -> str:
    function = call.get("function", {}) if isinstance(call, Mapping) else {}
    name = str(function.get("name", "?"))
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = bounded_json(arguments)
        except ValueError:
            pass
    if isinstance(arguments, Mapping) and isinstance(arguments.get("command"), str):
        text = f"{name}: $ {arguments['command']}"
    elif isinstance(arguments, Mapping) and isinstance(arguments.get("path"), str):
        text = f"{name}: {arguments['path']}"
    else:
        text = f"{name}({json.dumps(arguments, ensure_ascii=False, default=str)})"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_EXIT_CODE = re.compile(r"\bexit(?:[ _]?code|[ _]status)?\b\W{0,3}(-?\d+)", re.IGNORECASE)


def _exit_code(text: str) -> int | None:
    match = _EXIT_CODE.search(text)
    return int(match.group(1)) if match else None


def _first_lines(text: str, n: int, limit: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()][:n]
    joined = " | ".join(lines)
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"
