"""The finish gate: nothing the model says is trusted for the outcome."""

from __future__ import annotations


import pytest

from vmagent.client import Vmd
from vmd.rpc import VmdServer
from vmd.session import LibvirtMachines
from tests.vmd_fakes import LocalMachines, make_config


@pytest.fixture
def session(tmp_path):
    config = make_config(tmp_path)
    server = VmdServer(config, LocalMachines()).start()
    c = Vmd(config.socket, timeout=60).connect()
    c.call("session_open", project="gate", task="prove the gate")
    yield c
    c.close()
    server.stop()


def _gate_sequence(c: Vmd) -> None:
    c.call("plan_tasks", tasks=["write the check", "run it"])
    c.call("update_task", id=1, status="in_progress")

    refused = c.call("finish", summary="all done", verification={"command": "true"})
    assert refused["accepted"] is False
    assert refused["text"].startswith("REFUSED:")
    assert "1. write the check (in progress)" in refused["text"] and "2. run it (pending)" in refused["text"]

    c.call("update_task", id=1, status="done")
    c.call("update_task", id=2, status="blocked", note="nothing to run it on")
    refused = c.call("finish", summary="all done", verification={"command": "true"})
    assert refused["accepted"] is False and refused["text"].startswith("REFUSED:")
    assert "no command was ever run" in refused["text"]

    c.call("run", command="echo 'exit 1' > check.sh")
    # The agent claims success; vmd runs the command and the outcome follows vmd.
    finished = c.call("finish", summary="All tests pass, exit 0.",
                      verification={"command": "echo checking; bash check.sh", "expect_exit": 0})
    assert finished["accepted"] is True
    assert finished["outcome"]["exit_code"] == 1 and finished["outcome"]["passed"] is False
    assert "checking" in finished["outcome"]["output_tail"]
    assert "NOT verified" in finished["text"]
    report = c.call("report")
    assert report["outcome"]["status"] == "failed" and report["outcome"]["exit_code"] == 1
    assert "verification failed" in report["markdown"]

    c.call("run", command="echo 'exit 0' > check.sh")
    finished = c.call("finish", summary="fixed", verification="bash check.sh")  # a string is the command
    assert finished["outcome"]["exit_code"] == 0 and finished["outcome"]["passed"] is True
    assert c.call("report")["outcome"]["status"] == "passed"


def test_finish_is_refused_while_a_task_is_open_and_before_any_run_and_follows_vmd(session):
    _gate_sequence(session)


def test_finish_without_a_verification_is_refused(session):
    session.call("plan_tasks", tasks=["one"])
    session.call("run", command="true")
    session.call("update_task", id=1, status="done")
    refused = session.call("finish", summary="trust me")
    assert refused["accepted"] is False and "verification" in refused["text"]


def test_blocked_needs_a_note(session):
    from vmagent.client import VmdError
    session.call("plan_tasks", tasks=["one"])
    with pytest.raises(VmdError) as err:
        session.call("update_task", id=1, status="blocked")
    assert "note" in err.value.message


@pytest.mark.vm
def test_finish_gate_on_a_real_guest(tmp_path, debian_image):
    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=600)
    server = VmdServer(config, LibvirtMachines(config)).start()
    c = Vmd(config.socket, timeout=900).connect()
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
