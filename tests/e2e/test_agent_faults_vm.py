"""Faults under a job on a real guest, the way a person meets them: `vmd serve` as its
own process (so SIGKILL is a real kill), `vmagent run` as a process, the model played by
the scripted Ollama server. Each fault ends in a committed report: vmd killed and back
during a long command, Ctrl-C on `vmagent run`, the model server gone mid-reply."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.guests import clean_up_domains
from tests.support.loop_harness import call, calls, tool_results
from tests.support.ollama_server import Turn, start_ollama
from tests.support.vmd_process import VmdProcess
from tests.vmagent.link.test_reconnect import Terminal

pytestmark = pytest.mark.vm

BEFORE = "written before the fault"
CHECK = f"grep -qx '{BEFORE}' /mnt/project/before.txt"
# The line is written as the command starts: one line in the commit means it ran once.
LONG = "echo started >> /mnt/project/long.txt; sleep 20; echo done > /mnt/project/x"


def agent_env(vmd: VmdProcess, ollama_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "VMD_", "OLLAMA_"))}
    env.update(VMD_SOCKET=str(vmd.socket), OLLAMA_HOST=ollama_url, VMAGENT_MODEL="qwen3:32b",
               VMAGENT_RETRIES="0")
    env.update(extra)
    return env


def vmagent_run(env: dict[str, str], tmp_path: Path, project: str) -> Terminal:
    return Terminal(env, "run", f"Write before.txt in {project}", "--os", "debian", "--project", project,
                    "--transcript", str(tmp_path / "transcript.json"))


def session_of(tmp_path: Path) -> str:
    return json.loads((tmp_path / "transcript.json").read_text())["session_id"]


def committed(vmd: VmdProcess, project: str, path: str) -> str:
    bare = vmd.state / "repos" / "local" / f"{project}.git"
    return subprocess.run(["git", "--git-dir", str(bare), "show", f"main:{path}"], capture_output=True,
                          text=True, check=True).stdout


def domains(conn) -> list[str]:
    return [d.name() for d in conn.listAllDomains()]


def test_vmd_killed_during_a_long_run_and_back_3_s_later_the_job_finishes_verified(tmp_path, debian_image):
    import libvirt

    script = [
        call("plan_tasks", {"tasks": ["write before.txt", "run the long step", "check before.txt"]}),
        calls(("update_task", {"id": 1, "status": "done", "note": "written"}),
              ("write_file", {"path": "/mnt/project/before.txt", "content": BEFORE + "\n"})),
        call("run", {"command": LONG}),  # vmd is killed while this runs
        # the model reads that the result was lost, looks at the effects, and goes on
        calls(("run", {"command": "cat /mnt/project/before.txt; ls /mnt/project"}),
              ("update_task", {"id": 2, "status": "done", "note": "interrupted by a vmd restart; effects checked"}),
              ("update_task", {"id": 3, "status": "done", "note": "before.txt is there"})),
        call("finish", {"summary": "before.txt holds its line", "verification": {"command": CHECK}}),
    ]
    conn = libvirt.open("qemu:///system")
    vmd = VmdProcess(tmp_path, debian_image.dir.parent).start()
    term = None
    try:
        with start_ollama(script) as server:
            term = vmagent_run(agent_env(vmd, server.url), tmp_path, "faults")
            term.wait_for(f"$ {LONG}", timeout=900)
            time.sleep(3)
            vmd.proc.kill()  # SIGKILL: no clean-up of any kind
            vmd.proc.wait()
            vmd.proc = None
            time.sleep(3)
            vmd.start()
            code, out, err = term.finish(timeout=900)
        session_id = session_of(tmp_path)
        assert code == 0, err[-4000:] + out
        assert "vmd went away during run" in err and f"re-attached to session {session_id}" in err, err[-4000:]
        lost = [r for r in tool_results(server.chat_requests[-1])
                if "the command's result was lost when vmd restarted" in r]
        assert len(lost) == 1, "the model was told, once"
        runs = [m for m in server.chat_requests[-1]["messages"] for c in m.get("tool_calls") or []
                if c["function"]["name"] == "run" and c["function"]["arguments"]["command"] == LONG]
        assert len(runs) == 1, "the long command was asked for once, and not run again by the loop"
        assert "✅ verified" in out and CHECK in out
        assert "vmd went away once" in out and "1 tool call in flight lost its result" in out
        # what was written before the fault is in vmd's commit, and the long command ran once
        assert committed(vmd, "faults", "before.txt") == BEFORE + "\n"
        assert committed(vmd, "faults", "long.txt") == "started\n"
        assert f"vmagent-{session_id}" not in domains(conn), "closing the session leaves no guest behind"
    finally:
        if term is not None:
            term.kill()
        vmd.stop()
        clean_up_domains(conn, str(tmp_path))
        conn.close()


def test_ctrl_c_on_vmagent_run_closes_the_session_on_a_real_guest(tmp_path, debian_image):
    import libvirt

    script = [
        call("plan_tasks", {"tasks": ["write before.txt", "run the long step"]}),
        calls(("write_file", {"path": "/mnt/project/before.txt", "content": BEFORE + "\n"}),
              ("run", {"command": "sleep 300"})),
    ]
    conn = libvirt.open("qemu:///system")
    vmd = VmdProcess(tmp_path, debian_image.dir.parent).start()
    term = None
    try:
        with start_ollama(script) as server:
            term = vmagent_run(agent_env(vmd, server.url), tmp_path, "cancelled")
            term.wait_for("$ sleep 300", timeout=900)
            time.sleep(2)
            pressed = time.monotonic()
            term.proc.send_signal(signal.SIGINT)
            code, out, err = term.finish(timeout=300)
            took = time.monotonic() - pressed
        session_id = session_of(tmp_path)
        assert code == 1, err[-4000:] + out
        assert "Ctrl-C again leaves it for vmd to close" in err
        assert out.startswith(f"# vmagent session {session_id}") and "Cancelled by the user" in out, out
        state = json.loads((vmd.state / "sessions" / session_id / "session.json").read_text())
        assert state["state"] == "closed"
        assert committed(vmd, "cancelled", "before.txt") == BEFORE + "\n"
        assert f"vmagent-{session_id}" not in domains(conn)
        print(f"Ctrl-C to exit: {took:.1f} s")
    finally:
        if term is not None:
            term.kill()
        vmd.stop()
        clean_up_domains(conn, str(tmp_path))
        conn.close()


def test_the_model_server_down_mid_reply_then_back_the_job_finishes_verified(tmp_path, debian_image):
    import libvirt

    work = calls(("write_file", {"path": "/mnt/project/before.txt", "content": BEFORE + "\n"}),
                 ("run", {"command": "cat /mnt/project/before.txt"}),
                 ("update_task", {"id": 1, "status": "done", "note": "written"}), content="Writing it now.")
    conn = libvirt.open("qemu:///system")
    vmd = VmdProcess(tmp_path, debian_image.dir.parent).start()
    term = None
    try:
        with start_ollama([]) as server:
            def goes_away(body):
                server.go_away(5.0)  # Ollama stops mid-reply and is back 5 s later
                return Turn(**{**work.__dict__, "drop_after_chunks": 2})

            server.add(call("plan_tasks", {"tasks": ["write before.txt"]}), goes_away, work,
                       call("finish", {"summary": "before.txt holds its line", "verification": CHECK}))
            env = agent_env(vmd, server.url, VMAGENT_RETRIES="50", VMAGENT_RETRY_BACKOFF_S="0.5")
            term = vmagent_run(env, tmp_path, "modelaway")
            code, out, err = term.finish(timeout=1200)
        session_id = session_of(tmp_path)
        assert code == 0, err[-4000:] + out
        assert "asking again for up to" in err and "answered again after" in err
        assert "The model server failed once and answered again" in out
        assert committed(vmd, "modelaway", "before.txt") == BEFORE + "\n"
        assert f"vmagent-{session_id}" not in domains(conn)
    finally:
        if term is not None:
            term.kill()
        vmd.stop()
        clean_up_domains(conn, str(tmp_path))
        conn.close()


def test_a_model_repeating_a_refused_finish_on_a_real_guest_ends_within_10_turns(tmp_path, debian_image):
    import libvirt

    # The task stays open, so every finish is refused; before the stuck detector the job ran to
    # the step cap (110 turns) on this script.
    script = [call("plan_tasks", {"tasks": ["write before.txt", "check it"]}),
              calls(("write_file", {"path": "/mnt/project/before.txt", "content": BEFORE + "\n"}),
                    ("run", {"command": "cat /mnt/project/before.txt"}))]
    script += [call("finish", {"summary": "done", "verification": {"command": CHECK}})] * 30
    conn = libvirt.open("qemu:///system")
    vmd = VmdProcess(tmp_path, debian_image.dir.parent).start()
    term = None
    try:
        with start_ollama(script) as server:
            term = vmagent_run(agent_env(vmd, server.url), tmp_path, "stuck")
            code, out, err = term.finish(timeout=1200)
        session_id = session_of(tmp_path)
        assert code == 1, err[-4000:] + out
        assert len(server.chat_requests) <= 10, f"{len(server.chat_requests)} model turns"
        assert "stuck in a loop" in out and "`finish" in out and "refused" in out, out
        # the model was told once what to do instead before the job was ended
        assert any("change approach" in r for r in tool_results(server.chat_requests[-1]))
        # the honest work before it is kept: committed, and no guest left behind
        assert committed(vmd, "stuck", "before.txt") == BEFORE + "\n"
        assert f"vmagent-{session_id}" not in domains(conn)
    finally:
        if term is not None:
            term.kill()
        vmd.stop()
        clean_up_domains(conn, str(tmp_path))
        conn.close()
