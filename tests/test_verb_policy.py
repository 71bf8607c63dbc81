"""The contract's tables (vmd/verbs.py): when a session serves each verb (POLICY), what
each verb answers (RESULTS), and one way to refuse (an error with code REFUSED)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest

from vmd import verbs as V
from vmd.errors import FAILED, INTERNAL_ERROR, REFUSED, VerbError, refused
from vmd.session.record import Record, read_record
from vmd.session.report import build_report
from vmd.session.session import Session
from tests.vmd_fakes import RpcClient, RpcError, local_vmd

STATES = ("booting", "ready", "question", "unfreeze", "finished", "cancelled", "closed")
# The machine verbs as they were listed by hand before the table.
MACHINE_VERBS_BEFORE = {
    "run", "read_file", "write_file", "append_file", "edit_file", "list_dir", "screenshot",
    "click", "move", "type", "key", "scroll", "launch_app", "check_internet", "reboot_vm",
}


def test_every_verb_has_a_policy_and_a_result_model():
    assert set(V.POLICY) == set(V.VERBS)
    assert set(V.RESULTS) == set(V.VERBS)
    assert all(issubclass(model, V.Result) for model in V.RESULTS.values())
    assert V.MACHINE_VERBS == {verb for verb, p in V.POLICY.items() if p.needs_machine} == MACHINE_VERBS_BEFORE


def test_the_policy_is_frozen_data():
    with pytest.raises(Exception):
        V.POLICY["run"].needs_plan = False


def _gate_before(s, planned: bool, verb: str) -> str | None:
    """The gate as it was written before the table (vmd/session/session.py's if-chain), the
    reference the table must keep."""
    state = s.state
    if state == "closed" and verb not in ("session_status", "report", "session_close", "session_cancel", "note"):
        return f"REFUSED: session {s.id} is closed; read its report(), or open a new session to do more."
    if state == "cancelled" and (verb in MACHINE_VERBS_BEFORE or verb in ("finish", "ask_user", "request_unfreeze")):
        return "REFUSED: the session was cancelled; stop and call session_close."
    if state in ("question", "unfreeze") and (verb in MACHINE_VERBS_BEFORE or verb == "finish"):
        waiting = s.question if state == "question" else s.unfreeze_request
        return (f"REFUSED: the session waits for a person ({state}: {waiting!r}); the machine is suspended "
                "until session_resume brings the answer.")
    if verb in MACHINE_VERBS_BEFORE and not planned:
        return (f"REFUSED: {verb} needs a plan first: call plan_tasks with the steps of the work (the machine "
                "boots meanwhile), then use the machine.")
    return None


# session_open and session_attach bind the connection in vmd/server/rpc.py; peek was served
# before the gate: its row lets it through in every state.
GATED = [v for v in V.VERBS if v not in ("session_open", "session_attach")]


@pytest.mark.parametrize("state, planned", list(itertools.product(STATES, (False, True))))
def test_the_gate_reads_the_table_and_refuses_as_the_if_chains_did(state, planned):
    s = SimpleNamespace(id="s-20260101-000000-abcdef", state=state, question="which colour?",
                        unfreeze_request="pip install")
    session = SimpleNamespace(s=s, tasks=SimpleNamespace(planned=planned))
    for verb in GATED:
        expected = _gate_before(s, planned, verb) if verb != "peek" else None
        try:
            Session._gate(session, verb)
            got = None
        except VerbError as exc:
            assert exc.code == REFUSED and exc.data is None
            got = exc.message
        assert got == expected, (state, planned, verb)


def test_which_verbs_are_steps():
    not_steps = {verb for verb, p in V.POLICY.items() if not p.counts_as_step}
    assert not_steps == {"session_open", "session_attach", "session_status", "report", "peek"}


def test_a_refusal_always_starts_with_the_prefix_and_carries_data_only_when_given():
    bare = VerbError("no.", REFUSED)
    assert bare.message == "REFUSED: no." and bare.data is None
    assert refused("REFUSED: once.").message == "REFUSED: once."
    assert refused("with data.", {"attempt": {"attempt": 1}}).data == {"attempt": {"attempt": 1}}
    assert VerbError("a failure", FAILED).message == "a failure"


# --- every verb over the socket, each result checked against its model -------------------

@pytest.fixture
def vmd(tmp_path):
    with local_vmd(tmp_path) as running:
        yield running


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
    call("peek")  # no screen while the session waits
    call("session_resume", answer="blue")
    call("request_unfreeze", reason="pip install")
    call("session_resume", approved=False)
    for task in (1, 2, 3):
        call("update_task", id=task, status="done")
    call("finish", summary="done", verification="grep -q there a.txt")
    call("report")
    call("session_cancel")
    call("session_close")
    call("session_close")  # already closed: the close again
    call("session_status")
    c.close()
    with RpcClient(config.socket) as again:
        results["session_attach"] = [again.call("session_attach", session_id=c.session_id)]

    assert set(results) == set(V.VERBS)
    for verb, answers in results.items():
        for answer in answers:
            assert V.result_problem(verb, answer) is None, (verb, V.result_problem(verb, answer))
            V.RESULTS[verb].model_validate(answer)
    assert results["peek"][1]["available"] is False and results["git_commit"][1]["commit"]


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
        attempt = V.FinishRefusalData.model_validate(err.value.data).attempt
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
    assert "5 steps (0 commands run, 1 call failed with an error, 3 refusals)" in md, md


def test_session_json_keeps_the_state_as_the_contract_names_it(tmp_path):
    from pydantic import ValidationError

    from vmd.session.state import SessionState
    state = SessionState(id="s-20260101-000000-abcdef", os="debian", state="question", resume_state="ready")
    assert SessionState.model_validate_json(state.model_dump_json()).state == "question"
    with pytest.raises(ValidationError):
        SessionState.model_validate_json(json.dumps({"id": "x", "os": "debian", "state": "sleeping"}))
