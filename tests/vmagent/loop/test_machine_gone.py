"""A machine destroyed from outside in the middle of a session: the loop still ends with
a report (state failed, the project folder committed, the report saying the machine is
gone), first with the stand-in machine, then with a real libvirt guest.

vmd tells the agent in two places: a machine verb that fails on a dead machine answers
"the machine is gone …", and `session_status()["machine"]` reads "destroyed". The loop's
`machine_gone` guard ends the job on the next turn; `session_close` commits what the
project folder holds."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.guests import clean_up_domains
from tests.support.loop_harness import agent_config, call, calls, running_vmd
from tests.support.ollama_server import start_ollama
from vmagent.loop import JobSpec, run_job

PLAN = call("plan_tasks", {"tasks": ["write notes.txt", "check it"]}, content="Planning.")


def only_session_id(config) -> str:
    [session_dir] = [p for p in config.sessions_dir.iterdir() if p.is_dir()]
    return session_dir.name


def assert_gone_report(outcome, record) -> dict:
    """What every such job must end with, whatever the machine was."""
    assert outcome.state == "failed", outcome.report
    assert outcome.report.startswith(f"# vmagent session {outcome.session_id}"), outcome.report
    assert "## How the session ended" in outcome.report
    assert "The machine is gone (destroyed)" in outcome.report
    assert outcome.verification_passed is None and "not verified" in outcome.report
    close = next(e for e in record if e["kind"] == "close")
    assert close["commit"] and any("notes.txt" in f for f in close["files"]), close
    assert close["commit"][:10] in outcome.report
    return close


def test_a_machine_destroyed_mid_run_ends_failed_with_the_project_committed(tmp_path):
    with running_vmd(tmp_path) as vmd:
        def destroyed_from_outside(body):
            # Someone runs `virsh destroy` while the model thinks; its next command fails.
            [machine] = vmd.machines.machines.values()
            machine.gone = True
            return call("run", {"command": "cat notes.txt"})

        script = [PLAN, calls(("update_task", {"id": 1, "status": "in_progress"}),
                              ("write_file", {"path": "notes.txt", "content": "kept on the host\n"}),
                              ("run", {"command": "wc -c notes.txt"})),
                  destroyed_from_outside]
        with start_ollama(script) as server:
            outcome = run_job(JobSpec(task="write notes", project="notes"), on_event=lambda e: None,
                              transcript_path=tmp_path / "job" / "transcript.json",
                              config=agent_config(server), vmd_socket=vmd.socket)
        record = vmd.record(outcome.session_id)

    assert_gone_report(outcome, record)
    # the failing verb told the model why, in words it can act on
    failed_run = next(e for e in record if e["kind"] == "verb" and e.get("verb") == "run" and e.get("error"))
    assert failed_run["error"].startswith("the machine is gone")
    # the loop stopped at the next turn instead of asking the model again
    assert len(server.chat_requests) == 3
    assert (vmd.project("notes") / "notes.txt").read_text() == "kept on the host\n"


def test_status_says_destroyed_only_while_the_machine_is_dead(tmp_path):
    from vmagent.link import Vmd

    with running_vmd(tmp_path) as vmd:
        with Vmd(vmd.socket, timeout=30) as c:
            c.call("session_open", os="debian", project="p", task="t", wait=True)
            c.call("plan_tasks", tasks=["one"])
            assert c.call("session_status").machine == "ready"
            [machine] = vmd.machines.machines.values()
            machine.gone = True
            assert c.call("session_status").machine == "destroyed"
            from vmagent.link import VmdError

            with pytest.raises(VmdError) as failed:
                c.call("write_file", path="x.txt", content="x")
            assert failed.value.message.startswith("the machine is gone")
            # a verb that is not the machine's still works
            assert c.call("update_task", id=1, status="blocked", note="the machine is gone")
            closed = c.call("session_close")
            assert closed.closed is True


# --- on a real guest -------------------------------------------------------------------------


@pytest.mark.vm
def test_a_real_guest_destroyed_through_libvirt_mid_session_still_reports(tmp_path, debian_image):
    import libvirt

    from tests.support.vmd_fakes import make_config
    from vmd.machines.libvirt_machines import LibvirtMachines
    from vmd.server.rpc import VmdServer

    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=900,
                         verify_timeout_s=300)
    server = VmdServer(config, LibvirtMachines(config)).start()
    conn = libvirt.open(config.libvirt_uri)
    destroyed_at: list[float] = []

    def destroy_the_domain(body):
        # `virsh destroy`: QEMU is killed at once, the guest gets no say.
        domain = conn.lookupByName(f"vmagent-{only_session_id(config)}")
        domain.destroy()
        destroyed_at.append(time.monotonic())
        return call("run", {"command": "cat /mnt/project/notes.txt"})

    script = [PLAN, calls(("update_task", {"id": 1, "status": "in_progress"}),
                          ("run", {"command": "echo written in the guest > /mnt/project/notes.txt && "
                                              "cat /proc/sys/kernel/random/boot_id"})),
              destroy_the_domain]
    try:
        with start_ollama(script) as server_llm:
            outcome = run_job(JobSpec(task="write notes in the guest", project="notes"),
                              on_event=lambda e: None, transcript_path=tmp_path / "job" / "transcript.json",
                              config=agent_config(server_llm), vmd_socket=str(config.socket))
        record_path = config.sessions_dir / outcome.session_id / "record.jsonl"
        record = [json.loads(line) for line in record_path.read_text().splitlines() if line.strip()]
        names = [d.name() for d in conn.listAllDomains()]
    finally:
        server.stop()
        clean_up_domains(conn, str(tmp_path))
        conn.close()

    assert destroyed_at, "the script never reached the destroying turn"
    close = assert_gone_report(outcome, record)
    # the command before the destroy ran in the guest and wrote into the host's folder
    first_run = next(e for e in record if e["kind"] == "verb" and e.get("verb") == "run")
    assert first_run["result"]["exit_code"] == 0, first_run
    project = config.projects_dir / "local" / "notes"
    assert (project / "notes.txt").read_text() == "written in the guest\n"
    # the command after it failed with vmd's sentence, and the model was told so
    failed_run = [e for e in record if e["kind"] == "verb" and e.get("verb") == "run" and e.get("error")]
    assert failed_run and failed_run[0]["error"].startswith("the machine is gone"), failed_run
    # the loop ended at the next turn rather than asking the model again
    assert len(server_llm.chat_requests) == 3
    assert f"vmagent-{outcome.session_id}" not in names, "close leaves no domain behind"
    assert close["pushed"] is True
