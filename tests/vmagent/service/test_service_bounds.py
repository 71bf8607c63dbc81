"""What one guest can do to the job service's disk, its other users and its operator
(issue 20): a flood of output lines stays a bounded number of stored events, the service's
files are private whatever the umask, and a malformed bearer token is a 401. Over real HTTP
to a real `vmagent serve`; guest text in reports is tests/vmagent/service/test_report_fences.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_traversable
from tests.vmd.server.test_private_state import readable_as
from tests.support.service_harness import ALICE, SERVICE, ServiceProcess, uses_scripted_worker, wait_for_state
from tests.vmagent.service.test_service_api import start
from vmagent.service.frames import MAX_FRAME_BYTES, MAX_OUTPUT_LINES_PER_COMMAND, FrameReader
from vmagent.service.store import Store

MiB = 1024 * 1024
FLOOD_LINES = 1_000_000

# A worker that does what a guest's `yes '' | head -n 1000000` makes of a real one: a
# million empty output frames for one command, then a short second command and its end.
FLOOD_WORKER = r'''
import json, sys
out = sys.stdout
def emit(frame):
    out.write(json.dumps(frame) + "\n")
emit({"type": "status", "text": "flooding"})
emit({"type": "command", "command": "yes '' | head -n %d"})
line = json.dumps({"type": "output", "stream": "stdout", "line": ""}) + "\n"
for _ in range(%d // 10000):
    out.write(line * 10000)
emit({"type": "status", "text": "after the flood"})
emit({"type": "command", "command": "echo second"})
emit({"type": "output", "stream": "stdout", "line": "second command's line"})
emit({"type": "done", "outcome": {"state": "done", "report": "# Job done\n\nflooded", "steps": 2}})
''' % (FLOOD_LINES, FLOOD_LINES)


def events_of(svc: ServiceProcess, job_id: str) -> list[dict]:
    with sqlite3.connect(svc.data_dir / "jobs.sqlite3") as db:
        return [json.loads(row[0]) for row in
                db.execute("SELECT data FROM events WHERE job_id = ? ORDER BY seq", (job_id,))]


def database_bytes(data_dir: Path) -> int:
    """The database file's size with its write-ahead log folded in (a checkpoint)."""
    with sqlite3.connect(data_dir / "jobs.sqlite3") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return (data_dir / "jobs.sqlite3").stat().st_size


def test_a_million_empty_lines_grow_the_database_by_less_than_2_mib(tmp_path):
    worker = tmp_path / "flood_worker.py"
    worker.write_text(FLOOD_WORKER)
    svc = ServiceProcess(tmp_path / "svc", worker_command=[sys.executable, str(worker)]).start()
    try:
        alice = svc.client()
        before = database_bytes(svc.data_dir)
        began = time.monotonic()
        job = wait_for_state(alice, start(alice, "print a million empty lines")["id"], "done", timeout=240)
        took = time.monotonic() - began
    finally:
        svc.stop()
    growth = database_bytes(svc.data_dir) - before
    print(f"\n{FLOOD_LINES:,} output frames: database grew {growth / MiB:.2f} MiB, job took {took:.1f} s")
    assert growth < 2 * MiB, f"the database grew {growth:,} bytes for {FLOOD_LINES:,} empty lines"
    events = events_of(svc, job["id"])
    outputs = [e for e in events if e["type"] == "output"]
    notices = [e for e in outputs if e.get("stream") == "service"]
    # One notice for the flood, with the exact count of what was not stored.
    assert len(notices) == 1, notices
    dropped = FLOOD_LINES - MAX_OUTPUT_LINES_PER_COMMAND
    assert notices[0]["dropped"] == dropped
    assert f"{dropped:,} more lines not stored; the full output is in the command's result" in notices[0]["line"]
    # What came after the flood is all there: status, the next command and its line, done.
    statuses = [e["text"] for e in events if e["type"] == "status"]
    assert "after the flood" in statuses
    assert {"type": "output", "stream": "stdout", "line": "second command's line"} in outputs
    assert [e["type"] for e in events][-2:] == ["done", "state"] and job["report"].endswith("flooded")
    assert len(outputs) == MAX_OUTPUT_LINES_PER_COMMAND + 1 + 1


def test_a_frame_longer_than_the_bound_is_cut_and_the_next_ones_still_read(tmp_path):
    path = tmp_path / "frames.ndjson"
    huge = b'{"type": "output", "line": "' + b"x" * (MAX_FRAME_BYTES + 3 * MiB) + b'"}\n'
    path.write_bytes(b'{"type": "status", "text": "one"}\n' + huge + b'{"type": "status", "text": "two"}\n')
    reader, lines = FrameReader(path, 0), []
    while reader.read(lines.append):
        assert len(reader._partial) <= MAX_FRAME_BYTES  # never more than one frame's bound held
    assert [json.loads(lines[0]), json.loads(lines[2])] == [{"type": "status", "text": "one"},
                                                           {"type": "status", "text": "two"}]
    assert len(lines[1]) < 10_000 and lines[1].endswith(b"cut)") and reader.cut_frames == 1
    assert reader.offset == path.stat().st_size


@uses_scripted_worker
def test_nothing_the_service_writes_is_open_to_other_users_whatever_the_umask(tmp_path):
    make_traversable(tmp_path)  # pytest's folders are 0700: another uid must reach the data dir
    data = tmp_path / "svc" / "data"
    old = os.umask(0)
    try:
        # The config and log the harness writes live beside the data folder, not in it.
        svc = ServiceProcess(tmp_path / "svc")
        svc.config["data_dir"] = str(data)
        svc.start()
        try:
            alice = svc.client()
            done = wait_for_state(alice, start(alice, "write hello world")["id"], "done")
            waiting = wait_for_state(alice, start(alice, "a question", chat_id="chat-2")["id"], "needs_input")
            assert alice.post(f"/jobs/{waiting['id']}/answer", json={"answer": "8080"}).status_code == 200
            wait_for_state(alice, waiting["id"], "done")
            assert alice.get(f"/jobs/{done['id']}/screen.png").status_code == 200
        finally:
            svc.stop()
    finally:
        os.umask(old)
    seen, open_to_others = [], []
    for root, dirs, files in os.walk(data):
        for name in [*dirs, *files]:
            path = Path(root) / name
            seen.append(path.relative_to(data).as_posix())
            if path.lstat().st_mode & 0o077:
                open_to_others.append(f"{path.relative_to(data)} {stat.filemode(path.lstat().st_mode)}")
    assert data.stat().st_mode & 0o777 == 0o700
    assert not open_to_others, open_to_others
    if os.geteuid() == 0:  # and a process of another user opens nothing there
        assert opened_by_nobody([data, *(data / p for p in seen)]) == []
    for expected in ("jobs.sqlite3", "jobs", f"jobs/{done['id']}/frames.ndjson", f"jobs/{done['id']}/worker.log",
                     f"jobs/{done['id']}/job.json", f"jobs/{done['id']}/screen.png",
                     f"jobs/{done['id']}/transcript.json"):
        assert expected in seen, (expected, seen)


def opened_by_nobody(paths: list[Path]) -> list[str]:
    """The paths that uid/gid 65534 (nobody) can list or open, tried from a forked child."""
    return readable_as(65534, 65534, paths)


# Authorization headers as they come over the wire.
MALFORMED_AUTHORIZATION = [
    "Bearer tøken".encode(),  # UTF-8 bytes, read by the server as Latin-1 text
    "Bearer tøken".encode("latin-1"), b"Bearer \xff\xfe\x80", b"Bearer " + "☃".encode() * 50,
    b"Bearer", b"Basic YWxpY2U6eA==", b"Bearer " + b"a" * 8000, b"Bearer " + SERVICE.encode() + "é".encode(),
]


@pytest.mark.parametrize("authorization", MALFORMED_AUTHORIZATION, ids=range(len(MALFORMED_AUTHORIZATION)))
def test_a_malformed_bearer_token_is_a_401_never_a_500(tmp_path, authorization):
    svc = ServiceProcess(tmp_path / "svc").start()
    try:
        plain = httpx.Client(base_url=svc.url, timeout=15)
        for method, path, body in (("GET", "/jobs", None), ("POST", "/jobs", {"task": "x"}),
                                   ("GET", "/jobs/0123456789abcdef", None)):
            headers = {"Authorization": authorization, "X-OpenWebUI-User-Id": "user-7"}
            reply = plain.request(method, path, headers=headers, json=body)
            assert reply.status_code == 401, (method, path, reply.status_code, reply.text[:300])
            assert "token" in reply.json()["detail"]
        # The right tokens still work beside them.
        assert svc.client(ALICE).get("/jobs").status_code == 200
    finally:
        svc.stop()
    assert "Traceback" not in (svc.data_dir / "service.log").read_text()
