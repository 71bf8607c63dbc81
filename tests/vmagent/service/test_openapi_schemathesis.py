"""The job service's OpenAPI document tells the truth (issue 25, item 5): every status code
each route answers is in it with its body schema, the error body is the one the service
sends, names carry the pattern the service enforces, and no schema-valid body is refused.

Schemathesis (`--checks all`) runs against a real `vmagent serve` on loopback and must find
nothing; before this document was made true it found 28 problems (undocumented 400, 404,
409 and content types, 422 bodies that were strings where the document said a list, a
schema-valid project name refused). The focused tests below hold each of those classes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema_rs
import pytest

from tests.support.service_harness import ALICE, BOB, ServiceProcess, stop_workers, uses_scripted_worker, wait_for_state
from vmd.contract.bounds import name_problem

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
# Examples per operation and phase: the whole run takes about 30 s on 2 cores (measured
# 2,300 cases in 48 s at schemathesis's default of 100).
MAX_EXAMPLES = 40


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = ServiceProcess(tmp_path_factory.mktemp("openapi") / "svc").start()
    yield svc
    svc.stop()
    stop_workers(svc)


@pytest.fixture(scope="module")
def document(service) -> dict:
    return httpx.get(service.url + "/openapi.json", timeout=10).json()


def documented(document: dict, method: str, path: str, reply: httpx.Response) -> None:
    """`reply`'s status is documented for the operation, with its content type, and its
    body fits the documented schema."""
    responses = document["paths"][path][method.lower()]["responses"]
    assert str(reply.status_code) in responses, f"{method} {path} answered {reply.status_code}, " \
                                                f"documented: {sorted(responses)}"
    media = reply.headers["content-type"].split(";")[0]
    content = responses[str(reply.status_code)]["content"]
    assert media in content, f"{media} is not among {sorted(content)}"
    if media == "application/json":
        schema = {**content[media]["schema"], "components": document["components"]}
        jsonschema_rs.validator_for(schema).validate(reply.json())


@uses_scripted_worker
def test_schemathesis_with_every_check_finds_nothing(service, tmp_path):
    # cwd: schemathesis keeps its example database (.hypothesis) in the current folder.
    run = subprocess.run(
        [str(SCHEMATHESIS), "run", "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--workers", "1",
         "--request-timeout", "20", "--no-color", "-H", f"Authorization: Bearer {ALICE}",
         f"{service.url}/openapi.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]
    assert re.search(r"\d+ generated, \d+ passed", run.stdout), run.stdout[-3000:]


def test_every_operation_but_health_says_how_to_authenticate_and_that_a_large_body_is_413(document):
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer", "description": schemes["bearer"]["description"]}
    assert schemes["previewToken"]["in"] == "query" and schemes["previewToken"]["name"] == "token"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "413" in operation["responses"], (method, path)
            if path == "/healthz":
                assert "security" not in operation
                continue
            assert {"bearer": []} in operation["security"], (method, path)
            assert "401" in operation["responses"], (method, path)
            watched = path.endswith(("/preview", "/screen.png", "/events"))
            assert ({"previewToken": []} in operation["security"]) == watched, (method, path)


@uses_scripted_worker
def test_every_refusal_is_documented_with_the_body_the_service_sends(service, document):
    alice, bob = service.client(), service.client(BOB)
    nobody = httpx.Client(base_url=service.url, timeout=15)
    job = alice.post("/jobs", json={"task": "say hello"}).json()
    wait_for_state(alice, job["id"], "done")
    bad_utf8 = {"content": b'{"answer": "\xff\xfe"}', "headers": {"Content-Type": "application/json"}}
    cases = [
        # 401: no token, on a route with a body (the gate) and one without.
        ("POST", "/jobs", nobody.post("/jobs", json={"task": "t"}), 401),
        ("GET", "/jobs/{job_id}", nobody.get(f"/jobs/{job['id']}"), 401),
        # 404: a job that does not exist, and another user's job, alike.
        ("GET", "/jobs/{job_id}", alice.get("/jobs/0123456789abcdef"), 404),
        ("GET", "/jobs/{job_id}", bob.get(f"/jobs/{job['id']}"), 404),
        ("POST", "/jobs/{job_id}/cancel", bob.post(f"/jobs/{job['id']}/cancel"), 404),
        ("GET", "/jobs/{job_id}/screen.png", alice.get("/jobs/0123456789abcdef/screen.png"), 404),
        ("GET", "/evals/{run}/", alice.get("/evals/no-such-run/"), 404),
        # 403: a preview link that is not valid, without a bearer token.
        ("GET", "/jobs/{job_id}/preview", nobody.get(f"/jobs/{job['id']}/preview?token=1.2"), 403),
        # 409: the job is done, so it takes no answer, decision or cancel.
        ("POST", "/jobs/{job_id}/answer", alice.post(f"/jobs/{job['id']}/answer", json={"answer": "8080"}), 409),
        ("POST", "/jobs/{job_id}/approve", alice.post(f"/jobs/{job['id']}/approve"), 409),
        ("POST", "/jobs/{job_id}/cancel", alice.post(f"/jobs/{job['id']}/cancel"), 409),
        # 413: declared longer than max_body_bytes (1 MiB by default).
        ("POST", "/jobs", alice.post("/jobs", content=b"x" * (1024 * 1024 + 1)), 413),
        # 422: a field out of its bounds, or of the wrong type; a query out of range.
        ("POST", "/jobs", alice.post("/jobs", json={"task": ""}), 422),
        ("POST", "/jobs", alice.post("/jobs", json={"task": "t", "web": 0}), 422),
        ("GET", "/jobs", alice.get("/jobs?limit=0"), 422),
        # 400: a body that is not UTF-8.
        ("POST", "/jobs/{job_id}/answer", alice.post(f"/jobs/{job['id']}/answer", **bad_utf8), 400),
    ]
    for method, path, reply, status in cases:
        assert reply.status_code == status, (method, path, reply.status_code, reply.text)
        documented(document, method, path, reply)
        assert isinstance(reply.json()["detail"], str) and reply.json()["detail"].endswith("."), reply.text
    assert "WWW-Authenticate" in cases[0][2].headers
    # A refused field says which and what to do, in `detail` and per field in `errors`.
    refused = alice.post("/jobs", json={"task": ""}).json()
    assert refused["errors"] == [{"loc": ["body", "task"], "type": "string_too_short", "msg": refused["detail"]}]
    assert "UTF-8" in cases[-1][2].json()["detail"]


@uses_scripted_worker
def test_successes_are_documented_with_their_content_type(service, document):
    alice = service.client()
    created = alice.post("/jobs", json={"task": "say hello", "project": ""})
    documented(document, "POST", "/jobs", created)
    job = wait_for_state(alice, created.json()["id"], "done")
    documented(document, "GET", "/jobs", alice.get("/jobs"))
    documented(document, "GET", "/jobs/{job_id}/preview", alice.get(f"/jobs/{job['id']}/preview"))
    documented(document, "GET", "/jobs/{job_id}/screen.png", alice.get(f"/jobs/{job['id']}/screen.png"))
    events = alice.get(f"/jobs/{job['id']}/events?follow=false")
    assert events.headers["content-type"].startswith("text/event-stream")
    assert "text/event-stream" in document["paths"]["/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    documented(document, "POST", "/jobs/{job_id}/ask", alice.post(f"/jobs/{job['id']}/ask",
                                                                  json={"question": "what did it do?"}))
    # OPTIONS on a path with two routes names both methods (Starlette named the first's only).
    allow = alice.options("/jobs").headers["allow"]
    assert {m.strip() for m in allow.split(",")} >= {"GET", "POST"}


# Names on either side of each part of vmd's rule: length, first character, characters,
# the .git ending in any case, and a final newline (which Python's `$` lets through).
NAMES = ["", "p", "my-proj_1.0", "_x", "x" * 100, "a.gitx", "x" * 101, ".hidden", "-rf", "a b", "é",
         "../x", "a/b", "secret.git", "S.GiT", "name\n"]


def test_the_documented_name_pattern_is_the_rule_the_service_enforces(service, document):
    schema = document["components"]["schemas"]["JobCreate"]["properties"]["project"]["anyOf"][0]
    pattern = re.compile(schema["pattern"])
    alice = service.client()
    for name in NAMES:
        fits_document = bool(pattern.search(name)) and len(name) <= schema["maxLength"]
        # vmd's rule (a final newline refused too: its check is a full match); "" is no project.
        fits_vmd = name == "" or name_problem("project", name) is None
        assert fits_document == fits_vmd, repr(name)
        # A body the document allows is taken; one it refuses is a 422 saying what to use.
        reply = alice.post("/jobs", json={"task": "say hello", "project": name})
        assert reply.status_code == (201 if fits_document else 422), (repr(name), reply.text)
        if not fits_document:
            assert "is not a usable" in reply.json()["detail"] or "longer than the 100" in reply.json()["detail"]
    owner = document["components"]["schemas"]["JobView"]["properties"]["owner"]["pattern"]
    assert owner == schema["pattern"].removeprefix("^$|")
