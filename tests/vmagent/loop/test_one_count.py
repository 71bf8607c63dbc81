"""One count (issue 37 item 3): a turn is one call of the model wherever a person or the
model reads a count (the status line and its events, the report, the outcome); the calls
in the model's replies are named tool calls, and the cap is stated in turns."""

from __future__ import annotations

import json

from tests.support.loop_harness import agent_config, call, running_vmd
from tests.support.ollama_server import start_ollama
from tests.vmagent.loop.test_loop import PLAN, finish_script, run
from vmagent.loop.fallback_report import local_report
from vmagent.loop.job import Ending, Job, JobSpec
from vmagent.loop import resume_job


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _tool_calls(script) -> list[int]:
    return [len(turn.tool_calls) for turn in script]


def _status_counts(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "status" and "turns" in e]


def test_the_status_line_at_turn_n_says_n_turns_and_the_report_agrees(tmp_path):
    script = finish_script()
    per_turn = _tool_calls(script)  # 1, 2, 1, 1, 2, 1
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        events: list[dict] = []
        outcome = run(tmp_path, vmd, server, events=events)
    assert outcome.state == "done", outcome.report
    turns, tool_calls = len(server.chat_requests), sum(per_turn)  # what was really asked and made
    assert (outcome.steps, outcome.tool_calls) == (turns, tool_calls) == (6, 8)

    # The line shown at the start of turn n counts n turns and the calls of the turns before it.
    shown = _status_counts(events)
    assert [e["turns"] for e in shown] == list(range(1, turns + 1))
    for n, event in enumerate(shown, 1):
        made = sum(per_turn[:n - 1])
        assert event["tool_calls"] == made
        assert f"· {_counted(n, 'turn')}, {_counted(made, 'tool call')} ·" in event["text"], event["text"]
        assert "step" not in event["text"]

    # vmd's report states the loop's final counts, once, and says no "steps".
    report = outcome.report
    assert f"{turns} model turns, {tool_calls} tool calls (1 command run," in report, report
    assert report.count("model turns") == 1 and "step" not in report.lower(), report
    told = [e["args"] for e in vmd.record(outcome.session_id)
            if e["kind"] == "verb" and e.get("verb") == "session_status" and e["args"].get("turns") is not None]
    assert told[-1] == {"turns": turns, "tool_calls": tool_calls}


def test_the_cap_is_stated_in_turns(tmp_path):
    script = [PLAN, call("run", {"command": "echo one"}), call("run", {"command": "echo two"})]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server, config=agent_config(server, max_steps=3))
    assert outcome.state == "failed" and (outcome.steps, outcome.tool_calls) == (3, 3)
    assert "Stopped at the turn cap (3 model turns) without a finish." in outcome.report
    assert "3 model turns, 3 tool calls (2 commands run," in outcome.report, outcome.report


def test_the_counts_carry_on_across_a_question(tmp_path):
    transcript = tmp_path / "job" / "transcript.json"
    first = [PLAN, call("ask_user", {"question": "Python 2 or 3?"})]
    with running_vmd(tmp_path) as vmd:
        with start_ollama(first) as server:
            asked = run(tmp_path, vmd, server)
        assert asked.state == "question" and (asked.steps, asked.tool_calls) == (2, 2)
        rest = finish_script()[1:]
        events: list[dict] = []
        with start_ollama(rest) as server:
            done = resume_job(transcript, answer="3", on_event=events.append,
                              config=agent_config(server), vmd_socket=vmd.socket)
    assert done.state == "done", done.report
    assert (done.steps, done.tool_calls) == (2 + len(rest), 2 + sum(_tool_calls(rest)))
    assert _status_counts(events)[0]["turns"] == 3  # the first turn after the answer is the third
    assert f"{done.steps} model turns, {done.tool_calls} tool calls" in done.report, done.report


def test_the_loops_own_report_counts_turns_and_tool_calls(tmp_path):
    job = Job(spec=JobSpec(task="write hello.py"), transcript_path=tmp_path / "t.json", steps=1, tool_calls=3)
    job.notes.append("vmd went away.")
    report = local_report(job, Ending("failed", "vmd went away."), "vmd is not running")
    assert "- 1 model turn, 3 tool calls." in report and "step" not in report.lower()
    job.save()
    assert Job.load(tmp_path / "t.json").tool_calls == 3  # a resumed job counts on


def test_the_job_row_counts_as_the_loops_status_lines_and_outcome_do(tmp_path):
    from vmagent.service.config import ServiceConfig
    from vmagent.service.store import Store
    from vmagent.service.worker_process import Worker
    from vmagent.service.workers import WorkerPool

    store = Store(tmp_path / "svc")
    pool = WorkerPool(store, ServiceConfig(data_dir=tmp_path / "svc"))
    job = store.create_job(owner="alice", task="t", os="debian", project=None)
    worker = Worker(job["id"], 0, None)
    line = "ready · machine ready · 7 turns, 14 tool calls · 5 runs · 1 m 02 s"
    pool._handle_frame(worker, json.dumps({"type": "status", "text": line, "turns": 7, "tool_calls": 14}).encode())
    live = store.get_job(job["id"])
    assert (live["status_line"], live["steps"], live["tool_calls"]) == (line, 7, 14)
    pool._handle_frame(worker, b'{"type": "status", "text": "run"}')  # a verb's name: the counts stay
    assert store.get_job(job["id"])["tool_calls"] == 14
    pool._handle_frame(worker, json.dumps({"type": "done", "outcome": {"state": "done", "report": "# r",
                                                                        "steps": 8, "tool_calls": 15}}).encode())
    done = store.get_job(job["id"])
    assert (done["state"], done["steps"], done["tool_calls"]) == ("done", 8, 15)
    store.close()
