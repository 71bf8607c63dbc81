"""The job service's edges, over real HTTP to a real `vmagent serve` and with real git:
the body is not read before the caller is known, fields and bodies have limits, project
names follow vmd's rule, preview links are strict, short-lived after the job and never
logged, workers get no secrets, and /ask reads only the job's own repository, as data.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service_harness import (ALICE, BOB, SERVICE, ServiceProcess, stop_workers, uses_scripted_worker,
                                           vmd_project_repo, wait_for_state)
from tests.support.loop_harness import running_vmd
from tests.vmagent.service.test_service_api import start, worker_pid
from vmagent.service.ask import project_files_in, project_history
from vmagent.service.auth import preview_token_valid, redact_query, sign_preview
from vmagent.service.config import ServiceConfig
from vmagent.service.worker_process import worker_environment

MiB = 1024 * 1024
BODY_PATHS = ["/jobs", "/jobs/0123456789abcdef/answer", "/jobs/0123456789abcdef/approve",
              "/jobs/0123456789abcdef/deny", "/jobs/0123456789abcdef/cancel",
              "/jobs/0123456789abcdef/ask"]


@pytest.fixture
def service(tmp_path):
    svc = ServiceProcess(tmp_path / "svc").start()
    yield svc
    svc.stop()
    stop_workers(svc)


def raw_request(port: int, path: str, headers: dict[str, str], declared: int, sent: bytes,
                timeout: float = 10) -> tuple[int, bytes]:
    """POSTs headers declaring `declared` bytes but sends only `sent`, and reads the reply:
    a server that waited for the rest of the body would time out here."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + sent)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed without a reply: {reply!r}"
            reply += chunk
        top, _, body = reply.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", top)[1])
        while len(body) < length:
            body += sock.recv(65536)
    return int(top.split()[1]), top + b"\r\n\r\n" + body


# --- the body waits for the caller -------------------------------------------------------

@pytest.mark.parametrize("path", BODY_PATHS)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-token"},
                                     {"Authorization": f"Bearer {SERVICE}"}],
                         ids=["no token", "unknown token", "service token without user"])
def test_a_body_is_not_read_before_the_caller_is_known(service, path, headers):
    marker = b"A" * 65536
    status, reply = raw_request(service.port, path, headers, declared=30 * MiB,
                                sent=b'{"task": "' + marker)
    assert status == 401 and b"AAAAAAAA" not in reply and len(reply) < 2000


def test_a_whole_30_mib_unauthenticated_task_gets_401_without_an_echo(service):
    task = "A" * (30 * MiB)
    reply = httpx.post(service.url + "/jobs", json={"task": task}, timeout=60)
    assert reply.status_code == 401 and "AAAAAAAA" not in reply.text and len(reply.content) < 2000
    assert "Authorization: Bearer" in reply.json()["detail"]


def test_a_body_over_the_cap_is_refused_with_413_declared_or_chunked(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", max_body_bytes=64 * 1024).start()
    try:
        alice = svc.client()
        declared = alice.post("/jobs", content=b'{"task": "' + b"x" * (100 * 1024) + b'"}',
                              headers={"Content-Type": "application/json"})
        assert declared.status_code == 413 and "max_body_bytes" in declared.json()["detail"]
        assert "65,536 bytes" in declared.json()["detail"] and "xxxxxxxx" not in declared.text

        def chunks():
            yield b'{"task": "'
            for _ in range(40):
                yield b"y" * 4096
            yield b'"}'

        chunked = alice.post("/jobs", content=chunks(), headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413 and "yyyyyyyy" not in chunked.text
        assert start(alice, "small enough")["owner"] == "alice"
        assert alice.get("/jobs").status_code == 200
    finally:
        svc.stop()
        stop_workers(svc)


def test_a_body_nested_ten_thousand_deep_is_refused_before_it_is_parsed(service):
    # FastAPI parses with json.loads, which recurses per level; on Python 3.11.2 the
    # RecursionError can break the interpreter for every later request. The gate measures.
    alice = service.client()
    for body in ('{"task": ' + "[" * 10_000 + "]" * 10_000 + "}", "[" * 10_000):
        reply = alice.post("/jobs", content=body.encode(), headers={"Content-Type": "application/json"})
        assert reply.status_code == 400, reply.text
        assert "deeper than 200 levels" in reply.json()["detail"]
    # A task that only mentions brackets, inside its string, is no nesting at all.
    assert start(alice, "balance these: " + "[" * 5000)["owner"] == "alice"
    assert service.client().get("/healthz").json()["ok"] is True


# --- field limits and names ----------------------------------------------------------------

@pytest.mark.parametrize("path, field, limit", [
    ("/jobs", "task", 20000), ("/jobs", "os", 64), ("/jobs", "project", 100),
    ("/jobs", "chat_id", 200), ("/jobs", "message_id", 200), ("/jobs", "model", 200),
    ("/jobs/0123456789abcdef/answer", "answer", 20000),
    ("/jobs/0123456789abcdef/approve", "reason", 4000),
    ("/jobs/0123456789abcdef/deny", "reason", 4000),
    ("/jobs/0123456789abcdef/ask", "question", 4000),
])
def test_every_body_field_has_a_length_limit_and_says_what_to_do(service, path, field, limit):
    body = {"task": "t", field: "q" * (limit + 1)}
    reply = service.client().post(path, json=body)
    assert reply.status_code == 422, reply.text
    detail = reply.json()["detail"]
    assert detail.startswith(f"`{field}` has {limit + 1:,} characters, longer than the {limit:,} allowed;")
    assert "qqqqqqqq" not in reply.text
    assert reply.json()["errors"][0]["type"] == "string_too_long"


def test_a_task_at_the_limit_is_taken_and_hints_say_where_long_material_goes(service):
    alice = service.client()
    assert start(alice, "t" * 20000)["owner"] == "alice"
    detail = alice.post("/jobs", json={"task": "t" * 20001}).json()["detail"]
    assert "put long material (logs, specifications) in the project's files" in detail
    assert "not valid JSON" in alice.post("/jobs", content=b"{nope", headers={
        "Content-Type": "application/json"}).json()["detail"]
    assert alice.post("/jobs", json={"task": ""}).json()["detail"] == \
        "`task` is empty; it needs at least 1 character(s)."


@pytest.mark.parametrize("project", ["../x", "bob/secret", "../projects/bob/secret", "-rf",
                                     "secret.git", ".hidden", "a b", "é"])
def test_a_project_that_breaks_vmds_name_rule_is_refused_at_creation(service, project):
    reply = service.client().post("/jobs", json={"task": "look", "project": project})
    assert reply.status_code == 422
    assert reply.json()["detail"].startswith(f"project {project!r} is not a usable name: use up to 100")
    assert service.client().get("/jobs").json() == {"jobs": []}


def test_an_owner_that_breaks_vmds_name_rule_is_refused_at_creation(service):
    via_webui = service.client(SERVICE, {"X-OpenWebUI-User-Id": "../bob"})
    reply = via_webui.post("/jobs", json={"task": "look"})
    assert reply.status_code == 422 and reply.json()["detail"].startswith("owner '../bob' is not a usable name")
    assert "the user its token names" in reply.json()["detail"]
    assert start(service.client(), "look", project="fine-name_1.0")["project"] == "fine-name_1.0"


# --- preview links -------------------------------------------------------------------------

def _job_row(**fields) -> dict:
    now = time.time()
    return {"id": "0123456789abcdef", "preview_secret": "s" * 64, "state": "running",
            "updated": now, "ended": None, **fields}


def test_a_preview_token_is_valid_until_expiry_or_a_grace_after_the_job_ended():
    now = 1_800_000_000.0
    job = _job_row(updated=now)
    token = sign_preview(job, 3600, now=now)
    assert preview_token_valid(job, token, 300, now=now + 3599)
    assert not preview_token_valid(job, token, 300, now=now + 3601)
    assert not preview_token_valid({**job, "id": "fedcba9876543210"}, token, 300, now=now)
    ended = {**job, "state": "done", "ended": now + 10}
    assert preview_token_valid(ended, token, 300, now=now + 309)
    assert not preview_token_valid(ended, token, 300, now=now + 311)
    # A job stored before `ended` existed: its last update stands in.
    legacy = {**job, "state": "cancelled", "ended": None, "updated": now}
    assert not preview_token_valid(legacy, token, 300, now=now + 301)
    # Waiting for a person is not an end: the link stays open.
    assert preview_token_valid({**job, "state": "needs_input", "updated": now - 9999}, token, 300, now=now)


MALFORMED_TOKENS = ["².abc", "9" * 5000 + ".abc", "9" * 5000, "1.2.3", "abc", ".", "1.", ".f",
                    "é.ü", "1." + "g" * 64, "1." + "ü" * 64, "1." + "A" * 64, "-1." + "0" * 64,
                    "1" * 13 + "." + "0" * 64, "MTIz.YWJj", "1\x00." + "0" * 64, "x" * 6000]


@uses_scripted_worker
def test_malformed_preview_tokens_get_403_never_500(service):
    alice = service.client()
    job = wait_for_state(alice, start(alice, "one")["id"], "done")
    plain = httpx.Client(base_url=service.url, timeout=15)
    for token in MALFORMED_TOKENS:
        for what in ("preview", "screen.png", "events"):
            reply = plain.get(f"/jobs/{job['id']}/{what}", params={"token": token})
            assert reply.status_code == 403, (what, token[:20], reply.status_code, reply.text[:300])
    # The owner's own stream ignores a Last-Event-ID that is not a plain number.
    for bad in ("²", "9" * 5000, "-3"):
        reply = alice.get(f"/jobs/{job['id']}/events", params={"follow": "false"},
                          headers={"Last-Event-ID": bad.encode()})
        assert reply.status_code == 200 and "event: end" in reply.text
    assert alice.get(f"/jobs/{job['id']}/events", params={"after": "9" * 30}).status_code == 422


@uses_scripted_worker
def test_preview_links_close_a_grace_period_after_the_job_ends(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", preview_grace_s=2).start()
    try:
        alice = svc.client()
        done = wait_for_state(alice, start(alice, "one")["id"], "done")
        slow = start(alice, "slow job")
        plain = httpx.Client(base_url=svc.url, timeout=15)
        token = done["preview_url"].split("token=")[1]
        slow_token = slow["preview_url"].split("token=")[1]
        assert plain.get(f"/jobs/{done['id']}/preview", params={"token": token}).status_code == 200
        time.sleep(2.5)
        for what in ("preview", "screen.png", "events"):
            assert plain.get(f"/jobs/{done['id']}/{what}", params={"token": token}).status_code == 403
        # The job's owner keeps its report; a job still running keeps its live link.
        assert alice.get(f"/jobs/{done['id']}").json()["report"].startswith("# Job done")
        assert plain.get(f"/jobs/{slow['id']}/preview", params={"token": slow_token}).status_code == 200
        alice.post(f"/jobs/{slow['id']}/cancel")
        wait_for_state(alice, slow["id"], "cancelled")
    finally:
        svc.stop()
        stop_workers(svc)


def test_the_token_query_value_is_redacted_from_a_request_line():
    line = 'GET /jobs/a/preview?token=1800000000.abcd&n=2 HTTP/1.1" 200'
    assert redact_query(line) == 'GET /jobs/a/preview?token=[redacted]&n=2 HTTP/1.1" 200'
    assert redact_query("/jobs/a/events?after=3&tok%65n=1.ab") == "/jobs/a/events?after=3&tok%65n=[redacted]"
    assert redact_query("/jobs/a/events?after=3") == "/jobs/a/events?after=3"


@uses_scripted_worker
def test_preview_tokens_never_reach_the_access_log(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", log_level="info").start()
    try:
        alice = svc.client()
        job = wait_for_state(alice, start(alice, "one")["id"], "done")
        token = job["preview_url"].split("token=")[1]
        plain = httpx.Client(base_url=svc.url, timeout=15)
        assert plain.get(f"/jobs/{job['id']}/preview", params={"token": token}).status_code == 200
        assert plain.get(f"/jobs/{job['id']}/events", params={"token": token, "follow": "false"}).status_code == 200
        assert plain.get(f"/jobs/{job['id']}/screen.png?tok%65n={token}").status_code == 200
    finally:
        svc.stop()
        stop_workers(svc)
    log = (svc.data_dir / "service.log").read_text()
    assert f'"GET /jobs/{job["id"]}/preview?token=[redacted] HTTP/1.1" 200' in log
    assert f"/jobs/{job['id']}/events?token=[redacted]&follow=false" in log
    assert token.split(".")[1] not in log


# --- workers' environment --------------------------------------------------------------------

SECRETS = {"VMAGENT_SERVICE_TOKEN": "svc-secret-1", "VMAGENT_TOKENS": "tok-secret-2:carol",
           "GITEA_TOKEN": "gitea-secret-3", "AWS_SECRET_ACCESS_KEY": "aws-secret-4",
           "DATABASE_URL": "postgres://u:db-secret-5@h/db"}


def test_a_worker_environment_keeps_what_the_worker_reads_and_no_secrets():
    environ = {**SECRETS, "PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/home/svc",
               "TZ": "UTC", "OLLAMA_HOST": "http://ollama:11434", "VMAGENT_MODEL": "m",
               "VMAGENT_NUM_CTX": "8192", "VMAGENT_CONFIG": "/etc/agent.toml", "VMAGENT_PROMPTS": "/p",
               "VMAGENT_SCREEN_WATCH_S": "0", "VMD_SOCKET": "/run/vmd/inherited.sock"}
    env = worker_environment(ServiceConfig(vmd_socket="/run/vmd/configured.sock"), environ)
    assert not set(SECRETS) & set(env)
    assert env == {**{k: v for k, v in environ.items() if k not in SECRETS},
                   "PYTHONUNBUFFERED": "1", "VMD_SOCKET": "/run/vmd/configured.sock"}
    assert worker_environment(ServiceConfig(), environ)["VMD_SOCKET"] == "/run/vmd/inherited.sock"


@uses_scripted_worker
def test_a_running_worker_process_holds_no_secrets(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", env={**SECRETS, "VMAGENT_NUM_CTX": "8192"}).start()
    try:
        alice = svc.client()
        job = start(alice, "slow job")
        wait_for_state(alice, job["id"], "running")
        raw = Path(f"/proc/{worker_pid(svc, job['id'])}/environ").read_bytes()
        env = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
        assert not set(SECRETS) & set(env)
        assert not any(secret in raw.decode() for secret in SECRETS.values())
        assert env["PYTHONUNBUFFERED"] == "1" and env["VMAGENT_NUM_CTX"] == "8192" and env["PATH"]
        # The service itself did get them: the secret token works there.
        assert svc.client("tok-secret-2").get("/jobs").status_code == 200
        alice.post(f"/jobs/{job['id']}/cancel")
        wait_for_state(alice, job["id"], "cancelled")
    finally:
        svc.stop()
        stop_workers(svc)


# --- /ask reads the job's own repository, as data, through vmd's `history` verb ----------------

@uses_scripted_worker
def test_a_job_is_asked_about_only_from_its_own_owners_repository(tmp_path):
    with running_vmd(tmp_path) as vmd:
        vmd_project_repo(vmd.config.state_dir, "bob", "secret",
                         [("Bob's launch codes are 0000", {"codes.txt": "0000\n"})])
        _ask_own_repository_only(ServiceProcess(tmp_path / "svc", vmd_socket=vmd.socket).start())


def _ask_own_repository_only(svc: ServiceProcess) -> None:
    try:
        alice, bob = svc.client(ALICE), svc.client(BOB)
        question = {"question": "What is in codes.txt and what are the launch codes?"}
        mine = wait_for_state(alice, start(alice, "look", project="secret")["id"], "done")
        answer = alice.post(f"/jobs/{mine['id']}/ask", json=question).json()
        assert "git" not in answer["sources"] and "launch codes are" not in answer["answer"]
        theirs = wait_for_state(bob, start(bob, "look", project="secret")["id"], "done")
        answer = bob.post(f"/jobs/{theirs['id']}/ask", json=question).json()
        assert "git" in answer["sources"] and "Bob's launch codes are 0000" in answer["answer"]
    finally:
        svc.stop()
        stop_workers(svc)


def test_a_stored_job_with_an_unsafe_project_reads_no_repository(tmp_path):
    with running_vmd(tmp_path) as vmd:
        vmd_project_repo(vmd.config.state_dir, "bob", "secret",
                         [("Bob's launch codes are 0000", {"codes.txt": "0000\n"})])
        config = ServiceConfig(vmd_socket=vmd.socket)
        bob_job = {"owner": "bob", "project": "secret"}
        assert "launch codes" in project_history(config, bob_job, "codes.txt")
        # Jobs stored before project names were checked: each of these once reached bob's history.
        for project in ("../bob/secret", "bob/secret", "../../repos/bob/secret", "/abs"):
            assert project_history(config, {"owner": "alice", "project": project}, "codes.txt") == ""
        assert project_history(config, {"owner": "../bob", "project": "secret"}, "codes.txt") == ""
        assert project_history(config, {"owner": "alice", "project": "secret"}, "codes.txt") == ""


def test_without_vmd_the_answer_says_the_history_is_missing(tmp_path):
    config = ServiceConfig(vmd_socket=str(tmp_path / "no-vmd.sock"))
    said = project_history(config, {"owner": "bob", "project": "secret"}, "codes.txt")
    assert said.startswith("(vmd could not be asked for this project's history") and "not part of this answer" in said


def test_only_plain_file_names_from_a_question_reach_git():
    question = "what about -rf.py, --output=x, src/app.py, ../../etc/passwd.txt, é.py and main.py, main.py?"
    assert project_files_in(question) == ["src/app.py", "main.py"]
    assert project_files_in("a.py b.py c.py d.py") == ["a.py", "b.py", "c.py"]


PLANTED = ("textconv", "extdiff", "external", "fsmonitor", "gpg", "pager")


def _planted_repo(tmp_path: Path, state: Path) -> tuple[Path, Path, Path]:
    """vmd's repository of alice/notes, with a diff driver named in .gitattributes (committed,
    and in info/attributes, which git 2.39 reads for a bare repository) and programs in its
    config (textconv, external diff, fsmonitor, gpg with showSignature, pager) that each leave
    a marker named for itself; HEAD is signed so that the gpg program would be asked."""
    markers = tmp_path / "markers"
    markers.mkdir()
    repo = vmd_project_repo(state, "alice", "notes", [
        ("first notes", {"notes.txt": "a\n", ".gitattributes": "*.txt diff=evil\n"}),
        ("more notes", {"notes.txt": "a\nb\n"}),
    ])
    (repo / "info" / "attributes").write_text("*.txt diff=evil\n")
    programs = {}
    for name in PLANTED:
        program = tmp_path / f"{name}.sh"
        program.write_text(f'#!/bin/sh\ntouch "{markers}/{name}"\ncat "$1" 2>/dev/null\n')
        program.chmod(0o755)
        programs[name] = str(program)
    git = lambda *a: subprocess.run(["git", f"--git-dir={repo}", *a], check=True, capture_output=True, text=True)
    for key, value in (("diff.evil.textconv", programs["textconv"]), ("diff.evil.command", programs["extdiff"]),
                       ("diff.external", programs["external"]), ("core.fsmonitor", programs["fsmonitor"]),
                       ("log.showSignature", "true"), ("gpg.program", programs["gpg"]),
                       ("core.pager", programs["pager"])):
        git("config", key, value)
    raw = git("cat-file", "commit", "HEAD").stdout
    signed = raw.replace("\n\n", "\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEz\n -----END PGP SIGNATURE-----\n\n", 1)
    sha = subprocess.run(["git", f"--git-dir={repo}", "hash-object", "-t", "commit", "-w", "--stdin"],
                         input=signed, check=True, capture_output=True, text=True).stdout.strip()
    git("update-ref", "refs/heads/main", sha)
    return state, repo, markers


def test_programs_planted_in_a_repositorys_config_and_attributes_do_not_run(tmp_path):
    with running_vmd(tmp_path) as vmd:
        _planted_programs_do_not_run(tmp_path, vmd)


def _planted_programs_do_not_run(tmp_path: Path, vmd) -> None:
    state, repo, markers = _planted_repo(tmp_path, vmd.config.state_dir)
    # The trap is armed: plain `git log -p` on this repository runs the planted programs.
    plain_env = {**os.environ, "GIT_DIR": str(repo)}
    subprocess.run(["git", "log", "-p", "-n", "3", "--", "notes.txt"], capture_output=True, env=plain_env)
    subprocess.run(["git", "log", "-p", "--ext-diff", "-n", "1"], capture_output=True, env=plain_env)
    assert {"textconv", "gpg", "extdiff"} <= {p.name for p in markers.iterdir()}
    for marker in markers.iterdir():
        marker.unlink()

    history = project_history(ServiceConfig(vmd_socket=vmd.socket), {"owner": "alice", "project": "notes"},
                              "What changed in notes.txt?")
    assert "more notes" in history and "first notes" in history
    assert "+b" in history and "$ git log -p -n 3" in history
    assert list(markers.iterdir()) == []


@uses_scripted_worker
def test_asking_about_a_job_over_http_runs_no_planted_program(tmp_path):
    with running_vmd(tmp_path) as vmd:
        _, _, markers = _planted_repo(tmp_path, vmd.config.state_dir)
        _ask_with_planted_programs(ServiceProcess(tmp_path / "svc", vmd_socket=vmd.socket).start(), markers)


def _ask_with_planted_programs(svc: ServiceProcess, markers: Path) -> None:
    try:
        alice = svc.client()
        job = wait_for_state(alice, start(alice, "notes", project="notes")["id"], "done")
        answer = alice.post(f"/jobs/{job['id']}/ask", json={"question": "What changed in notes.txt?"}).json()
        assert "git" in answer["sources"] and "[git] +++ b/notes.txt" in answer["answer"]
        assert list(markers.iterdir()) == []
    finally:
        svc.stop()
        stop_workers(svc)


def test_an_older_job_database_gains_the_ended_column(tmp_path):
    from vmagent.service.store import Store

    db = tmp_path / "jobs.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, chat_id TEXT NOT NULL DEFAULT '', "
                     "message_id TEXT NOT NULL DEFAULT '', task TEXT NOT NULL, os TEXT NOT NULL, project TEXT, "
                     "model TEXT, state TEXT NOT NULL, question TEXT, report TEXT, session_id TEXT, "
                     "verification_passed INTEGER, steps INTEGER NOT NULL DEFAULT 0, status_line TEXT NOT NULL "
                     "DEFAULT '', tasks_text TEXT NOT NULL DEFAULT '', preview_ready INTEGER NOT NULL DEFAULT 0, "
                     "screenshot_seq INTEGER NOT NULL DEFAULT 0, preview_secret TEXT NOT NULL, worker_pid INTEGER, "
                     "frames_offset INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL)")
        conn.execute("INSERT INTO jobs (id, owner, task, os, state, preview_secret, created, updated) "
                     "VALUES ('old', 'alice', 't', 'debian', 'done', 's', 1, 2)")
    store = Store(tmp_path)
    assert store.get_job("old")["ended"] is None
    job = store.create_job(owner="alice", task="t", os="debian", project=None)
    assert store.set_state(job["id"], "done")["ended"] is not None
    assert store.get_job(job["id"])["ended"] >= job["created"]
    store.close()
