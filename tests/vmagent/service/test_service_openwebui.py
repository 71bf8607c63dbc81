"""What the job service does for Open WebUI's callers (the service token): the forwarded
user headers are read as the names they carry, whatever the alphabet; a chat runs one
job at a time, refused at the service so that no copy of the tool file can get around it;
and chats that start jobs at the same moment each get theirs, started once."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from starlette.requests import Request

from tests.support.service_harness import ALICE, SCRIPTED_WORKER, SERVICE, ServiceProcess, free_port, uses_scripted_worker
from tests.support.service_harness import stop_workers, wait_for_state
from vmagent.service import store as store_module
from vmagent.service.app import create_app
from vmagent.service.auth import authenticate
from vmagent.service.config import ServiceConfig
from vmagent.service.store import Store
from vmagent.service.workers import WorkerPool


def request_with(headers: list[tuple[bytes, bytes]]) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/jobs", "query_string": b"",
                    "headers": [(b"authorization", f"Bearer {SERVICE}".encode()), *headers]})


@pytest.mark.parametrize("sent, name", [
    (b"Jos%C3%A9 M%C3%BCller", "José Müller"),  # as Open WebUI and the tool send it
    (b"Zo%C3%AB", "Zoë"),
    ("José Müller".encode(), "José Müller"),  # raw UTF-8 from some other client
    (b"Ada Lovelace", "Ada Lovelace"),
    (b"100%25 sure", "100% sure"),
], ids=["percent-jose", "percent-zoe", "raw-utf8", "ascii", "percent-sign"])
def test_forwarded_names_are_decoded_to_what_the_person_wrote(sent, name):
    caller = authenticate(request_with([(b"x-openwebui-user-id", b"3f1c2a9e"),
                                        (b"x-openwebui-user-name", sent),
                                        (b"x-openwebui-user-email", b"zo%C3%AB@ex%C3%A4mple.org")]),
                          ServiceConfig(service_token=SERVICE))
    assert (caller.user, caller.name, caller.email) == ("3f1c2a9e", name, "zoë@exämple.org")
    assert caller.via_service


def test_an_encoded_user_id_is_decoded_before_the_owner_rule_sees_it(tmp_path):
    svc = ServiceProcess(tmp_path / "svc").start()
    try:
        refused = svc.client(SERVICE, {"X-OpenWebUI-User-Id": "..%2Fbob"}).post("/jobs", json={"task": "x"})
        assert refused.status_code == 422 and "owner" in refused.json()["detail"]
    finally:
        svc.stop()


@pytest.fixture
def service(tmp_path):
    svc = ServiceProcess(tmp_path / "svc").start()
    yield svc
    svc.stop()
    stop_workers(svc)


def via_webui(service, user: str = "user-7"):
    return service.client(SERVICE, {"X-OpenWebUI-User-Id": user})


@uses_scripted_worker
def test_a_second_job_in_an_open_webui_chat_is_refused_while_the_first_is_unfinished(service):
    webui = via_webui(service)
    first = webui.post("/jobs", json={"task": "slow job", "chat_id": "chat-1"}).json()
    refused = webui.post("/jobs", json={"task": "write the README", "chat_id": "chat-1"})
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert first["id"] in detail and "'slow job'" in detail and f"POST /jobs/{first['id']}/cancel" in detail
    assert [j["task"] for j in webui.get("/jobs", params={"chat_id": "chat-1"}).json()["jobs"]] == ["slow job"]

    # Another chat, and another person's chat of the same id, are free.
    assert webui.post("/jobs", json={"task": "plain", "chat_id": "chat-2"}).status_code == 201
    assert via_webui(service, "user-8").post("/jobs", json={"task": "plain", "chat_id": "chat-1"}).status_code == 201

    # Once the first has ended, the chat takes a new task.
    webui.post(f"/jobs/{first['id']}/cancel")
    wait_for_state(webui, first["id"], "cancelled")
    assert webui.post("/jobs", json={"task": "write the README", "chat_id": "chat-1"}).status_code == 201


@uses_scripted_worker
def test_a_job_waiting_for_an_answer_holds_its_chat_too(service):
    webui = via_webui(service)
    job = webui.post("/jobs", json={"task": "question first", "chat_id": "chat-q"}).json()
    wait_for_state(webui, job["id"], "needs_input")
    refused = webui.post("/jobs", json={"task": "something else", "chat_id": "chat-q"})
    assert refused.status_code == 409 and "needs_input" in refused.json()["detail"]


@uses_scripted_worker
def test_two_calls_at_once_in_one_chat_start_one_job(service):
    def start(n: int) -> int:
        with via_webui(service) as client:
            return client.post("/jobs", json={"task": f"slow job {n}", "chat_id": "chat-race"}).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(start, range(8)))
    assert codes == [201] + [409] * 7
    assert len(via_webui(service).get("/jobs", params={"chat_id": "chat-race"}).json()["jobs"]) == 1


@uses_scripted_worker
def test_a_person_with_their_own_token_is_not_held_to_one_job_per_chat(service):
    # The rule is Open WebUI's chat; the API with a user token may run jobs side by side.
    alice = service.client(ALICE)
    for n in range(2):
        assert alice.post("/jobs", json={"task": f"slow job {n}", "chat_id": "chat-1"}).status_code == 201


@uses_scripted_worker
def test_two_chats_starting_jobs_at_once_both_get_their_job(tmp_path, monkeypatch):
    # A request that has made its job pumps the queue (WorkerPool.pump), and a pump starts
    # every queued job it sees. On the code before, request A's pump saw the job that
    # request B was still making: queued, but without its folder yet, so starting it raised
    # FileNotFoundError (writing its job file), a 500 for A, whose own job already ran.
    # Here A's pump waits until B's creation reaches the job's folder, and B waits there
    # for A's pump: the moment that concurrent requests on a loaded host hit by chance.
    # The service runs in this process (uvicorn in a thread) so that the two can be held.
    config = ServiceConfig(data_dir=tmp_path / "svc", service_token=SERVICE, worker_command=SCRIPTED_WORKER)
    b_making, a_pumped = threading.Event(), threading.Event()
    real_pump, real_private_dir = WorkerPool.pump, store_module.private_dir
    job_folders = []

    def pump_held_for_b(pool):
        if a_pumped.is_set():
            return real_pump(pool)
        try:  # the first pump is A's, once it has made its job
            b_making.wait(10)
            return real_pump(pool)
        finally:
            a_pumped.set()

    def folder_held_for_a(path):
        job_folders.append(path)
        if len(job_folders) == 2:  # B's job (the store makes no other folder once open)
            b_making.set()
            a_pumped.wait(10)
        return real_private_dir(path)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    webui = {"Authorization": f"Bearer {SERVICE}", "X-OpenWebUI-User-Id": "user-7"}
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        monkeypatch.setattr(WorkerPool, "pump", pump_held_for_b)
        monkeypatch.setattr(store_module, "private_dir", folder_held_for_a)
        answers = {}

        def post(chat: str) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=webui, timeout=30) as client:
                answers[chat] = client.post("/jobs", json={"task": f"plain {chat}", "chat_id": chat})

        a = threading.Thread(target=post, args=("chat-a",))
        a.start()
        while not (job_folders or answers):  # A has begun making its job
            time.sleep(0.01)
        b = threading.Thread(target=post, args=("chat-b",))
        b.start()
        a.join(30)
        b.join(30)
        monkeypatch.undo()
        assert {chat: r.status_code for chat, r in answers.items()} == {"chat-a": 201, "chat-b": 201}, \
            {chat: r.text[:300] for chat, r in answers.items()}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=webui, timeout=30) as client:
            for chat in ("chat-a", "chat-b"):
                job_id = answers[chat].json()["id"]
                assert wait_for_state(client, job_id, "done")["task"] == f"plain {chat}"
                # Started once, by one thread, and never set back.
                stream = client.get(f"/jobs/{job_id}/events", params={"follow": "false"}).text
                events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
                assert [e["state"] for e in events if e.get("type") == "state"] == ["queued", "running", "done"]
    finally:
        server.should_exit = True
        serving.join(30)


@uses_scripted_worker
def test_a_job_that_cannot_start_fails_with_why_and_the_request_that_pumped_it_goes_on(tmp_path):
    # A pump starts every queued job it sees: on the code before, an error starting some
    # other job (here its worker.log cannot be opened) came out of the request's pump as a 500.
    store = Store(tmp_path / "svc")
    pool = WorkerPool(store, ServiceConfig(data_dir=tmp_path / "svc", worker_command=SCRIPTED_WORKER))
    try:
        broken = store.create_job(owner="user-7", task="plain broken", os="debian", project=None)
        (store.job_dir(broken["id"]) / "worker.log").mkdir()
        mine = store.create_job(owner="user-7", task="plain mine", os="debian", project=None)
        pool.submit(mine)  # pumps: the broken job first, then this one
        failed = store.get_job(broken["id"])
        assert failed["state"] == "failed"
        assert "The service could not write the job's files in" in failed["report"], failed["report"]
        deadline = time.monotonic() + 30
        while store.get_job(mine["id"])["state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.get_job(mine["id"])["state"] == "done"
    finally:
        pool.close()  # its follower lets go; the store closes with the process
