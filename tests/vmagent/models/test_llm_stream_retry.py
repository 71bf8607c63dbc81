"""The model server going away under a job and coming back: a stream cut mid-reply, the
port closed for a while, or for good; and the thinking handed back in the tool loop as
Ollama's tool-calling docs describe. A real vmd (stand-in machines) and the scripted
Ollama server, which can drop a connection mid-stream and stop listening on its port."""

from __future__ import annotations

import json
import time

from tests.support.loop_harness import agent_config, call, calls, running_vmd, tool_results
from tests.support.ollama_server import Turn, start_ollama
from tests.vmagent.loop.test_loop import PLAN, assert_closed_with_report, run
from vmagent.models import only_latest_thinking

WORK = calls(("write_file", {"path": "hello.py", "content": "print('hello')\n"}),
             ("run", {"command": "echo ran >> ran.txt"}), content="Writing it and running it.")
FINISH = [
    calls(("update_task", {"id": 1, "status": "done", "note": "written"}),
          ("update_task", {"id": 2, "status": "done", "note": "prints hello"})),
    call("finish", {"summary": "hello.py prints hello",
                    "verification": {"command": "python3 hello.py | grep -q hello"}}),
]


def cut(turn: Turn, after_chunks: int) -> Turn:
    return Turn(**{**turn.__dict__, "drop_after_chunks": after_chunks})


def patient(server, **overrides):
    """Retries as a real job has them, at test speed."""
    return agent_config(server, retries=50, retry_backoff_s=0.1, **overrides)


def statuses(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e.get("type") == "status"]


def test_a_stream_cut_after_the_tool_calls_but_before_done_is_asked_again_and_runs_each_call_once(tmp_path):
    # Content in 4 chunks, then the tool calls, then `done`: cut after the tool calls.
    cut_short = cut(WORK, after_chunks=5)
    with running_vmd(tmp_path) as vmd, start_ollama([PLAN, cut_short, WORK, *FINISH]) as server:
        events: list[dict] = []
        outcome = run(tmp_path, vmd, server, events=events, config=patient(server))
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert_closed_with_report(vmd, outcome)
    assert server.chats[1].outcome == "dropped after 5 chunks"
    # the same request again, from the last complete message
    assert server.chat_requests[2]["messages"] == server.chat_requests[1]["messages"]
    # the calls of the cut reply were never run: each call once
    assert (vmd.project("hello") / "ran.txt").read_text() == "ran\n"
    assert outcome.steps == 4
    assert "The model server failed once and answered again" in outcome.report
    assert any("the model server at" in t and "asking again" in t for t in statuses(events))


def test_a_model_server_down_for_seconds_then_back_is_waited_for(tmp_path):
    with start_ollama([]) as server, running_vmd(tmp_path) as vmd:
        def goes_away(body):
            server.go_away(2.0)  # Ollama stops mid-reply and is back two seconds later
            return cut(WORK, after_chunks=2)

        server.add(PLAN, goes_away, WORK, *FINISH)
        events: list[dict] = []
        outcome = run(tmp_path, vmd, server, events=events, config=patient(server))
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert (vmd.project("hello") / "ran.txt").read_text() == "ran\n"
    shown = statuses(events)
    assert any("asking again for up to 180 s" in t for t in shown), shown
    back = [t for t in shown if "answered again after" in t]
    assert back and int(back[0].split("after ")[1].split(" s")[0]) >= 2, back
    report = outcome.report
    note = next(line for line in report.splitlines() if "The model server failed once and answered again" in line)
    assert "RemoteProtocolError" in note and "then ConnectError" in note and "Connection refused" in note, note


def test_a_model_server_gone_past_the_bound_ends_the_job_failed_with_a_report(tmp_path):
    with start_ollama([]) as server, running_vmd(tmp_path) as vmd:
        def goes_away_for_good(body):
            server.go_away()
            return cut(WORK, after_chunks=1)

        server.add(PLAN, goes_away_for_good)
        started = time.monotonic()
        outcome = run(tmp_path, vmd, server, config=patient(server, model_retry_s=1.5))
        took = time.monotonic() - started
    assert outcome.state == "failed", outcome.report
    assert took < 15, f"model_retry_s is 1.5 s, the job took {took:.0f} s"
    assert_closed_with_report(vmd, outcome)  # vmd is fine: it closed the session and reported
    assert "The model could not answer: Could not reach Ollama" in outcome.report
    assert not (vmd.project("hello") / "ran.txt").exists()


def test_the_thinking_goes_back_with_its_tool_calls_and_only_the_newest(tmp_path):
    planned = Turn(thinking="Plan before the machine is up.", tool_calls=PLAN.tool_calls)
    first = Turn(thinking="Write it, then run it.", tool_calls=WORK.tool_calls)
    second = Turn(thinking="It ran; close the tasks.", tool_calls=FINISH[0].tool_calls)
    with running_vmd(tmp_path) as vmd, start_ollama([planned, first, second, FINISH[1]]) as server:
        outcome = run(tmp_path, vmd, server, config=patient(server))
    assert outcome.state == "done", outcome.report

    def assistants(n: int) -> list[dict]:
        return [m for m in server.chat_requests[n]["messages"] if m["role"] == "assistant"]

    # The plan's thinking is not sent: a user message (the machine is up) follows it, and
    # the models' templates leave out thinking before the last user message.
    assert not any("thinking" in m for m in assistants(1))
    # The tool calls' results go back with the thinking that made them...
    reply = assistants(2)[-1]
    assert reply["thinking"] == "Write it, then run it." and reply["tool_calls"]
    assert server.chat_requests[2]["messages"][-1]["role"] == "tool"
    # ...and only the newest: the older one is dropped, not carried on.
    sent = assistants(3)
    assert sent[-1]["thinking"] == "It ran; close the tasks."
    assert [m for m in sent if "thinking" in m] == [sent[-1]]
    assert "Write it, then run it." not in json.dumps(server.chat_requests[3]["messages"])
    # the transcript holds one thinking at most, too
    saved = json.loads((tmp_path / "job" / "transcript.json").read_text())["messages"]
    assert len([m for m in saved if m.get("thinking")]) <= 1


def test_only_the_newest_assistant_message_keeps_its_thinking():
    history = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "", "thinking": "old", "tool_calls": []},
        {"role": "tool", "tool_name": "run", "content": "exit 0"},
        {"role": "assistant", "content": "", "thinking": "new", "tool_calls": []},
        {"role": "tool", "tool_name": "run", "content": "exit 0"},
    ]
    kept = only_latest_thinking(history)
    assert [m.get("thinking") for m in kept] == [None, None, None, "new", None]
    assert history[1]["thinking"] == "old", "the caller's history is not changed"
    # a user message after it ends the exchange: nothing is handed back
    assert not any("thinking" in m for m in only_latest_thinking(history + [{"role": "user", "content": "go"}]))
    assert tool_results({"messages": kept}) == ["exit 0", "exit 0"]
