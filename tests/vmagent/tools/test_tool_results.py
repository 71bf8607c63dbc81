"""One tool call from the loop to vmd and back (vmagent/tools/results.py): what reaches
vmd, and what the model reads of vmd's answer, against a stand-in for vmd (a plain
object with a `.call(method, **params)` like vmagent.link.Vmd, answering the verb's
result model as it does)."""

from __future__ import annotations

import pytest

from vmagent import tools
from vmagent.config import AgentConfig
from vmagent.link import VmdError, VmdUnavailable, typed_result
from vmagent.loop.job import Events, Job, JobSpec
from vmd.contract.errors import FAILED, REFUSED


class FakeVmd:
    """Answers each verb from a table; records what it was asked."""

    def __init__(self, answers: dict | None = None, raises: Exception | None = None):
        self.answers = answers or {}
        self.raises = raises
        self.calls: list[tuple[str, dict]] = []

    def call(self, method: str, **params):
        self.calls.append((method, params))
        if self.raises is not None:
            raise self.raises
        answer = self.answers.get(method, RAN)
        return typed_result(method, answer(params) if callable(answer) else answer)


RAN = {"exit_code": 0, "stdout": "", "stderr": "", "duration": 0.1, "truncated": False, "timed_out": False,
       "text": "exit code 0 (0.1 s)"}
OUTCOME = {"command": "true", "cwd": None, "expect_exit": 0, "exit_code": 0, "passed": True, "proven": True,
           "timed_out": False, "duration": 0.1, "output_tail": "", "baseline": {"exit_code": 1, "passed": False},
           "attempts": 1}


def test_a_vmd_error_becomes_an_error_text():
    vmd = FakeVmd(raises=VmdError(FAILED, "no such file: /nope", "read_file"))
    outcome = tools.call(vmd, "read_file", {"path": "/nope"})
    assert outcome.text == "ERROR: no such file: /nope"
    assert not outcome.ok and outcome.verb == "read_file" and outcome.state is None


def test_a_refusal_reaches_the_model_as_vmds_sentence():
    vmd = FakeVmd(raises=VmdError(REFUSED, "REFUSED: git_commit needs a project folder.", "git_commit"))
    outcome = tools.call(vmd, "git_commit", "wip")
    assert outcome.text == "REFUSED: git_commit needs a project folder."
    assert not outcome.ok and outcome.state is None and outcome.result is None


def test_vmd_unavailable_reaches_the_loop():
    vmd = FakeVmd(raises=VmdUnavailable("vmd closed the connection during run"))
    with pytest.raises(VmdUnavailable):
        tools.call(vmd, "run", {"command": "ls"})


def test_any_other_exception_becomes_an_internal_error_text():
    vmd = FakeVmd(raises=KeyError("boom"))
    outcome = tools.call(vmd, "run", "ls")
    assert outcome.text.startswith("ERROR: internal: KeyError") and not outcome.ok


def test_an_unknown_tool_lists_the_valid_names():
    vmd = FakeVmd()
    outcome = tools.call(vmd, "execute_shell", {"command": "ls"})
    assert not outcome.ok and "execute_shell" in outcome.text
    assert "run" in outcome.text and "finish" in outcome.text
    assert vmd.calls == []


def test_a_tool_not_offered_this_turn_is_refused_without_calling_vmd():
    vmd = FakeVmd()
    outcome = tools.call(vmd, "run", "ls", offered=tools.tool_names("planning", False))
    assert not outcome.ok and "plan_tasks" in outcome.text and vmd.calls == []


def test_bad_arguments_never_reach_vmd():
    vmd = FakeVmd()
    outcome = tools.call(vmd, "write_file", "just some text")
    assert not outcome.ok and outcome.text.startswith("ERROR: write_file needs")
    assert vmd.calls == []


# What vmd/session/handlers/shell_verbs.py answers, word for word: vmd words the results, vmagent
# passes them on (a second wording would say things twice, a timeout notice among them).
RUN_RESULT = {"exit_code": 2, "stdout": "a\nb\n", "stderr": "oops\n", "duration": 1.234, "truncated": False,
              "timed_out": False, "text": "exit code 2 (1.2 s)\n--- stdout ---\na\nb\n--- stderr ---\noops"}
TIMED_OUT = ("\n[vmd: the command ran past its 10 s timeout and was killed with everything it started; "
             "give a longer timeout or run it in smaller steps]")
TIMED_OUT_RESULT = {"exit_code": 124, "stdout": "", "stderr": TIMED_OUT, "duration": 10.0, "truncated": True,
                    "timed_out": True, "text": "exit code 124 (10.0 s), TIMED OUT, output truncated in the middle\n"
                                               "--- stderr ---" + TIMED_OUT.rstrip("\n")}


def test_run_shows_vmds_text_and_keeps_the_result():
    vmd = FakeVmd({"run": RUN_RESULT})
    outcome = tools.call(vmd, "run", '{"cmd": "make"}')
    assert vmd.calls == [("run", {"command": "make"})]
    assert outcome.text == RUN_RESULT["text"]
    assert outcome.ok and outcome.result["exit_code"] == 2 and outcome.image_b64 is None


def test_a_timed_out_run_gives_exactly_one_timeout_notice():
    vmd = FakeVmd({"run": TIMED_OUT_RESULT})
    outcome = tools.call(vmd, "run", {"command": "sleep 99", "timeout": 10})
    assert outcome.text == TIMED_OUT_RESULT["text"]
    assert outcome.text.count("ran past its 10 s timeout") == 1 and outcome.text.count("TIMED OUT") == 1
    assert "timed out" not in outcome.text  # vmagent's own notice is gone: vmd's says it


def test_dropped_fields_are_noted_in_the_result():
    vmd = FakeVmd({"run": RUN_RESULT})
    outcome = tools.call(vmd, "run", {"command": "true", "shell": "zsh", "color": "red"})
    assert vmd.calls == [("run", {"command": "true"})]
    assert outcome.text.startswith(RUN_RESULT["text"] + "\nnote: ") and "'color'" in outcome.text


def test_read_file_shows_vmds_text_with_where_to_read_on():
    text = "hello\n[vmd: showing bytes 0–5 of 12; read on with offset=5]"
    vmd = FakeVmd({"read_file": {"content": "hello", "size": 12, "offset": 0, "truncated": True, "text": text}})
    outcome = tools.call(vmd, "read_file", "/mnt/project/x.txt")
    assert outcome.text == text


def test_screenshot_gives_a_short_text_and_the_image():
    vmd = FakeVmd({"screenshot": {"width": 1280, "height": 800, "scale": 1.0, "path": "s.png",
                                  "png_base64": "iVBORw0KGgo=", "text": "screenshot"}})
    outcome = tools.call(vmd, "screenshot", {})
    assert outcome.image_b64 == "iVBORw0KGgo=" and "1280x800" in outcome.text
    assert "iVBOR" not in outcome.text and len(outcome.text) < 200


def test_list_dir_shows_vmds_text():
    vmd = FakeVmd({"list_dir": {"entries": [{"name": "src", "type": "dir", "size": 0},
                                            {"name": "a.py", "type": "file", "size": 10}],
                                "text": "src/  0\na.py  10"}})
    outcome = tools.call(vmd, "list_dir", {"dir": "/mnt/project"})
    assert vmd.calls == [("list_dir", {"path": "/mnt/project"})]
    assert outcome.text == "src/  0\na.py  10"


def test_an_answer_that_does_not_fit_its_model_reaches_the_model_as_an_error_naming_the_field():
    vmd = FakeVmd({"read_file": {"content": "", "size": 0, "offset": 0, "truncated": False}})
    outcome = tools.call(vmd, "read_file", "empty.txt")
    assert not outcome.ok and outcome.state is None
    assert outcome.text.startswith("ERROR: vmd's answer to read_file does not fit its contract (ReadFileResult): "
                                   "text: Field required")


def test_ask_user_and_request_unfreeze_stop_the_loop():
    vmd = FakeVmd({"ask_user": {"state": "question", "text": "Asked; waiting."},
                   "request_unfreeze": {"state": "unfreeze", "text": "Requested."}})
    assert tools.call(vmd, "ask_user", "Which database?").state == "question"
    assert tools.call(vmd, "request_unfreeze", {"why": "pip"}).state == "unfreeze"


def test_finish_refused_and_accepted_pass_vmds_text_through():
    refused = FakeVmd(raises=VmdError(REFUSED, "REFUSED: task 2 is still in_progress.", "finish"))
    outcome = tools.call(refused, "finish", {"summary": "x", "verification": "true"})
    assert outcome.text == "REFUSED: task 2 is still in_progress."
    assert not outcome.ok and outcome.state is None
    assert refused.calls == [("finish", {"summary": "x", "verification": {"command": "true"}})]

    accepted = FakeVmd({"finish": {"accepted": True, "outcome": OUTCOME,
                                   "text": "Accepted: verification `true` exited 0."}})
    outcome = tools.call(accepted, "finish", {"summary": "x", "verification": {"command": "true"}})
    assert outcome.ok and outcome.state == "finished" and "exited 0" in outcome.text


REFUSED_CHECK = ("REFUSED: your verification failed, so the work is not done yet. vmd ran `pytest -q`: "
                 "exit 1 (expected 0) after 2.1 s.\nOutput tail:\nE   assert 2 == 3")
ATTEMPT = {"attempt": 1, "command": "pytest -q", "exit_code": 1}


def test_a_refused_verification_reaches_the_model_with_its_attempt():
    vmd = FakeVmd(raises=VmdError(REFUSED, REFUSED_CHECK, "finish", {"attempt": ATTEMPT}))
    outcome = tools.call(vmd, "finish", {"summary": "x", "verification": "pytest -q"})
    assert outcome.text == REFUSED_CHECK and not outcome.ok and outcome.state is None
    assert outcome.result == {"attempt": ATTEMPT}


def test_a_finish_refused_in_its_result_is_never_read_as_finished():
    # How vmd refused a finish before every refusal became a REFUSED error: no longer its
    # contract (FinishResult is only an accepted finish), so the client refuses the answer.
    vmd = FakeVmd({"finish": {"accepted": False, "outcome": None, "text": REFUSED_CHECK, "attempt": ATTEMPT}})
    outcome = tools.call(vmd, "finish", {"summary": "x", "verification": "pytest -q"})
    assert not outcome.ok and outcome.state is None and "(FinishResult): accepted:" in outcome.text


def test_task_verbs_show_the_task_list():
    vmd = FakeVmd({"plan_tasks": {"tasks": "1. [ ] build\n2. [ ] test", "text": "Planned 2 tasks."}})
    outcome = tools.call(vmd, "plan_tasks", ["build", "test"])
    assert "Planned 2 tasks." in outcome.text and "2. [ ] test" in outcome.text


def test_a_result_in_an_unexpected_shape_is_an_error_the_model_reads():
    vmd = FakeVmd({"run": {"text": "weird but readable"}, "read_file": ["not", "a", "dict"]})
    ran = tools.call(vmd, "run", "ls")
    assert not ran.ok and "vmd's answer to run does not fit its contract (RunResult): exit_code: Field required" in ran.text
    outcome = tools.call(vmd, "read_file", "a")
    assert not outcome.ok and outcome.verb == "read_file"
    assert "vmd's answer to read_file is a list, not an object (ReadFileResult)" in outcome.text


def test_a_namespaced_or_capitalised_tool_name_is_understood():
    vmd = FakeVmd()
    assert tools.call(vmd, "functions.run", "ls").verb == "run"
    assert tools.call(vmd, " Run ", "ls").ok
    assert [c[0] for c in vmd.calls] == ["run", "run"]


# --- from the loop: read once ---------------------------------------------------------


def test_a_tool_call_is_read_once_and_that_reading_is_what_vmd_gets(tmp_path, monkeypatch):
    from vmagent.tools import parsing as tool_parsing
    from vmagent.loop.turns import _call_tool

    reads = []
    read = tool_parsing._parse
    monkeypatch.setattr(tool_parsing, "_parse", lambda tool, raw: reads.append(tool.name) or read(tool, raw))
    vmd = FakeVmd({"run": RAN, "finish": {"accepted": True, "text": "Finished.", "outcome": OUTCOME}})
    job, events = Job(spec=JobSpec(task="t"), transcript_path=tmp_path / "t.json"), []
    _call_tool(job, vmd, "run", '{"cmd": "make", "timeout": "30"}', ["run", "finish"], AgentConfig(),
               Events(events.append))
    finished = _call_tool(job, vmd, "finish", {"summary": "s", "check": "make test"}, ["run", "finish"],
                          AgentConfig(), Events(events.append))
    assert reads == ["run", "finish"]
    assert vmd.calls == [("run", {"command": "make", "timeout": 30.0}),
                         ("finish", {"summary": "s", "verification": {"command": "make test"}})]
    assert {"type": "command", "command": "make"} in events and job.verification == "make test"
    assert finished.state == "finished" and job.messages[-1]["content"] == "Finished."
