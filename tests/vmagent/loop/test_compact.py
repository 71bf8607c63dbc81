"""Compaction against a real HTTP server speaking Ollama's protocol."""

from __future__ import annotations

import base64
import json
import math

from tests.support.ollama_server import Turn, honest_prompt_tokens, start_ollama
from vmagent.loop.compact import (
    COMPACTED_HEADER,
    Calibration,
    Compactor,
    PinnedContext,
    cap_tool_result,
    estimate_tokens,
)
from vmagent.config import AgentConfig
from vmagent.models.ollama import OllamaModel as LLM

RUN_TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a shell command in the guest and return its output and exit code.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
TOOLS = [RUN_TOOL]
SYSTEM = {"role": "system", "content": "You are vmagent, working in a Linux guest. " * 60}
TASK = {"role": "user", "content": "Build a static site generator in /mnt/project and prove it works."}
PINNED = PinnedContext(
    task_list="1. [done] scaffold the package\n2. [in_progress] write the renderer\n3. [pending] add tests",
    verification="cd /mnt/project && python -m pytest -q",
)


def output(n: int, size: int) -> str:
    line = f"step {n}: building module_{n}.py ... ok (checked {n * 7} files)\n"
    body = (line * (size // len(line) + 1))[:size]
    return f"$ make step{n}\n{body}\nexit code: {n % 3}"


def step(n: int, size: int = 20_000) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": f"Now step {n}.",
            "tool_calls": [{"function": {"name": "run", "arguments": {"command": f"make step{n}"}}}],
        },
        {"role": "tool", "tool_name": "run", "content": output(n, size)},
    ]


def history(steps: int, size: int = 20_000) -> list[dict]:
    messages = [SYSTEM, TASK]
    for n in range(steps):
        messages += step(n, size)
    return messages


def summariser(reply: str = "Steps 0 to N ran make; all modules built."):
    """A script entry answering summary requests (no tools sent) and tool turns otherwise."""

    def answer(body: dict):
        if body.get("tools"):
            n = sum(1 for m in body["messages"] if m["role"] == "assistant")
            return Turn(content="", tool_calls=[{"name": "run", "arguments": {"command": f"make step{n}"}}])
        return Turn(content=reply, chunk_chars=4000)

    return answer


def make(url: str, **overrides) -> tuple[AgentConfig, LLM, Compactor]:
    config = AgentConfig(ollama_host=url, retry_backoff_s=0.0, request_timeout_s=10, **overrides)
    llm = LLM(config)
    return config, llm, Compactor(config, llm)


def summary_requests(server) -> list[dict]:
    return [b for b in server.chat_requests if not b.get("tools")]


# --- pieces ---------------------------------------------------------------------------


def test_cap_tool_result_keeps_head_and_tail_and_says_what_was_cut():
    text = "".join(f"line {i}\n" for i in range(5000))
    capped = cap_tool_result(text, 2000)
    assert len(capped) <= 2000
    assert capped.startswith("line 0\n")
    assert capped.endswith("line 4999\n")
    cut = len(text) - len(capped.replace(capped[capped.index("\n[…") : capped.index("…]\n") + 3], ""))
    assert f"[… {cut} characters cut …]" in capped
    assert cap_tool_result("short", 2000) == "short"


def test_estimate_counts_images_at_a_fixed_cost():
    text_only = [{"role": "user", "content": "x" * 4000}]
    with_images = [{"role": "user", "content": "x" * 4000, "images": [base64.b64encode(b"p" * 90_000).decode()] * 3}]
    base = estimate_tokens(text_only)
    assert 1000 <= base <= 1010
    assert estimate_tokens(with_images, image_tokens=1000) == base + 3000
    assert estimate_tokens(with_images, image_tokens=1000, keep_images=2) == base + 2000


def test_calibration_learns_the_ratio_from_prompt_eval_count():
    messages = [SYSTEM, TASK] + step(1, 8000)
    with start_ollama(["fine"]) as server:
        config, llm, _ = make(server.url)
        calibration = Calibration(chars_per_token=6.0, num_ctx=config.num_ctx)
        before = calibration.estimate(messages, TOOLS)
        reply = llm.chat(messages, tools=TOOLS)
        calibration.observe(messages, TOOLS, reply.prompt_eval_count)
    truth = reply.prompt_eval_count
    assert abs(before - truth) > 0.25 * truth, "the starting ratio was far off"
    assert abs(calibration.estimate(messages, TOOLS) - truth) < 0.05 * truth

    # A count at num_ctx means Ollama truncated the prompt: nothing to learn from it.
    ratio = calibration.chars_per_token
    calibration.observe(messages, TOOLS, config.num_ctx)
    assert calibration.chars_per_token == ratio


def test_tools_are_counted_as_ollamas_client_sends_them():
    # The client keeps a property's type, items, description and enum only. Counting our
    # full schemas (bounds, defaults, a nested object's fields) taught the calibration too
    # loose a ratio, and long prompts went past the target by a few dozen tokens.
    from vmagent import tools

    schemas = tools.schemas("linux", "working", True)
    with start_ollama(["fine"]) as server:
        _, llm, compactor = make(server.url)
        llm.chat([TASK], tools=schemas)
    sent = json.dumps(server.chat_requests[-1]["tools"], ensure_ascii=False)
    assert len(sent) < len(json.dumps(schemas, ensure_ascii=False))  # the client dropped fields
    assert compactor.estimate([], schemas) == estimate_tokens([], llm.tools_as_sent(schemas)) == \
        math.ceil(len(sent) / 4)


# --- compaction -----------------------------------------------------------------------


def test_no_compaction_below_the_target():
    messages = history(3, 2000)
    with start_ollama([]) as server:
        _, _, compactor = make(server.url)
        result, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)
    assert compacted is False and result is messages
    assert server.chat_requests == []


def test_compaction_keeps_system_task_and_tail_and_restates_the_task_list():
    messages = history(30, 5000)
    with start_ollama([summariser("Ran make for steps 0-23; every module built.")]) as server:
        config, _, compactor = make(server.url)
        assert compactor.estimate(messages, TOOLS) > compactor.target
        result, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)

    assert compacted
    assert result[0] == SYSTEM and result[1] == TASK
    note = result[2]
    assert note["role"] == "user" and note["content"].startswith(COMPACTED_HEADER)
    assert "Ran make for steps 0-23" in note["content"]
    assert PINNED.task_list in note["content"] and PINNED.verification in note["content"]
    tail = result[3:]
    assert tail == messages[-len(tail):] and len(tail) == config.keep_tail_messages
    assert compactor.estimate(result, TOOLS) <= compactor.target

    (request,) = summary_requests(server)
    assert "tools" not in request or not request["tools"]
    assert request["think"] is False, "summaries are asked without thinking"
    assert request["options"]["num_ctx"] == config.num_ctx
    assert "make step3" in request["messages"][1]["content"], "the middle was given to the summariser"
    assert TASK["content"] in request["messages"][1]["content"]
    assert compactor.history[-1].by == "model"


def test_the_tail_never_splits_a_tool_call_from_its_results():
    messages = history(20, 5000)
    # One call with three results, placed so that a cut of the last 12 lands inside it.
    messages += [
        {
            "role": "assistant",
            "content": "Three at once.",
            "tool_calls": [{"function": {"name": "run", "arguments": {"command": f"check {i}"}}} for i in range(3)],
        },
        *[{"role": "tool", "tool_name": "run", "content": f"check {i}\nexit code: 0"} for i in range(3)],
    ]
    messages += [m for n in range(90, 95) for m in step(n, 3000)]
    assert messages[-12]["role"] == "tool"
    with start_ollama([summariser()]) as server:
        _, _, compactor = make(server.url)
        result, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)
    assert compacted
    tail = result[3:]
    assert tail[0]["role"] == "assistant" and tail[0]["content"] == "Three at once."
    assert tail == messages[-len(tail):]


def test_a_failed_summary_falls_back_to_a_mechanical_transcript():
    messages = history(30, 5000)
    with start_ollama([]) as server:
        server.fail_next(20, status=500, error="runner out of memory")
        _, _, compactor = make(server.url, retries=1)
        result, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)

    assert compacted
    note = result[2]["content"]
    assert "mechanical transcript" in note
    assert "run: $ make step4" in note
    assert "exit 1" in note and "exit 2" in note
    assert PINNED.task_list in note
    assert compactor.estimate(result, TOOLS) <= compactor.target
    assert compactor.history[-1].by == "transcript"
    assert "runner out of memory" in compactor.history[-1].error


def test_an_overlong_summary_is_cut_to_fit():
    messages = history(30, 5000)
    with start_ollama([summariser("The agent did many things. " * 20_000)]) as server:
        _, _, compactor = make(server.url)
        result, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)
    assert compacted
    assert "characters cut" in result[2]["content"]
    assert PINNED.task_list in result[2]["content"]
    assert compactor.estimate(result, TOOLS) <= compactor.target


def test_a_second_compaction_resummarises_the_first_and_restates_the_current_task_list():
    first_pin = PinnedContext(task_list="1. [in_progress] old list", verification=None)
    with start_ollama(default=summariser("summary text")) as server:
        _, _, compactor = make(server.url)
        messages, _ = compactor.maybe_compact(history(30, 5000), TOOLS, first_pin)
        for n in range(30, 60):
            messages += step(n, 5000)
        messages, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)
    assert compacted
    notes = [m for m in messages if str(m.get("content", "")).startswith(COMPACTED_HEADER)]
    assert len(notes) == 1
    assert "old list" not in notes[0]["content"] and PINNED.task_list in notes[0]["content"]
    second_request = summary_requests(server)[-1]["messages"][1]["content"]
    assert "[earlier summary]\nsummary text" in second_request
    assert "old list" not in second_request


def test_a_110_message_history_with_20kb_outputs_ends_under_the_target():
    messages = history(54, 20_000)  # system + task + 108 = 110 messages, each result 20 KB
    assert len(messages) == 110
    with start_ollama([summariser(), "next"]) as server:
        _, llm, compactor = make(server.url)
        result, compacted = compactor.maybe_compact(messages, TOOLS, PINNED)
        assert compacted
        assert compactor.estimate(result, TOOLS) <= compactor.target
        llm.chat(result, tools=TOOLS)
    sent = server.chats[-1]
    assert sent.prompt_eval_count <= compactor.target, "Ollama's own count is under the target too"
    (summary_request,) = summary_requests(server)
    assert honest_prompt_tokens(summary_request) < 0.9 * compactor.config.num_ctx, "the summary request fits too"
    assert result[0] == SYSTEM and result[1] == TASK and PINNED.task_list in result[2]["content"]
    assert result[-1]["content"].endswith("exit code: 2"), "the latest result keeps its end"


def test_a_110_step_session_stays_under_the_target_at_every_step():
    """The loop's use, step by step: compact, call, learn, cap the new result."""
    with start_ollama(default=summariser()) as server:
        config, llm, compactor = make(server.url)
        messages = [SYSTEM, TASK]
        compactions = 0
        for n in range(110):
            pinned = PinnedContext(task_list=f"1. [in_progress] step {n}", verification=PINNED.verification)
            messages, compacted = compactor.maybe_compact(messages, TOOLS, pinned)
            if compacted:
                compactions += 1
                assert pinned.task_list in messages[2]["content"]
            reply = llm.chat(messages, tools=TOOLS)
            compactor.observe(messages, TOOLS, reply)
            messages.append(reply.as_message())
            messages.append(
                {"role": "tool", "tool_name": "run", "content": cap_tool_result(output(n, 20_000), config.tool_result_cap_chars)}
            )

    tool_turns = [r for r in server.chats if r.body.get("tools")]
    assert len(tool_turns) == 110
    assert compactions >= 3
    assert max(r.prompt_eval_count for r in tool_turns) <= compactor.target
    assert all(r.body["options"]["num_ctx"] == config.num_ctx for r in server.chats)
    for r in tool_turns:
        sent = r.body["messages"]
        assert sent[0]["content"] == SYSTEM["content"] and sent[1]["content"] == TASK["content"]
    assert all(r.outcome == "reply" for r in server.chats)
    assert compactor.calibration.samples > 0
