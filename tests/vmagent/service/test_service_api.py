"""The job service over real HTTP: a real `vmagent serve` process, real worker processes.

Tests marked `uses_scripted_worker` run tests/support/scripted_worker.py as the job process (same
command line, job.json and NDJSON frames as vmagent.worker); they switch to the real worker
once the turn loop, tests/support/ollama_server.py and vmd can run jobs here. What they show
about the service (auth, restart, kill, cancel, queue) does not depend on which runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time

import httpx
import pytest

from tests.support.loop_harness import call, running_vmd, user_texts
from tests.support.ollama_server import start_ollama
from tests.support.service_harness import (ALICE, BOB, REAL_WORKER, SERVICE, ServiceProcess, real_worker_env, stop_workers,
                                           uses_scripted_worker, vmd_project_repo, wait_for_state)
from tests.vmagent.loop.test_loop import PLAN, finish_script


@pytest.fixture
def service(tmp_path):
    svc = ServiceProcess(tmp_path / "svc").start()
    yield svc
    svc.stop()
    stop_workers(svc)


def worker_pid(svc: ServiceProcess, job_id: str) -> int:
    with sqlite3.connect(svc.data_dir / "jobs.sqlite3") as conn:
        return conn.execute("SELECT worker_pid FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]


def start(client: httpx.Client, task: str, **extra) -> dict:
    response = client.post("/jobs", json={"task": task, "chat_id": extra.pop("chat_id", "chat-1"), **extra})
    assert response.status_code == 201, response.text
    return response.json()


def wait_for_event(client: httpx.Client, job_id: str, predicate, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with client.stream("GET", f"/jobs/{job_id}/events", params={"follow": "false"}) as stream:
            body = stream.read().decode()
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {\"type")]
        if any(predicate(e) for e in events):
            return
        time.sleep(0.1)
    raise AssertionError(f"no matching event for job {job_id}")


# --- a job's life ------------------------------------------------------------------------

@uses_scripted_worker
def test_a_job_runs_to_a_report_with_its_events_in_order(service):
    alice = service.client()
    job = start(alice, "write hello world in main.py")
    assert job["owner"] == "alice" and job["state"] in ("queued", "running")
    assert "/jobs/%s/preview?token=" % job["id"] in job["preview_url"]
    done = wait_for_state(alice, job["id"], "done")
    assert done["report"].startswith("# Job done") and done["verification_passed"] is True
    assert done["verification"] == {"passed": True, "proven": True, "attempts": 1}
    assert done["session_id"] == "sess-1" and done["steps"] == 3
    assert done["tasks"].startswith("1. [done]") and done["preview_ready"] is True
    with alice.stream("GET", f"/jobs/{job['id']}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = stream.read().decode()
    kinds = [json.loads(l[6:])["type"] for l in body.splitlines() if l.startswith("data: {\"type")]
    assert kinds[:2] == ["state", "state"] and "command" in kinds and "screenshot" in kinds
    assert kinds[-2:] == ["done", "state"] and body.rstrip().endswith('"seq": %d}' % len(kinds))
    png = alice.get(f"/jobs/{job['id']}/screen.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


@uses_scripted_worker
@pytest.mark.parametrize("task, state, verification", [
    ("write main.py", "done", {"passed": True, "proven": True, "attempts": 1}),
    ("not proven: the check passes before the work too", "done", {"passed": True, "proven": False, "attempts": 2}),
    ("check fails three times", "failed", {"passed": False, "proven": None, "attempts": 3}),
], ids=["verified", "passed-not-proven", "failed"])
def test_the_job_api_shows_vmds_verification(service, task, state, verification):
    alice = service.client()
    job = start(alice, task, chat_id=f"chat-{state}-{verification['attempts']}")
    assert job["verification"] == {"passed": None, "proven": None, "attempts": 0}
    ended = wait_for_state(alice, job["id"], state)
    assert ended["verification"] == verification
    assert ended["verification_passed"] is verification["passed"]  # kept for older clients
    [listed] = alice.get("/jobs", params={"chat_id": job["chat_id"]}).json()["jobs"]
    assert listed["verification"] == verification


def test_an_older_job_database_gains_the_verification_columns(tmp_path):
    from vmagent.service.store import Store

    db = tmp_path / "jobs.sqlite3"
    with sqlite3.connect(db) as conn:  # the jobs table before `verification_proven`, `verification_attempts`
        conn.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, chat_id TEXT NOT NULL DEFAULT '', "
                     "message_id TEXT NOT NULL DEFAULT '', task TEXT NOT NULL, os TEXT NOT NULL, project TEXT, "
                     "model TEXT, state TEXT NOT NULL, question TEXT, report TEXT, session_id TEXT, "
                     "verification_passed INTEGER, steps INTEGER NOT NULL DEFAULT 0, status_line TEXT NOT NULL "
                     "DEFAULT '', tasks_text TEXT NOT NULL DEFAULT '', preview_ready INTEGER NOT NULL DEFAULT 0, "
                     "screenshot_seq INTEGER NOT NULL DEFAULT 0, preview_secret TEXT NOT NULL, worker_pid INTEGER, "
                     "frames_offset INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL, "
                     "ended REAL)")
        for job_id, state, passed in (("verified", "done", 1), ("failed", "done", 0), ("unverified", "failed", None)):
            conn.execute("INSERT INTO jobs (id, owner, task, os, state, verification_passed, preview_secret, "
                         "created, updated) VALUES (?, 'alice', 't', 'debian', ?, ?, 's', 1, 2)",
                         (job_id, state, passed))
    store = Store(tmp_path)
    # vmd ran an older job's check once, and never on the project as it was before.
    assert {k: store.get_job("verified")[k] for k in ("verification_passed", "verification_proven",
                                                      "verification_attempts")} == {
        "verification_passed": 1, "verification_proven": None, "verification_attempts": 1}
    assert store.get_job("failed")["verification_attempts"] == 1
    assert store.get_job("unverified")["verification_attempts"] == 0
    job = store.create_job(owner="alice", task="t", os="debian", project=None)
    store.update_job(job["id"], verification_passed=1, verification_proven=0, verification_attempts=2)
    assert store.get_job(job["id"])["verification_proven"] == 0
    store.close()
    Store(tmp_path).close()  # opening it again adds nothing twice


@uses_scripted_worker
def test_events_stream_live_while_the_job_runs(service):
    alice = service.client()
    job = start(alice, "slow job")
    seen = []
    with alice.stream("GET", f"/jobs/{job['id']}/events") as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
            if sum(1 for e in seen if str(e.get("line", "")).startswith("tick")) >= 5:
                break
    assert [e["line"] for e in seen if str(e.get("line", "")).startswith("tick")][:5] == [f"tick {i}" for i in range(5)]
    alice.post(f"/jobs/{job['id']}/cancel")
    wait_for_state(alice, job["id"], "cancelled")


# --- auth --------------------------------------------------------------------------------

@uses_scripted_worker
def test_another_users_job_is_404_everywhere(service):
    alice, bob = service.client(ALICE), service.client(BOB)
    job = start(alice, "ask a question", chat_id="alice-chat")
    wait_for_state(alice, job["id"], "needs_input")
    jid = job["id"]
    assert bob.get(f"/jobs/{jid}").status_code == 404
    assert bob.post(f"/jobs/{jid}/answer", json={"answer": "8080"}).status_code == 404
    assert bob.post(f"/jobs/{jid}/cancel").status_code == 404
    assert bob.post(f"/jobs/{jid}/ask", json={"question": "what?"}).status_code == 404
    assert bob.get(f"/jobs/{jid}/events").status_code == 404
    assert bob.get(f"/jobs/{jid}/screen.png").status_code == 404
    assert bob.get(f"/jobs/{jid}/preview").status_code == 404
    assert bob.get("/jobs", params={"chat_id": "alice-chat"}).json() == {"jobs": []}
    assert alice.get("/jobs", params={"chat_id": "alice-chat"}).json()["jobs"][0]["id"] == jid
    assert wait_for_state(alice, jid, "needs_input")["question"] == "Which port should the server use?"


def test_tokens_and_forwarded_user_headers(service):
    anonymous = httpx.Client(base_url=service.url)
    assert anonymous.get("/jobs").status_code == 401
    assert service.client("not-a-token").get("/jobs").status_code == 401
    # A user token ignores the forwarded headers: anyone can send those.
    job = start(service.client(ALICE, {"X-OpenWebUI-User-Id": "bob"}), "hello")
    assert job["owner"] == "alice"
    # The service token names the user from the headers, and only with them.
    via_webui = service.client(SERVICE, {"X-OpenWebUI-User-Id": "bob", "X-OpenWebUI-User-Email": "bob@example.org"})
    assert start(via_webui, "hello")["owner"] == "bob"
    assert via_webui.get(f"/jobs/{job['id']}").status_code == 404
    assert service.client(SERVICE).get("/jobs").status_code == 401


@uses_scripted_worker
def test_preview_link_opens_only_its_own_job_without_cookies_and_allows_origin_null(service):
    alice = service.client()
    first = wait_for_state(alice, start(alice, "one")["id"], "done")
    second = wait_for_state(alice, start(alice, "two")["id"], "done")
    token = first["preview_url"].split("token=")[1]
    plain = httpx.Client(base_url=service.url)
    page = plain.get(f"/jobs/{first['id']}/preview", params={"token": token}, headers={"Origin": "null"})
    assert page.status_code == 200 and "iframe:height" in page.text and "set-cookie" not in page.headers
    assert page.headers.get("access-control-allow-origin") == "null"
    assert plain.get(f"/jobs/{first['id']}/screen.png", params={"token": token}).content.startswith(b"\x89PNG")
    with plain.stream("GET", f"/jobs/{first['id']}/events", params={"token": token}) as stream:
        assert b"\"done\"" in stream.read()
    assert plain.get(f"/jobs/{second['id']}/screen.png", params={"token": token}).status_code == 403
    expired = "1000." + token.split(".")[1]
    assert plain.get(f"/jobs/{first['id']}/preview", params={"token": expired}).status_code == 403
    preflight = plain.options(f"/jobs/{first['id']}/events", headers={
        "Origin": "null", "Access-Control-Request-Method": "GET"})
    assert preflight.headers.get("access-control-allow-origin") == "null"


# --- questions and approvals ---------------------------------------------------------------

@uses_scripted_worker
def test_an_answer_resumes_the_same_guest(service):
    alice = service.client()
    job = start(alice, "question first")
    waiting = wait_for_state(alice, job["id"], "needs_input")
    assert waiting["question"] == "Which port should the server use?"
    boot_id = json.loads((service.data_dir / "jobs" / job["id"] / "transcript.json").read_text())["boot_id"]
    assert alice.post(f"/jobs/{job['id']}/approve").status_code == 409
    assert alice.post(f"/jobs/{job['id']}/answer", json={"answer": "8080"}).status_code == 200
    done = wait_for_state(alice, job["id"], "done")
    assert "answer='8080'" in done["report"] and f"boot_id={boot_id}" in done["report"]
    assert done["question"] is None
    assert alice.post(f"/jobs/{job['id']}/answer", json={"answer": "again"}).status_code == 409


@uses_scripted_worker
@pytest.mark.parametrize("decision, approved", [("approve", True), ("deny", False)])
def test_an_unfreeze_request_is_approved_or_denied(service, decision, approved):
    alice = service.client()
    job = start(alice, "needs unfreeze")
    waiting = wait_for_state(alice, job["id"], "needs_approval")
    assert "the package index" in waiting["question"]
    assert alice.post(f"/jobs/{job['id']}/answer", json={"answer": "yes"}).status_code == 409
    assert alice.post(f"/jobs/{job['id']}/{decision}", json={"reason": "ok"}).status_code == 200
    done = wait_for_state(alice, job["id"], "done")
    assert f"approved={approved}" in done["report"]


# --- cancel, kill, queue -------------------------------------------------------------------

@uses_scripted_worker
def test_cancel_ends_the_job_with_the_loops_report(service):
    alice = service.client()
    job = start(alice, "slow job")
    wait_for_event(alice, job["id"], lambda e: e.get("line") == "tick 2")
    assert alice.post(f"/jobs/{job['id']}/cancel").status_code == 200
    cancelled = wait_for_state(alice, job["id"], "cancelled", timeout=10)
    assert "Stopped by a person" in cancelled["report"]
    assert alice.post(f"/jobs/{job['id']}/cancel").status_code == 409


@uses_scripted_worker
def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(service):
    alice = service.client()
    job = start(alice, "stubborn job")
    wait_for_event(alice, job["id"], lambda e: e.get("line") == "tick 1")
    began = time.time()
    alice.post(f"/jobs/{job['id']}/cancel")
    cancelled = wait_for_state(alice, job["id"], "cancelled", timeout=15)
    assert 2.5 < time.time() - began < 10
    assert "killed by signal 9" in cancelled["report"] and "tick" in cancelled["report"]


@uses_scripted_worker
def test_a_waiting_job_is_cancelled_through_its_guest(service):
    alice = service.client()
    job = start(alice, "question first")
    wait_for_state(alice, job["id"], "needs_input")
    alice.post(f"/jobs/{job['id']}/cancel")
    cancelled = wait_for_state(alice, job["id"], "cancelled")
    assert "Cancelled while waiting" in cancelled["report"]


@uses_scripted_worker
def test_a_worker_killed_mid_job_leaves_a_failed_job_with_a_report(service):
    alice = service.client()
    job = start(alice, "slow job")
    wait_for_event(alice, job["id"], lambda e: e.get("line") == "tick 3")
    os.kill(worker_pid(service, job["id"]), signal.SIGKILL)
    failed = wait_for_state(alice, job["id"], "failed")
    report = failed["report"]
    assert "worker process ended before it wrote a report (killed by signal 9)" in report
    assert "Last status: working" in report and "write main.py" in report
    assert "$ python3 main.py" in report and "tick 3" in report


@uses_scripted_worker
def test_a_worker_that_crashes_leaves_its_log_in_the_report(service):
    alice = service.client()
    failed = wait_for_state(alice, start(alice, "crash please")["id"], "failed")
    assert "(exit code 3)" in failed["report"] and "$ make build" in failed["report"]
    assert "crashing on purpose" in failed["report"]


@uses_scripted_worker
def test_jobs_beyond_the_limit_wait_in_the_queue(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", max_concurrent=1).start()
    try:
        alice = svc.client()
        first, second, third = (start(alice, f"slow job {n}") for n in range(3))
        wait_for_state(alice, first["id"], "running")
        time.sleep(0.5)
        assert alice.get(f"/jobs/{second['id']}").json()["state"] == "queued"
        assert alice.get(f"/jobs/{third['id']}").json()["state"] == "queued"
        alice.post(f"/jobs/{third['id']}/cancel")
        assert "before it started" in wait_for_state(alice, third["id"], "cancelled")["report"]
        alice.post(f"/jobs/{first['id']}/cancel")
        wait_for_state(alice, second["id"], "running")
        alice.post(f"/jobs/{second['id']}/cancel")
        wait_for_state(alice, second["id"], "cancelled")
    finally:
        svc.stop()
        stop_workers(svc)


# --- restart -----------------------------------------------------------------------------

@uses_scripted_worker
def test_a_restart_keeps_every_state_and_leaves_nothing_running_without_a_worker(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", max_concurrent=2).start()
    try:
        alice = svc.client()
        done = wait_for_state(alice, start(alice, "plain")["id"], "done")
        failed = wait_for_state(alice, start(alice, "crash")["id"], "failed")
        question = wait_for_state(alice, start(alice, "question")["id"], "needs_input")
        approval = wait_for_state(alice, start(alice, "unfreeze")["id"], "needs_approval")
        survivor = start(alice, "slow survivor")
        orphan = start(alice, "slow orphan")
        queued = start(alice, "slow queued")
        cancelled = start(alice, "slow cancelled")
        alice.post(f"/jobs/{cancelled['id']}/cancel")
        wait_for_state(alice, cancelled["id"], "cancelled")
        for job in (survivor, orphan):
            wait_for_event(alice, job["id"], lambda e: e.get("line") == "tick 1")
        assert alice.get(f"/jobs/{queued['id']}").json()["state"] == "queued"

        svc.stop(kill=True)  # the service dies; workers live on in their own sessions
        os.kill(worker_pid(svc, orphan["id"]), signal.SIGKILL)  # and one of them dies meanwhile
        time.sleep(0.3)
        svc.start()
        alice = svc.client()

        state = lambda j: alice.get(f"/jobs/{j['id']}").json()
        assert state(done)["state"] == "done" and state(done)["report"] == done["report"]
        assert state(failed)["state"] == "failed" and state(cancelled)["state"] == "cancelled"
        assert state(question)["state"] == "needs_input" and state(question)["question"]
        assert state(approval)["state"] == "needs_approval"
        lost = wait_for_state(alice, orphan["id"], "failed")
        assert "job service stopped while this job ran" in lost["report"] and "tick" in lost["report"]
        # The survivor was re-attached: its ticks keep arriving through the new service.
        assert state(survivor)["state"] == "running"
        before = len(alice.get(f"/jobs/{survivor['id']}/events", params={"follow": "false"}).text)
        time.sleep(0.5)
        assert len(alice.get(f"/jobs/{survivor['id']}/events", params={"follow": "false"}).text) > before
        # The queued job took the orphan's slot.
        wait_for_state(alice, queued["id"], "running")
        # Answers after a restart resume the same guest.
        alice.post(f"/jobs/{question['id']}/answer", json={"answer": "8080"})
        alice.post(f"/jobs/{survivor['id']}/cancel")
        assert "Stopped by a person" in wait_for_state(alice, survivor["id"], "cancelled")["report"]
        alice.post(f"/jobs/{queued['id']}/cancel")
        wait_for_state(alice, queued["id"], "cancelled")
        resumed = wait_for_state(alice, question["id"], "done")
        boot_id = json.loads((svc.data_dir / "jobs" / question["id"] / "transcript.json").read_text())["boot_id"]
        assert f"boot_id={boot_id}" in resumed["report"]
    finally:
        svc.stop()
        stop_workers(svc)


# --- questions about a finished job ---------------------------------------------------------

@uses_scripted_worker
def test_a_finished_job_is_asked_about_from_its_record_and_repo(tmp_path):
    # The history comes from vmd (its `history` verb), which the service reaches on its socket.
    with running_vmd(tmp_path) as vmd, start_ollama(["main.py now prints hello."]) as server:
        vmd_project_repo(vmd.config.state_dir, "alice", "demo",
                         [("Add main.py printing hello", {"main.py": "print('hello')\n"})])
        svc = ServiceProcess(tmp_path / "svc", vmd_socket=vmd.socket).start()
        svc_model = ServiceProcess(tmp_path / "svc2", vmd_socket=vmd.socket, ask_model="small",
                                   ollama_url=server.url).start()
        try:
            alice = svc.client()
            job = wait_for_state(alice, start(alice, "write main", project="demo")["id"], "done")
            answer = alice.post(f"/jobs/{job['id']}/ask", json={"question": "What changed in main.py?"}).json()
            assert answer["method"] == "extractive" and "git" in answer["sources"]
            assert "Add main.py printing hello" in answer["answer"] and "[report]" in answer["answer"]

            alice = svc_model.client()
            job = wait_for_state(alice, start(alice, "write main", project="demo")["id"], "done")
            answer = alice.post(f"/jobs/{job['id']}/ask", json={"question": "What changed in main.py?"}).json()
            assert answer == {**answer, "method": "model", "answer": "main.py now prints hello."}
            sent = server.chat_requests[-1]
            assert sent["options"]["num_ctx"] > 4096
            assert "Add main.py printing hello" in sent["messages"][0]["content"]
        finally:
            for s in (svc, svc_model):
                s.stop()
                stop_workers(s)
        for s in (svc, svc_model):
            s.stop()
            stop_workers(s)


# --- the real worker: vmagent.worker running the turn loop against a real vmd -----------------
# (vmd serves its verbs from tests/support/vmd_fakes.py's stand-in machine, commands run with bash
# in the project folder; the model is tests/support/ollama_server.py playing a script.)

def real_service(tmp_path, vmd, server, name="svc", **settings) -> ServiceProcess:
    return ServiceProcess(tmp_path / name, worker_command=REAL_WORKER, vmd_socket=vmd.socket,
                          env=real_worker_env(server.url), **settings)


def test_real_worker_runs_a_job_to_a_verified_report(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(finish_script()) as server:
        svc = real_service(tmp_path, vmd, server).start()
        try:
            alice = svc.client()
            job = start(alice, "write hello.py that prints hello", project="hello")
            done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=60)
            assert done["state"] == "done" and done["verification_passed"] is True, done["report"]
            # vmd's verdict: the check passed, and failed on the project before the job
            assert done["verification"] == {"passed": True, "proven": True, "attempts": 1}
            assert done["session_id"] and done["preview_ready"] is True
            assert done["machine"]["came"] == "cold", done["machine"]  # the stand-in machines boot
            # One count: the model's turns and its tool calls, as the report states them.
            assert (done["turns"], done["steps"], done["tool_calls"]) == (6, 6, 8)
            assert "6 model turns, 8 tool calls" in done["report"]
            events = alice.get(f"/jobs/{job['id']}/events", params={"follow": "false"}).text
            assert '"command": "python3 hello.py"' in events and '"line": "hello"' in events
            assert '6 turns, 7 tool calls' in events and '"turns": 6, "tool_calls": 7' in events
        finally:
            svc.stop()
            stop_workers(svc)


def test_the_job_says_its_machine_came_warm_and_how_fast(tmp_path):
    """vmd handed the session a machine from its pool: the job API, its status line and the
    events say so, before the job ends and after."""
    with running_vmd(tmp_path, came="warm") as vmd, start_ollama(finish_script()) as server:
        svc = real_service(tmp_path, vmd, server).start()
        try:
            alice = svc.client()
            job = start(alice, "write hello.py that prints hello", project="hello")
            assert job["machine"] is None  # queued: no machine yet
            wait_for_event(alice, job["id"], lambda e: e.get("type") == "machine", timeout=60)
            done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=60)
            assert done["state"] == "done", done["report"]
            assert done["machine"]["came"] == "warm" and done["machine"]["seconds"] >= 0, done["machine"]
            events = alice.get(f"/jobs/{job['id']}/events", params={"follow": "false"}).text
            assert "(warm)" in events  # "machine up after 0 s (warm)", the status line people see
        finally:
            svc.stop()
            stop_workers(svc)


def test_a_push_gitea_could_not_take_shows_pending_in_the_job_then_pushed_when_vmd_retried_it(tmp_path):
    from tests.support.loop_harness import Vmd as VmdHandle
    from tests.vmd.server.test_session_lifecycle import free_port, gitea_config, gitea_head, gitea_on
    from tests.support.vmd_fakes import LocalMachines
    from vmd.server.rpc import VmdServer

    port = free_port()  # Gitea is down at close: nothing listens here yet
    config = gitea_config(tmp_path, port)
    machines = LocalMachines()
    server_vmd = VmdServer(config, machines).start()
    vmd = VmdHandle(server_vmd, machines, config)
    try:
        with start_ollama(finish_script()) as server:
            svc = real_service(tmp_path, vmd, server).start()
            try:
                alice = svc.client()
                job = start(alice, "write hello.py that prints hello", project="hello")
                done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=60)
                assert done["state"] == "done", done["report"]
                assert done["push"]["state"] == "pending" and done["push"]["sha"], done["push"]
                assert "not yet pushed" in done["report"]
                with gitea_on(tmp_path, port) as gitea:
                    deadline = time.monotonic() + 60
                    while True:
                        seen = alice.get(f"/jobs/{job['id']}").json()
                        if seen["push"]["state"] == "pushed" or time.monotonic() > deadline:
                            break
                        time.sleep(1)
                    assert seen["push"]["state"] == "pushed", seen["push"]
                    assert seen["push"]["pushed_at"] and seen["push"]["attempts"] >= 2
                    assert gitea_head(gitea, "alice", "hello") == done["push"]["sha"]
            finally:
                svc.stop()
                stop_workers(svc)
    finally:
        server_vmd.stop()


def test_real_worker_a_check_that_proves_nothing_shows_as_passed_not_proven(tmp_path):
    from tests.vmagent.loop.test_loop import work_done_script

    # `true`, then `python3 --version`: both pass on the project as it was before the job.
    with running_vmd(tmp_path) as vmd, start_ollama(work_done_script("true", "python3 --version")) as server:
        svc = real_service(tmp_path, vmd, server).start()
        try:
            alice = svc.client()
            job = start(alice, "write hello.py that prints hello", project="hello")
            done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=60)
            assert done["state"] == "done", done["report"]
            assert done["verification"] == {"passed": True, "proven": False, "attempts": 2}
            assert "passed, not proven" in done["report"].splitlines()[2]
        finally:
            svc.stop()
            stop_workers(svc)


def test_real_worker_question_survives_a_service_restart_and_resumes_the_same_session(tmp_path):
    script = [PLAN, call("ask_user", {"question": "Python 2 or 3?"}), *finish_script()[1:]]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        svc = real_service(tmp_path, vmd, server).start()
        try:
            alice = svc.client()
            job = start(alice, "write hello.py", project="hello")
            waiting = wait_for_state(alice, job["id"], {"needs_input", "failed"}, timeout=60)
            assert waiting["state"] == "needs_input" and waiting["question"] == "Python 2 or 3?", waiting["report"]
            svc.stop(kill=True)
            svc.start()
            alice = svc.client()
            assert alice.get(f"/jobs/{job['id']}").json()["state"] == "needs_input"
            alice.post(f"/jobs/{job['id']}/answer", json={"answer": "3, please"})
            done = wait_for_state(alice, job["id"], {"done", "failed"}, timeout=60)
            assert done["state"] == "done" and done["verification_passed"] is True, done["report"]
            assert done["session_id"] == waiting["session_id"]
            assert any("3, please" in t for t in user_texts(server.chat_requests[-1]))
        finally:
            svc.stop()
            stop_workers(svc)


def _busy_script(n: int = 200) -> list:
    return [PLAN, *[call("run", {"command": f"sleep 0.2; echo working {i}"}) for i in range(n)]]


@contextlib.contextmanager
def busy_real_job(tmp_path):
    """A real worker well into a long job: (vmd, service, client, job)."""
    with running_vmd(tmp_path) as vmd, start_ollama(_busy_script()) as server:
        svc = real_service(tmp_path, vmd, server).start()
        try:
            alice = svc.client()
            job = start(alice, "keep working", project="busy")
            wait_for_event(alice, job["id"], lambda e: e.get("line") == "working 2", timeout=60)
            yield vmd, svc, alice, job
        finally:
            svc.stop()
            stop_workers(svc)


def test_real_worker_cancel_ends_with_the_loops_report(tmp_path):
    with busy_real_job(tmp_path) as (vmd, svc, alice, job):
        alice.post(f"/jobs/{job['id']}/cancel")
        cancelled = wait_for_state(alice, job["id"], {"cancelled", "failed"}, timeout=30)
        assert cancelled["state"] == "cancelled" and cancelled["session_id"], cancelled["report"]
        assert "killed by signal" not in cancelled["report"]


def test_real_worker_killed_mid_job_leaves_a_failed_job_with_a_report(tmp_path):
    with busy_real_job(tmp_path) as (vmd, svc, alice, job):
        os.kill(worker_pid(svc, job["id"]), signal.SIGKILL)
        failed = wait_for_state(alice, job["id"], "failed", timeout=20)
        assert "killed by signal 9" in failed["report"] and "working 2" in failed["report"]
        assert "write hello.py" in failed["report"]  # the task list it had
        # The service closed the orphaned vmd session: committed, machine gone, and
        # vmd's own report (from its record) leads the job's report.
        assert failed["report"].startswith("# vmagent session ")
        machine = vmd.machines.machines[f"vmagent-{failed['session_id']}"]
        assert machine.destroyed
        assert "## Commit" in failed["report"] and "has not been closed" not in failed["report"]
