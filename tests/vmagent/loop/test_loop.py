"""The turn loop against a real vmd (stand-in machine) and a real HTTP server speaking
Ollama's protocol: every way a session can end produces a report, and the guards hold."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.support.loop_harness import (agent_config, call, calls, running_vmd, sent_tool_names, tool_results,
                                        user_texts)
from tests.support.ollama_server import Turn, start_ollama, unused_port
from vmagent.config import AgentConfig
from vmagent.loop.fallback_report import verification_of
from vmagent.loop import JobSpec, Outcome, Verification, resume_job, run_job
from vmagent.tools import OFFERED_TOOLS, PLANNING_TOOLS

PLAN = call("plan_tasks", {"tasks": ["write hello.py", "check it prints hello"]}, content="Planning.")


def finish_script() -> list:
    """A short honest session: plan, work, a refused finish, recovery, an accepted finish."""
    return [
        PLAN,
        calls(("update_task", {"id": 1, "status": "in_progress"}),
              ("write_file", {"path": "hello.py", "content": "print('hello')\n"})),
        call("run", {"command": "python3 hello.py"}, content="Running it."),
        call("finish", {"summary": "done", "verification": {"command": "python3 hello.py | grep -q hello"}}),
        calls(("update_task", {"id": 1, "status": "done", "note": "ran it"}),
              ("update_task", {"id": 2, "status": "done", "note": "prints hello"})),
        call("finish", {"summary": "hello.py prints hello",
                        "verification": {"command": "python3 hello.py | grep -q hello"}}),
    ]


def run(tmp_path, vmd, server, task="write hello.py", events=None, cancel=None, config=None, **spec):
    events = [] if events is None else events
    outcome = run_job(JobSpec(task=task, project=spec.pop("project", "hello"), **spec),
                      on_event=events.append if isinstance(events, list) else events, cancel=cancel,
                      transcript_path=tmp_path / "job" / "transcript.json",
                      config=config or agent_config(server), vmd_socket=vmd.socket)
    return outcome


def assert_closed_with_report(vmd, outcome: Outcome) -> list[dict]:
    assert outcome.session_id and outcome.report.startswith(f"# vmagent session {outcome.session_id}")
    assert "## How the session ended" in outcome.report
    record = vmd.record(outcome.session_id)
    assert any(e["kind"] == "close" for e in record), "session_close must run before the report"
    return record


# --- the way it should go ----------------------------------------------------------------


def test_finish_refused_while_a_task_is_open_and_the_loop_recovers(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(finish_script()) as server:
        events: list[dict] = []
        outcome = run(tmp_path, vmd, server, events=events)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert outcome.steps == 6
    record = assert_closed_with_report(vmd, outcome)
    assert "✅ verified" in outcome.report and "python3 hello.py | grep -q hello" in outcome.report
    # the refusal reached the model, and the loop carried on to an accepted finish
    after_refusal = server.chat_requests[4]
    assert any(r.startswith("REFUSED: tasks still open") for r in tool_results(after_refusal))
    assert (vmd.project("hello") / "hello.py").read_text() == "print('hello')\n"
    # what the model said beside its tool calls is in vmd's record
    notes = [e["text"] for e in record if e["kind"] == "note"]
    assert "Planning." in notes and "Running it." in notes
    types = [e["type"] for e in events]
    assert types[-2:] == ["state", "done"] and "tasks" in types and "command" in types
    assert {"type": "command", "command": "python3 hello.py"} in events
    assert {"type": "output", "stream": "stdout", "line": "hello"} in events


def work_done_script(*finishes: str) -> list:
    """Plan, write hello.py, close both tasks, then one finish per verification command."""
    return [
        PLAN,
        calls(("write_file", {"path": "hello.py", "content": "print('hello')\n"}),
              ("run", {"command": "python3 hello.py"}),
              ("update_task", {"id": 1, "status": "done", "note": "written"}),
              ("update_task", {"id": 2, "status": "done", "note": "prints hello"})),
        *[call("finish", {"summary": "hello.py prints hello", "verification": {"command": c}})
          for c in finishes],
    ]


def test_a_failed_check_is_refused_and_the_agent_goes_on_to_a_proven_finish(tmp_path):
    script = work_done_script("python3 hello.py | grep -qx goodbye")
    script += [call("run", {"command": "python3 hello.py"}, content="It prints hello, not goodbye."),
               call("finish", {"summary": "hello.py prints hello",
                               "verification": {"command": "test \"$(python3 hello.py)\" = hello"}})]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        # The guards at their tightest: a reminder every step, a notice on the second repeat.
        config = agent_config(server, stall_reminder_steps=1, repeat_notice_after=2)
        outcome = run(tmp_path, vmd, server, config=config)
    assert outcome.state == "done", outcome.report
    assert outcome.verification == Verification(passed=True, proven=True, attempts=2)
    assert outcome.verification_passed is True and outcome.steps == len(script)
    # the refusal is the finish's tool result, and the model was asked again after it
    refused = [r for r in tool_results(server.chat_requests[3]) if r.startswith("REFUSED")]
    assert refused and refused[-1].startswith("REFUSED: your verification failed")
    assert "exit 1" in refused[-1] and "grep -qx goodbye" in refused[-1]
    assert "✅ verified and proven" in outcome.report.splitlines()[2]


def test_a_check_that_proves_nothing_is_refused_once_then_the_job_ends_passed_not_proven(tmp_path):
    script = work_done_script("true", "python3 --version")
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done", outcome.report
    assert outcome.verification == Verification(passed=True, proven=False, attempts=2)
    assert outcome.verification_passed is True  # it passed; it proves nothing
    refusal = tool_results(server.chat_requests[-1])[-1]
    assert refusal.startswith("REFUSED") and "as it was before this session" in refusal
    assert "passed, not proven" in outcome.report.splitlines()[2]


def test_a_check_that_keeps_failing_ends_the_job_failed(tmp_path):
    script = work_done_script("exit 4", "python3 hello.py | grep -q bye", "test -f missing.txt")
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "failed", outcome.report
    assert outcome.verification == Verification(passed=False, proven=None, attempts=3)
    assert "vmd ended the session as failed" in outcome.report
    assert "❌ verification failed" in outcome.report.splitlines()[2]
    assert_closed_with_report(vmd, outcome)


@pytest.mark.parametrize("outcome, verification", [
    ({"status": "passed", "proven": True, "attempts": 2}, Verification(passed=True, proven=True, attempts=2)),
    ({"status": "passed_not_proven", "proven": False, "attempts": 1}, Verification(passed=True, proven=False, attempts=1)),
    # vmd could not run the check on the baseline: not proven, and not shown to prove nothing
    ({"status": "passed_not_proven", "proven": None, "attempts": 1}, Verification(passed=True, proven=None, attempts=1)),
    ({"status": "failed", "proven": None, "attempts": 3}, Verification(passed=False, proven=None, attempts=3)),
    ({"status": "unverified", "proven": None, "attempts": 2}, Verification(passed=None, proven=None, attempts=2)),
    # a vmd from before the baseline check: one run, nothing known about proof beyond "passed"
    ({"status": "failed"}, Verification(passed=False, proven=None, attempts=1)),
    ({}, Verification(passed=None, proven=None, attempts=0)),
], ids=["passed", "not-proven", "not-proven-unchecked", "failed", "unverified", "older-vmd", "empty"])
def test_vmds_report_status_becomes_the_jobs_verification(outcome, verification):
    assert verification_of(outcome) == verification


def test_the_planning_turn_offers_every_tool_says_which_wait_then_the_machine_is_handed_over(tmp_path):
    # Mask, don't remove: the tool list is the same in both phases (a changed list would
    # make the model server evaluate the whole prompt again); the opening message says
    # which tools work before the machine is up, and vmd refuses the others until the plan exists.
    with running_vmd(tmp_path) as vmd, start_ollama(finish_script()) as server:
        run(tmp_path, vmd, server)
    first, second = server.chat_requests[0], server.chat_requests[1]
    assert sent_tool_names(first) == sent_tool_names(second) == list(OFFERED_TOOLS)
    assert set(PLANNING_TOOLS) < set(OFFERED_TOOLS) and "run" in OFFERED_TOOLS and "finish" in OFFERED_TOOLS
    opening = user_texts(first)[0]
    assert "write hello.py" in opening and "plan_tasks" in opening
    working = opening.split("Until the machine is up only", 1)[1].split(" work;", 1)[0]
    assert "plan_tasks" in working and "update_task" in working and "run" not in working
    handover = user_texts(second)[-1]
    assert handover.startswith("The machine is up: it took") and "project_path" in handover
    assert "1. write hello.py" in handover
    # num_ctx is always sent; thinking never goes back to the model
    assert all(r["options"]["num_ctx"] == 32768 for r in server.chat_requests)


def test_thinking_is_shown_to_the_watcher(tmp_path):
    # What goes back to the model is tests/vmagent/models/test_llm_stream_retry.py's: only the newest
    # thinking, with its own tool calls, as Ollama's tool-calling docs describe.
    script = finish_script()
    script[1] = Turn(thinking="secret reasoning", tool_calls=script[1].tool_calls)
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        events: list[dict] = []
        run(tmp_path, vmd, server, events=events)
    assert {"type": "thinking", "text": "secret reasoning"} in events


# --- every exit produces a report --------------------------------------------------------


def test_step_cap_closes_the_session_and_reports(tmp_path):
    looping = call("run", {"command": "date +%N"})
    with running_vmd(tmp_path) as vmd, start_ollama([PLAN], default=looping) as server:
        outcome = run(tmp_path, vmd, server, config=agent_config(server, max_steps=5))
    assert outcome.state == "failed" and outcome.steps == 5
    assert_closed_with_report(vmd, outcome)
    assert "turn cap (5 model turns)" in outcome.report
    assert outcome.verification_passed is None and "not verified" in outcome.report


def test_deadline_closes_the_session_and_reports(tmp_path):
    slow = call("run", {"command": "sleep 0.4"})
    with running_vmd(tmp_path) as vmd, start_ollama([PLAN], default=slow) as server:
        outcome = run(tmp_path, vmd, server, config=agent_config(server, deadline_s=1.0))
    assert outcome.state == "failed" and 1 < outcome.steps < 10
    assert_closed_with_report(vmd, outcome)
    assert "session deadline" in outcome.report


def test_cancel_closes_the_session_and_reports(tmp_path):
    cancel = threading.Event()

    def cancelling(body):
        cancel.set()
        return call("run", {"command": "echo working > work.txt"})

    with running_vmd(tmp_path) as vmd, start_ollama([PLAN, cancelling]) as server:
        outcome = run(tmp_path, vmd, server, cancel=cancel)
    assert outcome.state == "cancelled"
    record = assert_closed_with_report(vmd, outcome)
    assert any(e["kind"] == "verb" and e.get("verb") == "session_cancel" for e in record)
    assert "Cancelled by the user" in outcome.report
    # the turn in flight finished; its work is in the project folder and was committed
    assert (vmd.project("hello") / "work.txt").read_text() == "working\n"
    close = next(e for e in record if e["kind"] == "close")
    assert close["commit"] and any("work.txt" in f for f in close["files"])


def test_a_cancel_while_the_machine_boots_ends_the_job_in_seconds(tmp_path):
    # `vmagent run`'s Ctrl-C and the eval's cancel are the loop's event only (vmd hears a
    # session_cancel, which does not end a boot): the wait for the machine in flight is
    # broken off after the cancel's grace, not waited out to the 60 s boot's end.
    cancel, cancelled_at = threading.Event(), []

    def on_event(event: dict) -> None:
        if event.get("text") == "plan made; waiting for the machine":
            def later():
                cancelled_at.append(time.monotonic())
                cancel.set()
            threading.Timer(0.5, later).start()

    with running_vmd(tmp_path, boot_seconds=60.0) as vmd, start_ollama([PLAN]) as server:
        outcome = run(tmp_path, vmd, server, events=on_event, cancel=cancel)
        ended_in = time.monotonic() - cancelled_at[0]
    assert outcome.state == "cancelled" and "Cancelled by the user" in outcome.report, outcome.report
    assert "The session ended before the machine was ready" in outcome.report, outcome.report
    assert ended_in < 15, f"the cancel took {ended_in:.0f} s"
    assert_closed_with_report(vmd, outcome)


def test_model_breaking_off_while_streaming_still_reports(tmp_path):
    long_plan = Turn(content="I will plan this carefully. " * 20,
                     tool_calls=PLAN.tool_calls)
    with running_vmd(tmp_path) as vmd, start_ollama([long_plan, long_plan, long_plan]) as server:
        for _ in range(3):
            server.drop_next(after_chunks=4)
        outcome = run(tmp_path, vmd, server, config=agent_config(server, retries=1))
    assert outcome.state == "failed"
    assert_closed_with_report(vmd, outcome)
    assert "The model could not answer" in outcome.report
    assert all(r.outcome.startswith("dropped") for r in server.chats)


def test_vmd_going_away_mid_session_still_reports(tmp_path):
    with running_vmd(tmp_path) as vmd:
        def vmd_dies(body):
            vmd.server.stop()
            return call("run", {"command": "true"})

        with start_ollama([PLAN, vmd_dies]) as server:
            outcome = run(tmp_path, vmd, server, task="survive vmd going away")
    assert outcome.state == "failed" and outcome.session_id
    assert outcome.report.startswith("# vmagent job: survive vmd going away")
    assert "vmd went away" in outcome.report and "nothing here was verified" in outcome.report
    assert "1. write hello.py" in outcome.report  # the task list as last seen


def test_machine_failing_to_start_ends_with_a_report(tmp_path):
    with running_vmd(tmp_path, fail="no image 'debian' is built") as vmd, start_ollama([PLAN]) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "failed"
    assert_closed_with_report(vmd, outcome)
    assert "The machine" in outcome.report and "no image 'debian' is built" in outcome.report


def test_malformed_tool_arguments_cost_an_error_line_not_the_session(tmp_path):
    script = [
        # Ollama's client only carries objects as arguments; inside them anything goes.
        call("plan_tasks", {"tasks": "- write hello.py\n- check it"}),
        call("run", {"command": {"argv": ["ls"]}, "timeout": "soon"}),
        call("update_task", {"id": "one", "status": "finished-ish"}),
        call("no_such_tool", {"x": 1}),
        call("write_file", {"path": "hello.py", "content": "print('hello')\n"}),
        calls(("update_task", {"id": 1, "status": "done"}), ("update_task", {"id": 2, "status": "done"}),
              ("run", {"cmd": "python3 hello.py", "extra": True})),
        # verification as a bare string where the object belongs
        call("finish", {"summary": "ok", "verification": "python3 hello.py"}),
    ]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    results = [r for body in server.chat_requests for r in tool_results(body)]
    assert any(r.startswith("ERROR: run needs") for r in results)
    assert any(r.startswith("ERROR: update_task needs") for r in results)
    assert any(r.startswith("ERROR: there is no tool named") for r in results)
    assert "`python3 hello.py`" in outcome.report


def test_a_renderer_that_raises_never_breaks_the_work(tmp_path):
    seen = []

    def broken_view(event):
        seen.append(event["type"])
        raise RuntimeError("the terminal went away")

    with running_vmd(tmp_path) as vmd, start_ollama(finish_script()) as server:
        outcome = run(tmp_path, vmd, server, events=broken_view)
    assert outcome.state == "done" and outcome.verification_passed is True
    assert "done" in seen and "output" in seen


def test_an_exception_inside_the_loop_still_closes_and_reports(tmp_path, monkeypatch):
    import vmagent.loop.turns as loop

    def crash(*a, **kw):
        raise KeyError("boom")

    with running_vmd(tmp_path) as vmd, start_ollama([PLAN, call("run", {"command": "true"})]) as server:
        monkeypatch.setattr(loop, "repeat_notice", crash)
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "failed"
    assert_closed_with_report(vmd, outcome)
    assert "internal error: KeyError" in outcome.report


# --- guards --------------------------------------------------------------------------------


def test_prose_only_replies_get_nudged_three_times_then_the_session_ends(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama([PLAN], default="I think the task is going well.") as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "failed" and outcome.steps == 5
    assert_closed_with_report(vmd, outcome)
    assert "4 times in a row without a tool call" in outcome.report
    nudges = [t for t in user_texts(server.chat_requests[-1]) if t.startswith("You replied without a tool call")]
    assert len(nudges) == 3 and all("1. write hello.py" in n for n in nudges)


def test_prose_then_back_to_work_resets_the_count(tmp_path):
    script = finish_script()
    script[2:2] = ["Let me think.", "Still thinking.", "Hmm."]
    script[6:6] = ["One more thought.", "And another."]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done", outcome.report


def test_the_same_result_three_times_gets_a_notice(tmp_path):
    same = call("run", {"command": "cat missing.txt"})
    script = [PLAN, same, same, same, call("run", {"command": "true"})]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        run(tmp_path, vmd, server, config=agent_config(server, max_steps=5))
    results = tool_results(server.chat_requests[-1])
    runs = [r for r in results if "missing.txt" in r]
    assert len(runs) == 3
    assert "same result" not in runs[0] and "same result" not in runs[1]
    assert "[vmagent: this command has given this same result 3 times" in runs[2]


def test_a_task_list_that_does_not_move_gets_a_reminder(tmp_path):
    idle = call("run", {"command": "date +%N"})
    with running_vmd(tmp_path) as vmd, start_ollama([PLAN], default=idle) as server:
        run(tmp_path, vmd, server, config=agent_config(server, max_steps=16, stall_reminder_steps=12))
    reminders = [i for i, body in enumerate(server.chat_requests)
                 if any("has not changed in 12 turns" in t for t in user_texts(body))]
    assert reminders and reminders[0] == 13
    text = next(t for t in user_texts(server.chat_requests[13]) if "has not changed" in t)
    assert "1. write hello.py" in text


# --- questions ----------------------------------------------------------------------------


def test_a_question_keeps_the_session_and_resume_carries_on(tmp_path):
    transcript = tmp_path / "job" / "transcript.json"
    first = [PLAN, call("ask_user", {"question": "Python 2 or 3?"})]
    with running_vmd(tmp_path) as vmd:
        with start_ollama(first) as server:
            events: list[dict] = []
            outcome = run(tmp_path, vmd, server, events=events)
        assert outcome.state == "question" and outcome.question == "Python 2 or 3?"
        assert {"type": "state", "state": "question", "question": "Python 2 or 3?"} in events
        record = vmd.record(outcome.session_id)
        assert not any(e["kind"] == "close" for e in record), "a waiting session is not closed"
        saved = json.loads(transcript.read_text())
        assert saved["session_id"] == outcome.session_id and saved["state"] == "question"

        rest = finish_script()[1:]
        with start_ollama(rest) as server:
            resumed = resume_job(transcript, answer="3, please", on_event=lambda e: None,
                                 config=agent_config(server), vmd_socket=vmd.socket)
        assert resumed.state == "done" and resumed.verification_passed is True, resumed.report
        assert resumed.session_id == outcome.session_id and resumed.steps == outcome.steps + len(rest)
        answer = [t for t in user_texts(server.chat_requests[0]) if "3, please" in t]
        assert answer, "the answer is in the conversation"
        assert user_texts(server.chat_requests[0])[0].startswith("The task:")


def test_cancel_while_waiting_for_an_answer_closes_with_a_report(tmp_path):
    transcript = tmp_path / "job" / "transcript.json"
    with running_vmd(tmp_path) as vmd:
        with start_ollama([PLAN, call("ask_user", {"question": "which?"})]) as server:
            outcome = run(tmp_path, vmd, server)
        assert outcome.state == "question"
        cancel = threading.Event()
        cancel.set()
        with start_ollama([]) as server:
            done = resume_job(transcript, on_event=lambda e: None, cancel=cancel,
                              config=agent_config(server), vmd_socket=vmd.socket)
        assert done.state == "cancelled" and not server.chat_requests
        assert_closed_with_report(vmd, done)


def test_resume_without_a_transcript_reports_why(tmp_path):
    outcome = resume_job(tmp_path / "nope.json", answer="x", on_event=lambda e: None)
    assert outcome.state == "failed" and "could not be read" in outcome.report


def test_a_missing_prompt_refuses_to_start_with_a_report(tmp_path, monkeypatch):
    monkeypatch.setenv("VMAGENT_PROMPTS", str(tmp_path / "empty"))
    monkeypatch.setattr("vmagent.prompts.REPO_PROMPTS_DIR", tmp_path / "also-empty")
    outcome = run_job(JobSpec(task="t"), on_event=lambda e: None, transcript_path=tmp_path / "t.json",
                      config=AgentConfig(), vmd_socket=str(tmp_path / "no.sock"))
    assert outcome.state == "failed" and "prompt.md was not found" in outcome.report


def test_an_answer_right_after_a_vmd_restart_wakes_the_paused_machine(tmp_path):
    """After a restart vmd re-binds the machine in the background; an answer that arrives
    before that is done must still resume the paused guest, not skip it."""
    from tests.support.vmd_fakes import LocalMachines, make_config
    from vmd.server.rpc import VmdServer

    transcript = tmp_path / "job" / "transcript.json"
    machines = LocalMachines()
    config = make_config(tmp_path)
    server = VmdServer(config, machines).start()
    try:
        with start_ollama([PLAN, call("run", {"command": "true"}), call("ask_user", {"question": "which?"})]) as llm:
            asked = run_job(JobSpec(task="write hello.py", project="hello"), on_event=lambda e: None,
                            transcript_path=transcript, config=agent_config(llm), vmd_socket=str(config.socket))
        assert asked.state == "question"
        [machine] = machines.machines.values()
        assert machine.suspended, "a waiting session's machine is paused"

        server.stop()
        machines.attach_seconds = 0.5  # re-binding the guest takes a moment
        server = VmdServer(config, machines).start()
        with start_ollama(finish_script()[1:]) as llm:
            done = resume_job(transcript, answer="this one", on_event=lambda e: None,
                              config=agent_config(llm), vmd_socket=str(config.socket))
        assert done.state == "done" and done.verification_passed is True, done.report
        assert machines.attached == [machine.spec.name]
    finally:
        server.stop()


# --- tool calls written as text ----------------------------------------------------------


def as_json(name: str, arguments: dict, key: str = "arguments") -> str:
    return json.dumps({"name": name, key: arguments})


def test_a_model_that_writes_every_call_as_text_finishes_verified(tmp_path):
    """Each shape real models use: a whole-content object (with "arguments" or
    "parameters"), <tool_call> tags, a fenced JSON block; and a call to a machine tool
    before the plan, which vmd refuses with a sentence that says to plan first."""
    check = {"command": "python3 hello.py | grep -q hello"}
    script = [
        Turn(content=as_json("run", {"command": "ls"})),  # a working tool while planning
        Turn(content="<tool_call>\n" + as_json("plan_tasks", {"tasks": ["write hello.py", "check it"]})
                     + "\n</tool_call>"),
        Turn(content="Writing it.\n```json\n" + as_json("write_file", {"path": "hello.py",
                                                                      "content": "print('hello')\n"})
                     + "\n```"),
        Turn(content=as_json("run", {"command": "python3 hello.py"}, key="parameters")),
        Turn(content="<tool_call>" + as_json("update_task", {"id": 1, "status": "done", "note": "written"})
                     + "</tool_call>\n<tool_call>"
                     + as_json("update_task", {"id": 2, "status": "done", "note": "prints hello"})
                     + "</tool_call>"),
        Turn(content=as_json("finish", {"summary": "hello.py prints hello", "verification": check})),
    ]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert outcome.steps == len(script)
    assert (vmd.project("hello") / "hello.py").read_text() == "print('hello')\n"
    # the early call is refused by vmd's gate, which says to plan first; not counted as prose
    first = tool_results(server.chat_requests[1])
    assert len(first) == 1 and "REFUSED: run needs a plan first" in first[0] and "plan_tasks" in first[0]
    # the model is told once, in a tool result, to use the tool interface
    last = tool_results(server.chat_requests[-1])
    told = [r for r in last if "tool-calling interface" in r]
    assert told == [first[0]] and "tool-calling interface" in first[0]
    assert not any("without a tool call" in u for u in user_texts(server.chat_requests[-1]))
    # the history shows the calls as calls, so the model is not shown its own habit
    assistant = [m for m in server.chat_requests[-1]["messages"] if m["role"] == "assistant"]
    assert all(m.get("tool_calls") and not m.get("content") for m in assistant)


# --- the guest's family: what vmd says, not what the image is called -----------------------


def tool_description(body: dict, name: str) -> str:
    return next(t["function"]["description"] for t in body["tools"] if t["function"]["name"] == name)


@pytest.mark.parametrize("image, family, said, not_said", [
    # An image whose name says nothing of Windows, and a Debian one whose name starts with
    # "win": the name guess would get both wrong.
    ("corp-desktop-2025", "windows", ("# The machine: Windows", "PowerShell 5.1", "Z:\\"), ("/mnt/project",)),
    ("wintermute", "linux", ("# The machine: Linux", "bash", "/mnt/project"), ("PowerShell",)),
])
def test_the_family_vmd_answers_words_the_prompt_and_the_tools_whatever_the_image_is_called(
        tmp_path, image, family, said, not_said):
    with running_vmd(tmp_path, os_family=family) as vmd, start_ollama(finish_script()) as server:
        outcome = run(tmp_path, vmd, server, os=image)
    assert outcome.session_id, outcome.report
    first = server.chat_requests[0]
    system, opening = first["messages"][0]["content"], user_texts(first)[0]
    shell = "PowerShell 5.1" if family == "windows" else "bash"
    assert tool_description(first, "run").startswith(f"Run a {shell} command")
    assert f"A {image} machine is booting for you now ({shell};" in opening
    for words in said:
        assert words in system + opening, words
    for words in not_said:
        assert words not in system + opening + json.dumps(first["tools"]), words
    # The system prompt, the head of every request, is the same in every request.
    assert {r["messages"][0]["content"] for r in server.chat_requests} == {system}


def test_a_resumed_job_keeps_the_family_vmd_answered(tmp_path):
    transcript = tmp_path / "job" / "transcript.json"
    with running_vmd(tmp_path, os_family="windows") as vmd:
        with start_ollama([PLAN, call("ask_user", {"question": "which?"})]) as server:
            asked = run(tmp_path, vmd, server, os="corp-desktop-2025")
        assert asked.state == "question"
        assert json.loads(transcript.read_text())["os_family"] == "windows"
        with start_ollama(finish_script()[1:]) as server:
            resume_job(transcript, answer="this one", on_event=lambda e: None,
                       config=agent_config(server), vmd_socket=vmd.socket)
    resumed = server.chat_requests[0]
    assert tool_description(resumed, "run").startswith("Run a PowerShell 5.1 command")
    assert "# The machine: Windows" in resumed["messages"][0]["content"]


def test_a_vmd_that_does_not_say_the_family_leaves_the_name_to_tell_it(tmp_path):
    # vmd before the os_family answer (the stand-in answers None, as for an image it lacks):
    # the name is all there is to go by.
    with running_vmd(tmp_path, os_family=None) as vmd, start_ollama([PLAN]) as server:
        run(tmp_path, vmd, server, os="win11")
    first = server.chat_requests[0]
    assert tool_description(first, "run").startswith("Run a PowerShell 5.1 command")
    assert "# The machine: Windows" in first["messages"][0]["content"]
