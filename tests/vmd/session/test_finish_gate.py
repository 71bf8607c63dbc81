"""The finish gate: nothing the model says is trusted for the outcome."""

from __future__ import annotations


import pytest

from vmd.contract.check import CheckAttempt, FinishRefusalData
from vmd.contract.errors import REFUSED_PREFIX
from vmd.contract.errors import REFUSED
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.projects.repository import repository_path
from vmd.server.rpc import VmdServer
from vmd.session.record import read_record
from tests.support.vmd_fakes import LocalMachines, RpcClient, RpcError, make_config


@pytest.fixture
def session(tmp_path):
    config = make_config(tmp_path)
    server = VmdServer(config, LocalMachines()).start()
    c = RpcClient(config.socket, timeout=60)
    c.call("session_open", project="gate", task="prove the gate")
    c.config = config
    yield c
    c.close()
    server.stop()


def refusal(c: RpcClient, **params) -> RpcError:
    """finish's refusal: an error with code REFUSED whose message starts with REFUSED:."""
    with pytest.raises(RpcError) as err:
        c.call("finish", **params)
    assert err.value.code == REFUSED and err.value.message.startswith(REFUSED_PREFIX), err.value.message
    return err.value


def attempt_of(refused: RpcError) -> CheckAttempt:
    """The attempt a refusal after vmd's run of the check carries as its data."""
    assert refused.data is not None, refused.message
    return FinishRefusalData.model_validate(refused.data).attempt


def _gate_sequence(c: RpcClient) -> None:
    c.call("plan_tasks", tasks=["write the check", "run it"])
    c.call("update_task", id=1, status="in_progress")

    refused = refusal(c, summary="all done", verification={"command": "true"})
    assert "1. write the check (in progress)" in refused.message and "2. run it (pending)" in refused.message
    assert not refused.has_data  # nothing ran: nothing more to say than the sentence

    c.call("update_task", id=1, status="done")
    c.call("update_task", id=2, status="blocked", note="nothing to run it on")
    refused = refusal(c, summary="all done", verification={"command": "true"})
    assert "no command was ever run" in refused.message

    c.call("run", command="echo 'echo checking; exit 1' > check.sh")
    # The agent claims success; vmd runs the command, and a failure is work left.
    refused = refusal(c, summary="All tests pass, exit 0.", verification={"command": "bash check.sh", "expect_exit": 0})
    assert refused.message.startswith("REFUSED: your verification failed")
    assert "exit 1" in refused.message and "checking" in refused.message
    attempt = attempt_of(refused)
    assert (attempt.attempt, attempt.command, attempt.exit_code, attempt.passed) == (1, "bash check.sh", 1, False)
    assert "checking" in attempt.output_tail and attempt.baseline is None
    assert c.call("session_status")["state"] == "ready"  # the session goes on
    assert c.call("report")["outcome"]["status"] == "unverified"

    c.call("run", command="echo 'echo hello' > app.sh; echo '[ \"$(bash app.sh)\" = hello ]' > check.sh")
    finished = c.call("finish", summary="fixed", verification="bash check.sh")  # a string is the command
    # The check needs the work: on the project as it was (empty) with the check's own file
    # (check.sh, which the command names) laid over it, `bash check.sh` fails.
    assert finished["accepted"] is True, finished
    assert finished["outcome"]["passed"] is True and finished["outcome"]["proven"] is True
    assert finished["outcome"]["baseline"]["exit_code"] != 0
    report = c.call("report")
    assert report["outcome"]["status"] == "passed" and report["outcome"]["attempts"] == 2
    assert "verified and proven" in report["markdown"].splitlines()[2]
    assert "Attempts (2)" in report["markdown"]
    # Three refusals of finish, counted by their code; none is a failure.
    assert "0 calls failed with an error, 3 refusals" in report["markdown"]


def test_finish_is_refused_while_a_task_is_open_and_before_any_run_and_follows_vmd(session):
    _gate_sequence(session)


def _work_done(c: Vmd) -> None:
    c.call("plan_tasks", tasks=["one"])
    c.call("run", command="echo 'print(1)' > app.py")
    c.call("update_task", id=1, status="done")


def test_a_check_that_needs_no_work_is_refused_once_then_passed_not_proven(session):
    _work_done(session)
    refused = refusal(session, summary="done", verification="true")
    assert "also passes on the project as it was before" in refused.message
    attempt = attempt_of(refused)
    assert attempt.passed is True and attempt.baseline is not None and attempt.baseline.passed is True
    finished = session.call("finish", summary="done", verification="test -d .")
    assert finished["accepted"] is True and finished["outcome"]["passed"] is True
    assert finished["outcome"]["proven"] is False and "passed, not proven: the check also passes" in finished["text"]
    report = session.call("report")
    assert report["outcome"]["status"] == "passed_not_proven"
    assert "passed, not proven" in report["markdown"].splitlines()[2]


def test_three_failed_verifications_end_the_session_failed_with_every_attempt(session):
    _work_done(session)
    for attempt in (1, 2):
        refused = refusal(session, summary="done", verification=f"echo try {attempt}; exit 3")
        assert attempt_of(refused).attempt == attempt and f"try {attempt}" in attempt_of(refused).output_tail
    finished = session.call("finish", summary="done", verification="echo try 3; exit 3")
    assert finished["accepted"] is True and finished["outcome"]["passed"] is False
    assert "verification failed: the check did not pass (3 verification runs in all)" in finished["text"]
    report = session.call("report")
    assert report["outcome"]["status"] == "failed" and report["outcome"]["attempts"] == 3
    for attempt in (1, 2, 3):
        assert f"echo try {attempt}; exit 3` → exit 3" in report["markdown"]
    # What the refused paths keep: every attempt in session.json and the record, and the
    # refusals in the record as errors with their code.
    state = session.call("session_status")
    assert state["outcome"]["attempts"] == 3
    events = read_record(session.config.sessions_dir / session.session_id / "record.jsonl")
    assert [e["attempt"] for e in events if e["kind"] == "verification"] == [1, 2, 3]
    finishes = [e for e in events if e["kind"] == "verb" and e["verb"] == "finish"]
    assert [e.get("code") for e in finishes] == [REFUSED, REFUSED, None]
    assert finishes[0]["error"].startswith("REFUSED: your verification failed")


def test_a_closed_task_is_a_checkpoint_commit_and_the_close_carries_the_verification(tmp_path):
    import subprocess
    config = make_config(tmp_path)
    server = VmdServer(config, LocalMachines()).start()
    c = RpcClient(config.socket, timeout=60)
    try:
        c.call("session_open", project="steps", task="two steps")
        c.call("plan_tasks", tasks=["first file", "second file"])
        c.call("run", command="echo one > one.txt")
        assert "Checkpoint" in c.call("update_task", id=1, status="done")["text"]
        c.call("run", command="echo two > two.txt")
        c.call("update_task", id=2, status="done")
        c.call("finish", summary="done", verification="test -f two.txt && test -f one.txt")
        closed = c.call("session_close")
        report = c.call("report")["markdown"]
    finally:
        c.close()
        server.stop()
    repo = repository_path(config.state_dir, "", "steps")
    log = subprocess.run(["git", "--git-dir", str(repo), "log", "--reverse", "--format=%s", "main"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert log == ["Task 1 done: first file", "Task 2 done: second file", "two steps"]
    files = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "--name-only", "main~2"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert files == ["one.txt"]
    body = subprocess.run(["git", "--git-dir", str(repo), "log", "-1", "--format=%B", "main"],
                          capture_output=True, text=True, check=True).stdout
    assert "verified and proven" in body and closed["commit"][:12] in report
    assert "checkpoint `" in report


def test_finish_without_a_verification_is_refused(session):
    session.call("plan_tasks", tasks=["one"])
    session.call("run", command="true")
    session.call("update_task", id=1, status="done")
    refused = refusal(session, summary="trust me")
    assert "name the verification" in refused.message and not refused.has_data


def test_blocked_needs_a_note(session):
    session.call("plan_tasks", tasks=["one"])
    with pytest.raises(RpcError) as err:
        session.call("update_task", id=1, status="blocked")
    assert "note" in err.value.message


@pytest.mark.vm
def test_finish_gate_on_a_real_guest(tmp_path, debian_image):
    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=600)
    server = VmdServer(config, LibvirtMachines(config)).start()
    c = RpcClient(config.socket, timeout=900)
    try:
        c.call("session_open", os="debian", project="gate-vm", task="prove the gate on a guest")
        c.call("session_ready", timeout=600)
        _gate_sequence(c)
    finally:
        try:
            c.call("session_close")
        finally:
            c.close()
            server.stop()
