"""A scripted 110-step session with large outputs: the prompt sent to the model stays
under the compaction target at every step, and the task list survives every compaction.

The assertions are on what reached the (fake) Ollama server, counted the way the server
counts, not on what the loop believes it sent."""

from __future__ import annotations

import re

from tests.support.loop_harness import agent_config, call, calls, is_summary_request, running_vmd
from tests.support.ollama_server import Turn, honest_prompt_tokens, start_ollama
from vmagent.loop.compact import COMPACTED_HEADER, TASK_LIST_HEADER
from vmagent.loop import JobSpec, run_job

STEPS = 110
NUM_CTX = 16384
TITLES = ["generate the data files", "summarise the data", "write the report", "check the report"]
# Each command prints ~30 KB: five times what a tool result may keep in the history.
BIG = "python3 -c \"import sys; [print(f'row {{i}} of step {step}: ' + 'x' * 60) for i in range(400)]\""


class Model:
    """Plays the agent for 110 turns: plan, long noisy work with task updates, finish.
    Summary requests from the compactor get a short summary and are not turns."""

    def __init__(self) -> None:
        self.turn = 0
        self.summaries = 0
        # The statuses the task list must show, as the script moves it.
        self.expected = {i + 1: "[ ]" for i in range(len(TITLES))}

    def __call__(self, body: dict) -> Turn:
        if is_summary_request(body):
            self.summaries += 1
            return Turn(content=f"Summary {self.summaries}: generated rows with python3, all exit 0.")
        self.turn += 1
        step = self.turn
        if step == 1:
            return call("plan_tasks", {"tasks": TITLES})
        if step == STEPS:
            return call("finish", {"summary": "report written",
                                   "verification": {"command": "test -s report.txt"}})
        if step in (2, 30, 58, 86):  # start a task, and close the one before
            task = [2, 30, 58, 86].index(step) + 1
            pairs = [("update_task", {"id": task, "status": "in_progress"})]
            self.expected[task] = "[~]"
            if task > 1:
                pairs.insert(0, ("update_task", {"id": task - 1, "status": "done", "note": f"step {step}"}))
                self.expected[task - 1] = "[x]"
            return calls(*pairs)
        if step == STEPS - 1:
            self.expected[4] = "[x]"
            return calls(("update_task", {"id": 4, "status": "done", "note": "checked"}),
                         ("run", {"command": "echo ok > report.txt"}))
        if step % 7 == 0:
            return call("write_file", {"path": f"data/part{step}.txt", "content": ("data " * 40 + "\n") * 100})
        if step % 11 == 0:
            return call("read_file", {"path": f"data/part{7 * (step // 7)}.txt"})
        return call("run", {"command": BIG.format(step=step)}, content=f"Step {step}: more rows.")


def test_a_long_session_stays_under_the_target_and_keeps_its_task_list(tmp_path):
    model = Model()
    with running_vmd(tmp_path) as vmd, start_ollama([], default=model) as server:
        config = agent_config(server, num_ctx=NUM_CTX, max_steps=STEPS)
        outcome = run_job(JobSpec(task="Generate data and write a report about it.", project="long"),
                          on_event=lambda e: None, transcript_path=tmp_path / "t.json", config=config,
                          vmd_socket=vmd.socket)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert outcome.steps == STEPS

    target = int(config.compact_at * NUM_CTX)
    turns = [body for body in server.chat_requests if not is_summary_request(body)]
    assert len(turns) == STEPS and model.summaries >= 5

    compactions = 0
    for n, body in enumerate(turns, start=1):
        tokens = honest_prompt_tokens(body, config.image_tokens)
        assert tokens <= target, f"turn {n}: {tokens} tokens sent, target {target}"
        messages = body["messages"]
        # the system prompt and the task are never compacted
        assert messages[0]["role"] == "system" and "coding agent" in messages[0]["content"]
        assert messages[1]["content"].startswith("The task:\n\nGenerate data")
        notes = [m["content"] for m in messages if m["role"] == "user" and m["content"].startswith(COMPACTED_HEADER)]
        assert len(notes) <= 1
        if notes:
            compactions += 1
            listed = notes[0].split(TASK_LIST_HEADER, 1)[1]
            for task_id, title in enumerate(TITLES, start=1):
                assert re.search(rf"\[[ ~x]\] {task_id}\. {re.escape(title)}", listed), (n, listed)
    assert compactions >= STEPS // 2

    # the task list in the last compaction note is the list as it stood then
    last = [m["content"] for m in turns[-2]["messages"] if m["content"].startswith(COMPACTED_HEADER)][-1]
    listed = last.split(TASK_LIST_HEADER, 1)[1]
    for task_id, title in enumerate(TITLES[:3], start=1):
        assert f"[x] {task_id}. {title}" in listed
    assert f"[~] 4. {TITLES[3]}" in listed
