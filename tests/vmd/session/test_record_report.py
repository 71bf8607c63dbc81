"""The record keeps what was served without secrets or file bodies; the report is
built from the record alone."""

from __future__ import annotations

import json
import shutil
import subprocess

from tests.support.vmd_wire import WireVmd
from vmd.session.record import Record, Redactor, read_record
from vmd.session.report import build_report
from vmd.server.rpc import VmdServer
from tests.support.gitea_server import start_gitea
from tests.support.vmd_fakes import LocalMachines, make_config

TOKEN = "0123456789abcdef0123456789abcdef01234567"


def test_redactor_removes_the_token_and_credential_looking_text():
    r = Redactor([TOKEN])
    cleaned = r.value({"command": f"curl -H 'Authorization: token {TOKEN}' x; export API_TOKEN=hunter22; "
                                  "mysql --password=swordfish; echo ghp_abcdefghijklmnopqrstuvwx",
                       "password": "pw1234", "content": "line one\nline two\n"})
    text = json.dumps(cleaned)
    for secret in (TOKEN, "hunter22", "swordfish", "ghp_abcdefghijklmnop", "pw1234"):
        assert secret not in text
    assert cleaned["content"].startswith("<18 bytes, sha256 ") and "line one" in cleaned["content"]


def test_a_torn_last_line_is_skipped(tmp_path):
    record = Record(tmp_path)
    record.append("note", turn=1, text="kept")
    with open(record.path, "a") as fh:
        fh.write('{"time": "2026-01-01T00:00:00+00:00", "kind": "no')
    assert [e["text"] for e in read_record(record.path)] == ["kept"]


def test_session_to_gitea_record_and_report_hold_no_token_and_link_the_commit(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as gitea:
        config = make_config(tmp_path, gitea_url=gitea.url, gitea_token=TOKEN, gitea_owner_mode="user")
        server = VmdServer(config, LocalMachines()).start()
        try:
            c = WireVmd(config.socket, timeout=60).connect()
            sid = c.call("session_open", project="reported", owner="alice", task="Write hello.py\nwith a test")["session_id"]
            c.call("plan_tasks", tasks=["write hello.py", "test it"])
            c.call("note", turn=2, text="starting with the file")
            body = "print('hello')\n" * 50
            c.call("write_file", path="hello.py", content=body)
            c.call("run", command=f"GITEA_TOKEN={TOKEN} python3 hello.py | head -1")
            c.call("read_file", path="hello.py")
            c.call("update_task", id=1, status="done")
            c.call("update_task", id=2, status="blocked", note="no test runner in the guest")
            c.call("finish", summary="hello works", verification={"command": "python3 hello.py >/dev/null"})
            closed = c.call("session_close")
            c.close()
        finally:
            server.stop()
        assert closed["pushed"] is True and closed["web_url"].endswith(f"/commit/{closed['commit']}")
        assert any(s["state"] == "success" for s in gitea.statuses.get(f"alice/reported@{closed['commit']}", []))
        pushed = subprocess.run(["git", "--git-dir", str(gitea.repo_path("alice", "reported")), "rev-parse",
                                 "main"], capture_output=True, text=True, check=True).stdout.strip()
        assert pushed == closed["commit"]

    session_dir = config.sessions_dir / sid
    record_text = (session_dir / "record.jsonl").read_text()
    assert TOKEN not in record_text
    assert "print('hello')\\nprint" not in record_text  # bodies are summarised
    assert "750 bytes, sha256" in record_text
    for path in (config.projects_dir / "alice" / "reported").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path

    # The report needs nothing but the record: copy it away from everything else.
    alone = tmp_path / "alone" / "record.jsonl"
    alone.parent.mkdir()
    shutil.copy(session_dir / "record.jsonl", alone)
    shutil.rmtree(config.state_dir)
    report = build_report(alone)
    md = report.markdown
    assert TOKEN not in md
    assert report.outcome["status"] == "passed" and report.outcome["exit_code"] == 0
    assert "`python3 hello.py >/dev/null`" in md
    assert "[x] 1. write hello.py" in md and "[!] 2. test it — no test runner in the guest" in md
    assert "`A hello.py`" in md
    assert closed["web_url"] in md and closed["commit"][:12] in md
    assert "turn 2: starting with the file" in md
    assert "calls (" in md and "command run" in md  # one run in this session
    assert md.index("## Verification") < md.index("## Tasks") < md.index("## Files changed") < md.index("## Commit")


def test_report_of_a_session_that_never_finished_says_unverified(tmp_path):
    config = make_config(tmp_path)
    server = VmdServer(config, LocalMachines()).start()
    try:
        with WireVmd(config.socket, timeout=60).connect() as c:
            c.call("session_open", task="abandoned")
            c.call("plan_tasks", tasks=["start"])
            c.call("session_cancel")
            report = c.call("report")
    finally:
        server.stop()
    assert report["outcome"]["status"] == "unverified"
    assert "not verified" in report["markdown"] and "cancelled" in report["markdown"]
