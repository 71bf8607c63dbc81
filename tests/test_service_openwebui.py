"""What the job service does for Open WebUI's callers (the service token): the forwarded
user headers are read as the names they carry, whatever the alphabet, and a chat runs one
job at a time, refused at the service so that no copy of the tool file can get around it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.requests import Request

from tests.service_harness import ALICE, SERVICE, ServiceProcess, uses_scripted_worker, wait_for_state
from tests.service_harness import stop_workers
from vmagent.service.auth import authenticate
from vmagent.service.config import ServiceConfig


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
