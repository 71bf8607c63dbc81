"""The contract's tables (vmd/contract/params.py, policy.py, results.py): when a session
serves each verb (POLICY), what each verb answers (RESULTS), where it is served (one handler,
vmd/session/handlers/), and one way to refuse (an error with code REFUSED). The gate
is tested as a client meets it: a real vmd on its socket, each verb called in each state
a session can be brought to, the refusal's sentence as the client reads it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from vmd.contract.check import FinishRefusalData
from vmd.contract.errors import FAILED, INTERNAL_ERROR, REFUSED
from vmd.contract.params import VERBS
from vmd.contract.policy import MACHINE_VERBS, POLICY
from vmd.contract.results import RESULTS, Result, result_problem
from vmd.errors import VerbError, refused
from vmd.session.record import Record, read_record
from vmd.session.report import build_report
from tests.support.vmd_fakes import RpcClient, RpcError, local_vmd

# The verbs that act on the guest, named here by hand: the table must keep them so.
MACHINE = {
    "run", "read_file", "write_file", "append_file", "edit_file", "list_dir", "screenshot",
    "click", "move", "type", "key", "scroll", "launch_app", "check_internet", "reboot_vm",
}
# What a closed session still serves: its reads, a note, and the close (again).
SERVED_WHEN_CLOSED = {"session_status", "report", "peek", "note", "session_close", "session_cancel"}
# One call of every verb the gate stands before (session_open and session_attach bind the
# connection, vmd/session/handlers/opening_verbs.py; history needs no session: tests/vmd/session/test_history_verb.py),
# with arguments its model takes.
CALLS = {
    "session_ready": {"timeout": 5}, "session_status": {}, "session_cancel": {}, "session_close": {},
    "session_resume": {"answer": "blue"}, "peek": {}, "report": {}, "note": {"text": "a note"},
    "web_source": {"kind": "page", "target": "https://docs.python.org/3/", "detail": "characters 0-4,000 of 9,000"},
    "plan_tasks": {"tasks": ["one"]}, "add_task": {"title": "two"},
    "update_task": {"id": 1, "status": "in_progress"}, "run": {"command": "true"},
    "read_file": {"path": "a.txt"}, "write_file": {"path": "a.txt", "content": "a"},
    "append_file": {"path": "a.txt", "content": "b"}, "edit_file": {"path": "a.txt", "old": "a", "new": "c"},
    "list_dir": {"path": "."}, "git_commit": {"message": "files"}, "screenshot": {}, "click": {"x": 1, "y": 1},
    "move": {"x": 1, "y": 1}, "type": {"text": "x"}, "key": {"keys": "Return"},
    "scroll": {"x": 1, "y": 1, "amount": 1}, "launch_app": {"path": "xterm"}, "wait": {"seconds": 0.01},
    "check_internet": {}, "reboot_vm": {}, "ask_user": {"question": "which colour?"},
    "request_unfreeze": {"reason": "pip install"}, "finish": {"summary": "done", "verification": "true"},
    "hidden_check": {"command": "true"},
}
NO_PLAN = ("REFUSED: {verb} needs a plan first: call plan_tasks with the steps of the work (the machine "
           "boots meanwhile), then use the machine.")
WAITING = ("REFUSED: the session waits for a person ({state}: {waiting!r}); the machine is suspended "
           "until session_resume brings the answer.")
CANCELLED = "REFUSED: the session was cancelled; stop and call session_close."
CLOSED = "REFUSED: session {sid} is closed; read its report(), or open a new session to do more."


def test_every_verb_has_a_policy_and_a_result_model():
    assert set(POLICY) == set(VERBS)
    assert set(RESULTS) == set(VERBS)
    assert all(issubclass(model, Result) for model in RESULTS.values())
    assert MACHINE_VERBS == {verb for verb, p in POLICY.items() if p.needs_machine} == MACHINE
    gated = {verb for verb, p in POLICY.items() if p.session} - {"session_open", "session_attach"}
    assert set(CALLS) == gated, "a new verb: add a call of it"


def test_the_policy_is_frozen_data():
    with pytest.raises(Exception):
        POLICY["run"].needs_plan = False


def _answer(c: RpcClient, verb: str) -> str | None:
    """What a client hears: a refusal's sentence, or None when vmd served the verb (its own
    failure, a file not there, is still served: the gate let it through)."""
    try:
        c.call(verb, **CALLS[verb])
    except RpcError as err:
        if err.code == REFUSED:
            assert not err.has_data, (verb, err.data)
            return err.message
    return None


def _refusals(c: RpcClient, verbs) -> dict[str, str | None]:
    return {verb: _answer(c, verb) for verb in sorted(verbs)}


@pytest.fixture
def vmd(tmp_path):
    with local_vmd(tmp_path) as running:
        yield running


def test_the_machine_verbs_wait_for_a_plan(vmd):
    _, _, config = vmd
    with RpcClient(config.socket) as c:
        sid = c.call("session_open", project="gate", task="no plan yet")["session_id"]
        assert _refusals(c, MACHINE) == {verb: NO_PLAN.format(verb=verb) for verb in sorted(MACHINE)}
        assert _refusals(c, {"session_status", "note", "git_commit", "wait"}) == dict.fromkeys(
            ["git_commit", "note", "session_status", "wait"])
        c.call("plan_tasks", tasks=["one"])
        assert _refusals(c, {"write_file", "run", "screenshot"}) == dict.fromkeys(["run", "screenshot", "write_file"])
    refused_in_record = [e["verb"] for e in read_record(config.sessions_dir / sid / "record.jsonl")
                         if e["kind"] == "verb" and e.get("code") == REFUSED]
    assert sorted(refused_in_record) == sorted(MACHINE)


@pytest.mark.parametrize("ask, state, waiting", [("ask_user", "question", "which colour?"),
                                                 ("request_unfreeze", "unfreeze", "pip install")])
def test_a_session_waiting_for_a_person_refuses_the_machine_and_finish(vmd, ask, state, waiting):
    _, _, config = vmd
    with RpcClient(config.socket) as c:
        c.call("session_open", project="gate", task="a question")
        c.call("plan_tasks", tasks=["one"])
        c.call(ask, **CALLS[ask])
        sentence = WAITING.format(state=state, waiting=waiting)
        assert _refusals(c, MACHINE | {"finish"}) == dict.fromkeys(sorted(MACHINE | {"finish"}), sentence)
        assert _refusals(c, {"session_status", "note", "add_task", "git_commit", "peek"}) == dict.fromkeys(
            ["add_task", "git_commit", "note", "peek", "session_status"])
        c.call("session_resume", answer="blue", approved=True)
        assert _answer(c, "run") is None


def test_a_cancelled_session_refuses_the_machine_finish_and_the_people_verbs(vmd):
    _, _, config = vmd
    with RpcClient(config.socket) as c:
        c.call("session_open", project="gate", task="cancelled")
        c.call("plan_tasks", tasks=["one"])
        c.call("session_cancel")
        refused_now = MACHINE | {"finish", "ask_user", "request_unfreeze"}
        assert _refusals(c, refused_now) == dict.fromkeys(sorted(refused_now), CANCELLED)
        assert _refusals(c, {"session_status", "note", "add_task", "git_commit", "report"}) == dict.fromkeys(
            ["add_task", "git_commit", "note", "report", "session_status"])
        assert _answer(c, "session_close") is None


def test_a_closed_session_serves_only_its_reads_a_note_and_the_close(vmd):
    _, _, config = vmd
    with RpcClient(config.socket) as c:
        sid = c.call("session_open", project="gate", task="closed")["session_id"]
        c.call("plan_tasks", tasks=["one"])
        c.call("session_close")
        refused_now = set(CALLS) - SERVED_WHEN_CLOSED
        assert _refusals(c, refused_now) == dict.fromkeys(sorted(refused_now), CLOSED.format(sid=sid))
        assert _refusals(c, SERVED_WHEN_CLOSED) == dict.fromkeys(sorted(SERVED_WHEN_CLOSED))


def test_which_verbs_are_steps():
    not_steps = {verb for verb, p in POLICY.items() if not p.counts_as_step}
    assert not_steps == {"session_open", "session_attach", "session_status", "report", "peek", "hidden_check",
                         "history", "host_info"}


def test_a_refusal_always_starts_with_the_prefix_and_carries_data_only_when_given():
    bare = VerbError("no.", REFUSED)
    assert bare.message == "REFUSED: no." and bare.data is None
    assert refused("REFUSED: once.").message == "REFUSED: once."
    assert refused("with data.", {"attempt": {"attempt": 1}}).data == {"attempt": {"attempt": 1}}
    assert VerbError("a failure", FAILED).message == "a failure"


def test_vmds_own_errors_are_shown_as_worded_and_any_other_with_its_type():
    from vmd.errors import sentence
    from vmd.guests.guest import GuestError
    from vmd.machines.images import ImageMissing
    from vmd.machines.port import DesktopMissing

    for worded in (GuestError("edit_file a.txt: the text matched nowhere."), ImageMissing("build it first."),
                   DesktopMissing("use the shell.")):
        assert sentence(worded, "it failed") == str(worded)
    assert sentence(KeyError("x"), "run failed") == "run failed: KeyError: 'x'"
    assert sentence(VerbError("no.", REFUSED), "ignored") == "REFUSED: no."


# --- every verb over the socket, each result checked against its model -------------------

def test_every_verb_answers_what_its_result_model_says(vmd):
    _, _, config = vmd
    results: dict[str, list[dict]] = {}
    c = RpcClient(config.socket)

    def call(verb: str, **params) -> dict:
        result = c.call(verb, **params)
        results.setdefault(verb, []).append(result)
        return result

    call("session_open", project="contract", task="every verb")
    call("session_status")
    call("note", turn=1, text="starting")
    call("web_source", kind="page", target="https://docs.python.org/3/", title="3.13 docs", detail="characters 0-4,000")
    call("plan_tasks", tasks=["files", "screen"])
    call("add_task", title="people")
    call("update_task", id=1, status="in_progress")
    call("session_ready", timeout=30)
    call("run", command="echo one; echo two >&2")
    call("write_file", path="a.txt", content="hello\nworld\n")
    call("append_file", path="a.txt", content="more\n")
    call("read_file", path="a.txt", limit=5)
    call("edit_file", path="a.txt", old="world", new="there")
    call("list_dir", path=".")
    call("git_commit", message="first files")
    call("git_commit", message="nothing new")
    call("history", project="contract", what="show")
    call("host_info")
    call("screenshot")
    call("peek")
    call("click", x=1, y=2)
    call("move", x=3, y=4)
    call("type", text="hi")
    call("key", keys="Return")
    call("scroll", x=5, y=6, amount=2)
    call("launch_app", path="xterm")
    call("wait", seconds=0.01)
    call("check_internet")
    call("reboot_vm")
    call("ask_user", question="which colour?")
    call("peek")  # while the session waits: the frame kept before the guest was paused
    call("session_resume", answer="blue")
    call("request_unfreeze", reason="pip install")
    call("session_resume", approved=False)
    for task in (1, 2, 3):
        call("update_task", id=task, status="done")
    call("finish", summary="done", verification="grep -q there a.txt")
    call("hidden_check", command='grep -q there a.txt && test -f "$CHECK_DIR/want" && cp "$CHECK_DIR/.nonce" "$CHECK_RESULT"',
         files={"want": "there"})
    call("report")
    call("session_cancel")
    call("session_close")
    call("session_close")  # already closed: the close again
    call("session_status")
    c.close()
    with RpcClient(config.socket) as again:
        results["session_attach"] = [again.call("session_attach", session_id=c.session_id)]

    assert set(results) == set(VERBS)
    for verb, answers in results.items():
        for answer in answers:
            assert result_problem(verb, answer) is None, (verb, result_problem(verb, answer))
            RESULTS[verb].model_validate(answer)
    assert results["peek"][1]["available"] is True and results["peek"][1]["kept"] is True
    assert results["git_commit"][1]["commit"]
    assert results["hidden_check"][0]["passed"] is True
    assert results["session_open"][0]["os_family"] == "linux"  # the machines' word, not a guess from "debian"


def test_a_result_that_breaks_its_contract_is_an_internal_error_naming_verb_and_field(vmd, monkeypatch):
    from vmd.session import handlers
    _, _, config = vmd
    monkeypatch.setitem(handlers.HANDLERS, "note", lambda session, p, notify: {"ok": "yes"})
    with RpcClient(config.socket) as c:
        sid = c.call("session_open", task="a bug in vmd")["session_id"]
        with pytest.raises(RpcError) as err:
            c.call("note", text="hello")
    assert err.value.code == INTERNAL_ERROR
    assert "note" in err.value.message and "OkResult" in err.value.message
    assert "ok:" in err.value.message and "text:" in err.value.message
    events = read_record(config.sessions_dir / sid / "record.jsonl")
    noted = [e for e in events if e["kind"] == "verb" and e["verb"] == "note"]
    assert noted[-1]["code"] == INTERNAL_ERROR


def test_refusals_on_the_wire_carry_data_only_when_there_is_some(vmd):
    _, _, config = vmd
    with RpcClient(config.socket) as c:
        c.call("session_open", project="wire", task="refusals")
        with pytest.raises(RpcError) as err:
            c.call("run", command="true")
        assert err.value.code == REFUSED and not err.value.has_data
        c.call("plan_tasks", tasks=["one"])
        c.call("run", command="true")
        c.call("update_task", id=1, status="done")
        with pytest.raises(RpcError) as err:
            c.call("finish", verification="exit 2")
        assert err.value.code == REFUSED and err.value.has_data
        attempt = FinishRefusalData.model_validate(err.value.data).attempt
        assert attempt.exit_code == 2 and attempt.passed is False


def test_the_record_keeps_the_code_of_every_failed_verb(vmd):
    _, _, config = vmd
    with RpcClient(config.socket) as c:
        sid = c.call("session_open", project="codes", task="errors")["session_id"]
        with pytest.raises(RpcError):
            c.call("run", command="true")  # refused: no plan
        c.call("plan_tasks", tasks=["one"])
        c.call("write_file", path="a.txt", content="e e\n")
        with pytest.raises(RpcError) as err:
            c.call("edit_file", path="a.txt", old="e", new="E")  # the guest says no: a failure
        assert err.value.code == FAILED
    errors = [(e["verb"], e.get("code")) for e in read_record(config.sessions_dir / sid / "record.jsonl")
              if e["kind"] == "verb" and "error" in e]
    assert errors == [("run", REFUSED), ("edit_file", FAILED)]


def test_the_report_counts_refusals_by_their_code(tmp_path):
    record = Record(tmp_path)
    record.append("session", event="open", session_id="s-20260101-000000-abcdef", args={"task": "count"})
    record.verb("run", {"command": "true"}, error="REFUSED: run needs a plan first", code=REFUSED)
    # A refusal is known by its code, not by how its sentence begins.
    record.verb("finish", {}, error="tasks still open", code=REFUSED)
    record.verb("edit_file", {"path": "a"}, error="REFUSED: looks like one, but failed", code=FAILED)
    record.verb("note", {"text": "x"}, result={"ok": True, "text": "REFUSED: only words"})
    # A vmd from before every refusal was an error kept finish's refusals as results.
    record.verb("finish", {}, result={"accepted": False, "text": "REFUSED: tasks still open"})
    record.verb("session_status", {}, result={"text": "ready"})
    md = build_report(record.path).markdown
    # No agent told its counts: the report counts the calls vmd served.
    assert "5 calls (0 commands run, 1 call failed with an error, 3 refusals)" in md, md


def test_the_report_states_the_agents_turns_and_tool_calls_as_it_last_told_them(tmp_path):
    record = Record(tmp_path)
    record.append("session", event="open", session_id="s-20260101-000000-abcdef", args={"task": "count"})
    record.verb("session_status", {"turns": 1, "tool_calls": 0}, result={"text": "ready"})
    record.verb("plan_tasks", {"tasks": ["one"]}, result={"text": "planned"})
    record.verb("session_status", {"turns": 2, "tool_calls": 1}, result={"text": "ready"})
    record.verb("run", {"command": "true"}, result={"exit_code": 0})
    record.verb("session_status", {"turns": None, "tool_calls": 0}, result={"text": "ready"})  # a watcher
    record.verb("session_status", {"turns": 2, "tool_calls": 2}, result={"text": "ready"})  # the job's end
    md = build_report(record.path).markdown
    assert "## Turns and time" in md and "step" not in md.lower(), md
    assert "2 model turns, 2 tool calls (1 command run, 0 calls failed with an error, 0 refusals)" in md, md


def test_session_json_keeps_the_state_as_the_contract_names_it(tmp_path):
    from pydantic import ValidationError

    from vmd.session.state import SessionState
    state = SessionState(id="s-20260101-000000-abcdef", os="debian", state="question", resume_state="ready")
    assert SessionState.model_validate_json(state.model_dump_json()).state == "question"
    with pytest.raises(ValidationError):
        SessionState.model_validate_json(json.dumps({"id": "x", "os": "debian", "state": "sleeping"}))


def test_every_verb_has_one_handler_and_the_socket_server_serves_none_itself():
    # vmd/server/rpc.py served session_open and session_attach inline, so "where is a verb
    # served" had two answers; every verb's handler is in vmd/session/handlers/ now.
    from vmd.session.handlers import BINDING, HANDLERS, SESSIONLESS

    tables = [set(HANDLERS), set(BINDING), set(SESSIONLESS)]
    assert set().union(*tables) == set(VERBS) and sum(len(table) for table in tables) == len(VERBS)
    assert set(BINDING) == {"session_open", "session_attach"}
    assert set(SESSIONLESS) == {verb for verb, policy in POLICY.items() if not policy.session}
    rpc = Path(__file__).resolve().parents[3] / "vmd" / "server" / "rpc.py"
    named = {node.value for node in ast.walk(ast.parse(rpc.read_text()))
             if isinstance(node, ast.Constant) and node.value in VERBS}
    # The one verb rpc.py names: a closed session leaves vmd's memory after its close.
    assert named == {"session_close"}, named
