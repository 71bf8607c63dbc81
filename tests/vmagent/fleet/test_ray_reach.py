"""The job service reaches a Ray job's own vmd, the vmd of the host it ran on (issue 25).

With the Ray executor the service has no vmd of its own (here: no vmd_socket at all, and
no VMD_SOCKET in its environment). What it still asks of a job's vmd after the job's
worker is gone (the /ask history, the close of a session whose shim died, a pending
push) goes to the job's last host (host.json) through a Ray task pinned to that node
(vmagent/fleet/on_host.py). One cluster for the module: hosts "a" and "b", each with its
own real vmd (stand-in machines), the real worker, one scripted Ollama.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.support.loop_harness import call, calls
from tests.support.ray_fleet import host_of, stand_in_fleet
from tests.support.ray_fleet import ray_service as fleet_service
from tests.support.service_harness import wait_for_state
from tests.vmagent.service.test_service_api import start, wait_for_event, worker_pid
from vmagent.link import DEFAULT_SOCKET
from vmagent.fleet.host_labels import HostLabels

PLAN = call("plan_tasks", {"tasks": ["write greet.py"]}, content="Planning.")
WORK = calls(("write_file", {"path": "greet.py", "content": "print('hi from reach')\n"}),
             ("run", {"command": "python3 greet.py"}),
             ("update_task", {"id": 1, "status": "done", "note": "written"}))
FINISH = call("finish", {"summary": "greet.py greets", "verification": {"command": "python3 greet.py | grep -q hi"}})


def _assistant_turns(body: dict) -> int:
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


def script(body: dict):
    first = next((str(m.get("content", "")) for m in body.get("messages") or [] if m.get("role") == "user"), "")
    n = _assistant_turns(body)
    if "keep working" in first:
        return PLAN if n == 0 else call("run", {"command": f"sleep 0.3; echo working {n}"})
    return [PLAN, WORK, FINISH][min(n, 2)]


# --- without Ray: where a node's vmd socket comes from ---------------------------------------

def test_a_node_without_a_socket_label_uses_its_vmd_socket_environment_else_the_default():
    assert HostLabels.from_labels({"vmagent-host": "a", "vmagent-vmd-socket": "/run/a.sock"},
                                  environ={"VMD_SOCKET": "/run/env.sock"}).vmd_socket == "/run/a.sock"
    assert HostLabels.from_labels({"vmagent-host": "a"}, environ={"VMD_SOCKET": "/run/env.sock"}) == \
        HostLabels(host="a", vmd_socket="/run/env.sock")
    assert HostLabels.from_labels({"vmagent-host": "a"}, environ={}).vmd_socket == DEFAULT_SOCKET


# --- a real Ray cluster ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    pytest.importorskip("ray")
    with stand_in_fleet(tmp_path_factory.mktemp("reach"), script) as made:
        yield made


@contextlib.contextmanager
def ray_service(tmp_path: Path, fleet):
    with fleet_service(tmp_path, fleet) as (svc, client):
        # No vmd_socket in its settings (the harness leaves VMD_* out of its environment too).
        assert "vmd_socket" not in svc.config
        yield svc, client



@pytest.mark.ray
def test_ask_reads_the_projects_history_from_the_jobs_host(tmp_path, fleet):
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "write greet.py", project="reach")
        done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=120)
        assert done["state"] == "done", done["report"]
        asked = alice.post(f"/jobs/{job['id']}/ask", json={"question": "what changed in greet.py?"})
        assert asked.status_code == 200, asked.text
        answer = asked.json()
        assert "git" in answer["sources"], answer
        assert "could not be asked" not in answer["answer"]
        # The file in the project's commits, as only that host's vmd has them.
        assert any(line.startswith("[git]") and "greet.py" in line for line in answer["answer"].splitlines()), \
            answer["answer"]


@pytest.mark.ray
def test_ask_about_a_job_whose_host_is_gone_says_history_is_not_part_of_the_answer(tmp_path, fleet):
    cluster, vmds, _ = fleet
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "write greet.py (gone)", project="reach-gone")
        done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=120)
        assert done["state"] == "done", done["report"]
        host = host_of(fleet, done["session_id"])
        cluster.remove_host(host)
        try:
            answer = alice.post(f"/jobs/{job['id']}/ask", json={"question": "what is the history of greet.py on its host?"}).json()
            assert f"host {host} is gone from the Ray cluster" in answer["answer"]
            assert "so it is not part of this answer" in answer["answer"]
        finally:
            cluster.add_host(host, vmds[host].socket)


@pytest.mark.ray
def test_a_job_whose_shim_is_killed_is_salvaged_with_its_session_closed_on_its_host(tmp_path, fleet):
    _, vmds, _ = fleet
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "keep working until killed", project="reach-killed")
        wait_for_event(alice, job["id"], lambda e: str(e.get("line", "")).startswith("working"), timeout=90)
        session = alice.get(f"/jobs/{job['id']}").json()["session_id"]
        host = host_of(fleet, session)
        os.kill(worker_pid(svc, job["id"]), signal.SIGKILL)  # the shim, on the service's machine
        failed = wait_for_state(alice, job["id"], {"failed"}, timeout=120)
        # vmd's own report of the close, from that host's record, leads the salvage report.
        assert failed["report"].startswith("# vmagent session "), failed["report"][:500]
        assert "killed by signal 9" in failed["report"]
        assert any(e["kind"] == "close" for e in vmds[host].record(session))
        assert vmds[host].machines.machines[f"vmagent-{session}"].destroyed


@pytest.mark.ray
def test_a_host_without_a_socket_label_is_reached_at_the_vmd_socket_its_ray_start_had(tmp_path, fleet, monkeypatch):
    """`ray start` with only the host's name: its workers inherit VMD_SOCKET from it."""
    from tests.support.ray_harness import RayHost
    from vmagent.fleet.host_labels import HOST_LABEL

    cluster, vmds, _ = fleet
    monkeypatch.setenv("VMD_SOCKET", str(vmds["a"].socket))  # the environment its node starts in
    node = cluster.cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", labels={HOST_LABEL: "c"})
    monkeypatch.delenv("VMD_SOCKET")
    cluster.hosts["c"] = RayHost("c", str(vmds["a"].socket), node, node.node_id)
    try:
        with ray_service(tmp_path, fleet) as (svc, alice):
            listed = alice.get("/hosts")
            assert listed.status_code == 200, listed.text
            c = next(h for h in listed.json()["hosts"] if h["name"] == "c")
            # Its vmd answered (a's, at the socket of the node's environment): no error, seen now.
            assert c["alive"] and c["error"] is None and c["last_seen"] is not None, c
            assert c["sessions"] is not None and c["images"] == next(
                h for h in listed.json()["hosts"] if h["name"] == "a")["images"]
    finally:
        cluster.remove_host("c")
