"""The job service's "ray" executor: jobs placed across vmd hosts by a real Ray cluster.

One cluster for the module (tests/support/ray_harness.py): a head without guest slots and hosts
"a" and "b", one `vm_slot` each, each naming its own real vmd (stand-in machines,
tests/support/vmd_fakes.py) on its own socket and state folder. The job service is a real process
with VMAGENT_EXECUTOR=ray and RAY_ADDRESS; each job's shim places a JobHost actor, which
runs the real worker (vmagent.worker and the loop) against its host's vmd. The model is
one scripted Ollama server for every job: each job's turns are keyed on its task's words.
Where a job ran is read from the vmds' own state folders.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import pytest

from tests.support.loop_harness import call, calls, user_texts
from tests.support.ollama_server import Turn
from tests.support.service_harness import ServiceProcess, wait_for_state
from tests.vmagent.service.test_service_api import start, wait_for_event

ray = pytest.importorskip("ray")
# CI requires these to run (a real Ray cluster: .ci/run, tests/conftest.py).
pytestmark = pytest.mark.ray
from tests.support.ray_fleet import host_of, ray_service, stand_in_fleet  # noqa: E402  (needs ray)

PLAN = call("plan_tasks", {"tasks": ["write hello.py", "check it prints hello"]}, content="Planning.")
WORK = calls(("write_file", {"path": "hello.py", "content": "print('hello')\n"}),
             ("run", {"command": "python3 hello.py"}),
             ("update_task", {"id": 1, "status": "done", "note": "written"}),
             ("update_task", {"id": 2, "status": "done", "note": "prints hello"}))
FINISH = call("finish", {"summary": "hello.py prints hello",
                         "verification": {"command": "python3 hello.py | grep -q hello"}})
LOST_WORDS = "The machine was lost with its host"


def _assistant_turns_since(body: dict, marker: str | None) -> int:
    """How many turns the model gave, counted from the last user message holding `marker`
    (from the start when None or not there)."""
    messages = body.get("messages") or []
    start_at = 0
    if marker:
        for i, m in enumerate(messages):
            if m.get("role") == "user" and marker in str(m.get("content", "")):
                start_at = i
    return sum(1 for m in messages[start_at:] if m.get("role") == "assistant")


def busy(body: dict) -> Turn:
    """A job that keeps working (a command a step) until it is cancelled or its host dies;
    on a new machine it plans again and goes on."""
    n = _assistant_turns_since(body, None)
    if n == 0 or (any(LOST_WORDS in t for t in user_texts(body)) and _assistant_turns_since(body, LOST_WORDS) == 0):
        return PLAN
    return call("run", {"command": f"sleep 0.3; echo working {n}"})


def asks_then_finishes(body: dict) -> Turn:
    """Plan, ask a question; after the answer (on its own machine) work and finish; on a
    new machine (its host was lost) plan again first."""
    if any(LOST_WORDS in t for t in user_texts(body)):
        return [PLAN, WORK, FINISH][min(_assistant_turns_since(body, LOST_WORDS), 2)]
    return [PLAN, call("ask_user", {"question": "Python 2 or 3?"}), WORK, FINISH][
        min(_assistant_turns_since(body, None), 3)]


class Scripts:
    """One model for several jobs at once: the job's first user message holds its task."""

    def __init__(self, scripts: dict[str, Callable[[dict], Turn]]):
        self.scripts = scripts

    def __call__(self, body: dict) -> Turn:
        first = next((str(m.get("content", "")) for m in body.get("messages") or []
                      if m.get("role") == "user"), "")
        for words, script in self.scripts.items():
            if words in first:
                return script(body)
        return Turn(status=400, error="no script for this task")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(cluster, {host: vmd}, scripted Ollama server)."""
    scripts = Scripts({"keep working": busy, "ask first": asks_then_finishes})
    with stand_in_fleet(tmp_path_factory.mktemp("fleet"), scripts) as made:
        yield made


def events_of(client, job_id: str) -> list[dict]:
    body = client.get(f"/jobs/{job_id}/events", params={"follow": "false"}).text
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith('data: {"type')]


def running_session(client, job_id: str, timeout: float = 90) -> str:
    """Waits until the job works on its machine; its session id."""
    wait_for_event(client, job_id, lambda e: str(e.get("line", "")).startswith("working"), timeout=timeout)
    return client.get(f"/jobs/{job_id}").json()["session_id"]


def machine_destroyed(fleet, host: str, session_id: str) -> bool:
    _, vmds, _ = fleet
    machine = vmds[host].machines.machines.get(f"vmagent-{session_id}")
    return machine is not None and machine.destroyed


def wait_until(predicate, timeout: float, what: str, seen=None) -> None:
    """`seen`: what the failure shows of the state the wait ended in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f"; seen: {seen()!r}" if seen else ""))


def test_jobs_spread_over_hosts_a_third_waits_for_a_slot_and_cancel_reaches_the_host(tmp_path, fleet):
    with ray_service(tmp_path, fleet) as (svc, alice):
        first = start(alice, "keep working one", project="one")
        second = start(alice, "keep working two", project="two")
        one, two = running_session(alice, first["id"]), running_session(alice, second["id"])
        # Two jobs at once, one per host: each host's vmd holds one of the sessions.
        hosts = {host_of(fleet, one), host_of(fleet, two)}
        assert hosts == {"a", "b"}
        host_one = host_of(fleet, one)
        assert any(e.get("text") == f"running on host {host_one}" for e in events_of(alice, first["id"]))

        # Both slots taken: the third waits in Ray and says so, with no machine anywhere.
        third = start(alice, "keep working three", project="three")
        wait_for_event(alice, third["id"], lambda e: e.get("text") == "waiting for a free host", timeout=60)
        assert alice.get(f"/jobs/{third['id']}").json()["session_id"] is None

        # Cancel reaches the remote worker: the loop closes its vmd session on that host.
        alice.post(f"/jobs/{first['id']}/cancel")
        cancelled = wait_for_state(alice, first["id"], {"cancelled", "failed"}, timeout=60)
        assert cancelled["state"] == "cancelled", cancelled["report"]
        assert cancelled["session_id"] == one and "killed by signal" not in cancelled["report"]
        assert machine_destroyed(fleet, host_one, one)

        # The freed slot goes to the waiting job, on the host the cancelled one left.
        three = running_session(alice, third["id"])
        assert host_of(fleet, three) == host_one
        for job in (second, third):
            alice.post(f"/jobs/{job['id']}/cancel")
        for job in (second, third):
            assert wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=60)["state"] == "cancelled"


def test_a_service_restart_re_attaches_to_a_job_running_on_a_host(tmp_path, fleet):
    """The shim outlives the service like a local worker: the new service reads on."""
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "keep working across a restart", project="restart")
        session = running_session(alice, job["id"])
        svc.stop(kill=True)
        svc.start()
        alice = svc.client()
        seen = len(events_of(alice, job["id"]))
        wait_until(lambda: len(events_of(alice, job["id"])) > seen + 3, 60, "new events after the restart")
        assert alice.get(f"/jobs/{job['id']}").json()["session_id"] == session
        alice.post(f"/jobs/{job['id']}/cancel")
        assert wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=60)["state"] == "cancelled"


def test_a_job_no_host_can_run_fails_at_once_saying_what_is_missing(tmp_path, fleet):
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "a windows job", project="win", os="windows")
        failed = wait_for_state(alice, job["id"], {"failed", "done"}, timeout=60)
        assert failed["state"] == "failed"
        assert "No host in the Ray cluster offers vm_slot, os_windows" in failed["report"]


def host_record(svc: ServiceProcess, job_id: str) -> dict:
    return json.loads((svc.data_dir / "jobs" / job_id / "host.json").read_text())


def test_an_answered_question_resumes_on_the_host_whose_guest_waits(tmp_path, fleet):
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "ask first, then write hello.py", project="asked")
        waiting = wait_for_state(alice, job["id"], {"needs_input", "failed"}, timeout=90)
        assert waiting["state"] == "needs_input", waiting["report"]
        where = host_record(svc, job["id"])
        alice.post(f"/jobs/{job['id']}/answer", json={"answer": "3, please"})
        done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=90)
        assert done["state"] == "done" and done["verification_passed"] is True, done["report"]
        # The same guest: the same session, on the same host and Ray node.
        assert done["session_id"] == waiting["session_id"]
        assert host_of(fleet, done["session_id"]) == where["host"]
        runs = host_record(svc, job["id"])["runs"]
        assert [r["node_id"] for r in runs] == [where["node_id"]] * 2
        assert [r["why"] for r in runs] == ["question", "done"]


def test_cancel_of_a_waiting_job_closes_its_guest_on_its_host(tmp_path, fleet):
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "ask first, then be cancelled", project="asked-cancel")
        waiting = wait_for_state(alice, job["id"], {"needs_input", "failed"}, timeout=90)
        assert waiting["state"] == "needs_input", waiting["report"]
        host = host_record(svc, job["id"])["host"]
        alice.post(f"/jobs/{job['id']}/cancel")
        cancelled = wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=60)
        assert cancelled["state"] == "cancelled", cancelled["report"]
        assert machine_destroyed(fleet, host, waiting["session_id"])


def test_a_resume_whose_host_is_gone_runs_again_on_another_host(tmp_path, fleet):
    cluster, vmds, server = fleet
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "ask first, then write hello.py (gone)", project="gone")
        waiting = wait_for_state(alice, job["id"], {"needs_input", "failed"}, timeout=90)
        assert waiting["state"] == "needs_input", waiting["report"]
        lost_host = host_record(svc, job["id"])["host"]
        other = "b" if lost_host == "a" else "a"
        cluster.remove_host(lost_host)
        try:
            alice.post(f"/jobs/{job['id']}/answer", json={"answer": "3, please"})
            done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=120)
            assert done["state"] == "done", done["report"]
            # A new machine on the other host, told why, with the person's answer.
            assert done["session_id"] != waiting["session_id"]
            assert host_of(fleet, done["session_id"]) == other
            texts = [t for body in server.chat_requests if "(gone)" in json.dumps(body)
                     for t in user_texts(body)]
            assert any(LOST_WORDS in t and "3, please" in t for t in texts) or (
                any(LOST_WORDS in t for t in texts) and any("3, please" in t for t in texts))
            events = events_of(alice, job["id"])
            assert any(e.get("text", "").startswith(f"host {lost_host} lost") for e in events)
            runs = host_record(svc, job["id"])["runs"]
            assert [r["host"] for r in runs] == [lost_host, other]
            assert runs[0]["why"].startswith("question, then lost: host ")
        finally:
            cluster.add_host(lost_host, vmds[lost_host].socket)


def test_a_job_whose_host_dies_runs_again_elsewhere_and_after_two_losses_fails_naming_the_hosts(tmp_path, fleet):
    cluster, vmds, _ = fleet
    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "keep working through losses", project="losses")
        first_session = running_session(alice, job["id"])
        first_host = host_of(fleet, first_session)
        lost = [first_host]
        cluster.remove_host(first_host)
        # Run again on the other host: a new session there, still working.
        wait_for_event(alice, job["id"], lambda e: e.get("text", "").startswith(f"host {first_host} lost"),
                       timeout=60)
        second_host = "b" if first_host == "a" else "a"
        wait_for_event(alice, job["id"], lambda e: e.get("text") == f"running on host {second_host}", timeout=60)
        wait_until(lambda: host_record(svc, job["id"])["host"] == second_host, 30, "the second run")
        second_session = None

        def working_on_second() -> bool:
            nonlocal second_session
            sid = alice.get(f"/jobs/{job['id']}").json()["session_id"]
            if sid and (vmds[second_host].config.sessions_dir / sid).is_dir():
                second_session = sid
                return True
            return False

        wait_until(working_on_second, 90, f"a session on host {second_host}")
        assert alice.get(f"/jobs/{job['id']}").json()["state"] == "running"
        # The old worker died with its host's actor (PR_SET_PDEATHSIG): nothing drives the
        # old session any more, so only the re-run works on the job.
        steps = len(vmds[first_host].record(first_session))
        time.sleep(2)
        assert len(vmds[first_host].record(first_session)) == steps
        # A third host joins (with a's vmd), the second dies: the last re-run goes there.
        cluster.add_host("c", vmds[first_host].socket)
        cluster.remove_host(second_host)
        lost.append(second_host)
        wait_for_event(alice, job["id"], lambda e: e.get("text") == "running on host c", timeout=60)
        cluster.remove_host("c")
        lost.append("c")
        failed = wait_for_state(alice, job["id"], {"failed", "done", "cancelled"}, timeout=90)
        assert failed["state"] == "failed", failed["report"]
        report = failed["report"]
        assert "lost its host 3 times" in report
        for name in lost:
            assert f"host {name} lost" in report
        assert [r["host"] for r in host_record(svc, job["id"])["runs"]] == lost
    for name, vmd in vmds.items():  # later tests (if any) get their hosts back
        if name not in cluster.hosts:
            cluster.add_host(name, vmd.socket)


# --- capacity that tells the truth, and hosts that cannot take a job (issue 38) -------------

def old_vmagent_on_path(tmp_path) -> str:
    """A folder that, first on a host's PYTHONPATH, makes the vmagent there another version:
    the package metadata `pip install vmagent==0.0.1` would leave."""
    dist = tmp_path / "old-vmagent" / "vmagent-0.0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vmagent\nVersion: 0.0.1\n")
    return str(dist.parent)


def hosts_listing(client) -> dict[str, dict]:
    return {h["name"]: h for h in client.get("/hosts", timeout=60).json()["hosts"]}


def counts_become(client, expected: dict[str, tuple], timeout: float = 30) -> dict[str, dict]:
    """GET /hosts until each host's (slots used, slots total) is as expected (Ray's free counts
    reach its GCS a moment after a placement). Sessions are the hosts' vmds' own count, which
    the module's earlier tests add to (a lost host's session waits for vmd's reaper)."""
    deadline = time.monotonic() + timeout
    while True:
        hosts = hosts_listing(client)
        seen = {n: (hosts[n]["slots_used"], hosts[n]["slots_total"]) for n in expected if n in hosts}
        if seen == expected or time.monotonic() > deadline:
            assert seen == expected, hosts
            return hosts
        time.sleep(1)


def test_hosts_that_cannot_take_a_job_are_listed_unusable_and_get_none(tmp_path, fleet):
    from tests.support.vmd_fakes import SilentVmd, short_socket_dir

    cluster, vmds, _ = fleet
    stuck = SilentVmd()
    bad = {"old": (vmds["a"].socket, {"PYTHONPATH": old_vmagent_on_path(tmp_path)}),
           "nosock": (str(short_socket_dir() / "nothing.sock"), None),
           "stuck": (str(stuck.path), None)}
    try:
        for name, (socket_path, env) in bad.items():
            cluster.add_host(name, socket_path, env=env)
        with ray_service(tmp_path, fleet) as (svc, alice):
            first = start(alice, "keep working u1", project="u1")
            second = start(alice, "keep working u2", project="u2")
            one, two = running_session(alice, first["id"], 180), running_session(alice, second["id"], 180)
            assert {host_of(fleet, one), host_of(fleet, two)} == {"a", "b"}

            # Both good hosts busy: Ray offers the third job each bad host in turn; each is
            # found unusable, said so and avoided, and the job waits for a good one.
            third = start(alice, "keep working u3", project="u3")
            reasons = {"old": "it runs vmagent 0.0.1 and the job service", "nosock": "nothing.sock",
                       "stuck": "timed out"}
            wait_until(lambda: all(any(str(e.get("text", "")).startswith(f"host {n} is unusable:") and
                                       reasons[n] in e["text"] for e in events_of(alice, third["id"]))
                                   for n in bad), 120, "the third job to find each bad host unusable",
                       seen=lambda: [e.get("text") or e.get("type") for e in events_of(alice, third["id"])][-12:])
            assert alice.get(f"/jobs/{third['id']}").json()["session_id"] is None
            texts = [str(e.get("text", "")) for e in events_of(alice, third["id"])]
            assert not any(t.startswith("running on host") for t in texts), texts

            # The listing says the same, with the reasons, and counts the good hosts full.
            hosts = counts_become(alice, {"a": (1, 1), "b": (1, 1)})
            assert hosts["a"]["usable"] and hosts["b"]["usable"]
            for name, reason in reasons.items():
                assert not hosts[name]["usable"] and reason.split(" and")[0] in hosts[name]["problem"], hosts[name]
            assert hosts["old"]["vmagent_version"] == "0.0.1"

            # A good slot frees: the third job runs there, and never on a bad host.
            alice.post(f"/jobs/{first['id']}/cancel")
            three = running_session(alice, third["id"], 120)
            assert host_of(fleet, three) == host_of(fleet, one)
            for job in (second, third):
                alice.post(f"/jobs/{job['id']}/cancel")
            for job in (first, second, third):
                assert wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=60)["state"] == "cancelled"
            for job in (first, second, third):
                assert {r["host"] for r in host_record(svc, job["id"])["runs"]} <= {"a", "b"}
    finally:
        for name in bad:
            if name in cluster.hosts:
                cluster.remove_host(name, graceful=True)
        stuck.close()


def job_actor_pid(job_session: str) -> int:
    """The Ray worker process holding the job's JobHost actor: the parent of the job's
    worker (`vmagent.worker --job-dir .../vmagent-job-...`), found by its session's folder."""
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if b"vmagent.worker" not in b" ".join(cmdline) or not any(b"vmagent-job-" in a for a in cmdline):
            continue
        job_dir = Path(cmdline[cmdline.index(b"--job-dir") + 1].decode())
        try:
            transcript = (job_dir / "transcript.json").read_text()
        except OSError:
            continue
        if job_session in transcript:
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            assert b"JobHost" in (Path(f"/proc/{ppid}") / "cmdline").read_bytes()
            return ppid
    raise AssertionError(f"no worker of session {job_session} found")


def test_an_actor_killed_on_a_live_host_is_told_apart_from_a_lost_host(tmp_path, fleet):
    import os
    import signal

    with ray_service(tmp_path, fleet) as (svc, alice):
        job = start(alice, "keep working after its actor dies", project="actor")
        session = running_session(alice, job["id"])
        host = host_of(fleet, session)
        os.kill(job_actor_pid(session), signal.SIGKILL)  # the actor's process alone; the host lives
        wait_for_event(alice, job["id"], lambda e: str(e.get("text", "")).startswith(
            f"the job's process on host {host} died while the host lives"), timeout=90)
        wait_until(lambda: len(host_record(svc, job["id"])["runs"]) == 2, 60, "the job's second run")
        texts = [str(e.get("text", "")) for e in events_of(alice, job["id"])]
        assert not any(t.startswith(f"host {host} lost") for t in texts), texts
        runs = host_record(svc, job["id"])["runs"]
        assert runs[0]["why"].startswith("actor died, host alive: ")
        # The guest the dead worker drove is closed on its live host before the re-run: the
        # host never runs it beside the re-run's.
        assert f"closed the job's session on host {host}" in texts
        assert machine_destroyed(fleet, host, session)
        wait_until(lambda: alice.get(f"/jobs/{job['id']}").json()["session_id"] not in (None, session), 90,
                   "a new session for the re-run")
        alice.post(f"/jobs/{job['id']}/cancel")
        assert wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=60)["state"] == "cancelled"


def test_an_answer_takes_back_a_slot_on_its_host_before_its_guest_resumes(tmp_path, fleet):
    """A job waiting for a person holds no slot (its guest is suspended): another job may
    take it. The answer then waits for a slot on that host, the guest suspended meanwhile,
    so a host never runs more guests than its slots. GET /hosts counts what runs."""
    _, vmds, _ = fleet
    with ray_service(tmp_path, fleet) as (svc, alice):
        sessions_before = {n: h["sessions"] for n, h in hosts_listing(alice).items()}
        asked = start(alice, "ask first, then wait for its slot", project="slot")
        waiting = wait_for_state(alice, asked["id"], {"needs_input", "failed"}, timeout=90)
        assert waiting["state"] == "needs_input", waiting["report"]
        host = host_record(svc, asked["id"])["host"]
        other = "b" if host == "a" else "a"
        busy_jobs = [start(alice, f"keep working s{n}", project=f"s{n}") for n in (1, 2)]
        sessions = [running_session(alice, j["id"]) for j in busy_jobs]
        beside = busy_jobs[[host_of(fleet, s) for s in sessions].index(host)]
        # Each host runs one guest in its one slot; the host of the question keeps the
        # suspended guest too, counted as a session, not a slot.
        hosts = counts_become(alice, {host: (1, 1), other: (1, 1)})
        assert hosts[host]["sessions"] - sessions_before[host] == 2
        assert hosts[other]["sessions"] - sessions_before[other] == 1

        alice.post(f"/jobs/{asked['id']}/answer", json={"answer": "3, please"})
        wait_for_event(alice, asked["id"], lambda e: e.get("text") == f"waiting for host {host} to have a free slot",
                       timeout=60)
        time.sleep(2)
        machine = vmds[host].machines.machines[f"vmagent-{waiting['session_id']}"]
        assert machine.suspended and not machine.destroyed  # not resumed without a slot

        alice.post(f"/jobs/{beside['id']}/cancel")
        done = wait_for_state(alice, asked["id"], {"done", "failed"}, timeout=120)
        assert done["state"] == "done" and done["session_id"] == waiting["session_id"], done["report"]
        assert [r["host"] for r in host_record(svc, asked["id"])["runs"]] == [host, host]
        counts_become(alice, {host: (0, 1), other: (1, 1)})
        for job in busy_jobs:
            alice.post(f"/jobs/{job['id']}/cancel")
        for job in busy_jobs:
            assert wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=60)["state"] == "cancelled"


def test_ray_calling_an_actor_unavailable_is_no_verdict_but_its_death_is():
    """The shim waits on ActorUnavailableError while the actor's node lives (a restart or a
    network hiccup of Ray's), and takes ActorDiedError to Ray's word on the node."""
    from ray import exceptions

    from vmagent.fleet import placement

    unavailable = exceptions.ActorUnavailableError("The actor is temporarily unavailable", None)
    died = exceptions.ActorDiedError()
    assert placement.is_unavailable(unavailable) and not placement.is_unavailable(died)
    assert isinstance(unavailable, placement.lost_errors()) and isinstance(died, placement.lost_errors())
    assert not placement.creation_failed(died)
