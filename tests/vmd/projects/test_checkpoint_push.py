"""Every checkpoint (a closed task) is pushed to Gitea when it is made, so that a host lost
mid-job leaves its work where another host's vmd opens the project (issue 25 item 3).

A real vmd on its socket over the stand-in machines (tests/support/vmd_fakes.py), Gitea the
stand-in of tests/support/gitea_server.py (git's smart HTTP into real bare repositories)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

from tests.support.gitea_server import start_gitea
from tests.support.vmd_fakes import LocalMachines, RpcClient, make_config
from vmd.projects.store import CHECKPOINT_STATUS
from vmd.server.rpc import VmdServer

TOKEN = "0123456789abcdef0123456789abcdef01234567"


@contextlib.contextmanager
def vmd_with_gitea(folder: Path, gitea):
    """A vmd of its own (state folder, socket) that keeps its projects on `gitea`."""
    config = make_config(folder, gitea_url=gitea.url, gitea_token=TOKEN, gitea_owner_mode="user")
    server = VmdServer(config, LocalMachines()).start()
    client = RpcClient(config.socket, timeout=60)
    try:
        yield client, config
    finally:
        client.close()
        server.stop()


def git(gitea, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(gitea.repo_path("alice", "greet")), *args],
                          capture_output=True, text=True, check=True).stdout


def record(config, session_id: str) -> list[dict]:
    path = config.sessions_dir / session_id / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_closed_task_is_on_gitea_at_once_pending_and_the_close_pushes_on_from_it(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as gitea, vmd_with_gitea(tmp_path / "a", gitea) as (c, config):
        sid = c.call("session_open", project="greet", owner="alice", task="greet people")["session_id"]
        c.call("plan_tasks", tasks=["write greet.py", "run it"])
        c.call("write_file", path="greet.py", content="print('hello')\n")
        c.call("run", command="python3 greet.py")
        answer = c.call("update_task", id=1, status="done")["text"]
        assert "Checkpoint" in answer and "Pushed." in answer

        # On Gitea now, before any close: the branch is the checkpoint, with the file.
        head = git(gitea, "rev-parse", "main").strip()
        assert git(gitea, "log", "-1", "--format=%s", "main").strip() == "Task 1 done: write greet.py"
        assert git(gitea, "show", "main:greet.py") == "print('hello')\n"
        statuses = gitea.statuses[f"alice/greet@{head}"]
        assert [(s["state"], s["description"]) for s in statuses] == [("pending", CHECKPOINT_STATUS)]
        pushed = [e for e in record(config, sid) if e["kind"] == "checkpoint" and e.get("event") == "pushed"]
        assert [e["sha"] for e in pushed] == [head]

        c.call("write_file", path="greet.py", content="print('hello, world')\n")
        c.call("update_task", id=2, status="done")
        c.call("finish", summary="greets", verification="python3 greet.py | grep -q world")
        closed = c.call("session_close")

    # The close's push is a fast-forward from the checkpoints: all three commits, in order.
    assert closed["pushed"] is True
    assert git(gitea, "rev-parse", "main").strip() == closed["commit"]
    assert git(gitea, "log", "--reverse", "--format=%s", "main").splitlines() == [
        "Task 1 done: write greet.py", "Task 2 done: run it", "greet people"]
    assert any(s["state"] == "success" for s in gitea.statuses[f"alice/greet@{closed['commit']}"])


def test_another_vmd_opens_the_project_at_the_checkpoint_of_a_session_that_never_closed(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as gitea:
        with vmd_with_gitea(tmp_path / "a", gitea) as (a, _):
            a.call("session_open", project="greet", owner="alice", task="greet people")
            a.call("plan_tasks", tasks=["write greet.py", "write names.txt"])
            a.call("write_file", path="greet.py", content="print('hello')\n")
            a.call("run", command="true")
            a.call("update_task", id=1, status="done")
            a.call("write_file", path="names.txt", content="not committed\n")
            # Host A is lost here: its vmd stops with the session open (no close, no push).
        with vmd_with_gitea(tmp_path / "b", gitea) as (b, config_b):
            opened = b.call("session_open", project="greet", owner="alice", task="greet people")
            b.call("plan_tasks", tasks=["carry on"])
            listing = b.call("run", command="cat greet.py; ls")
            log = b.call("history", owner="alice", project="greet", max_commits=1)
        assert "restored 1 commit" in opened["storage"]
        folder = config_b.projects_dir / "alice" / "greet"
        assert (folder / "greet.py").read_text() == "print('hello')\n"
        assert not (folder / "names.txt").exists()  # what A never committed went with A
        assert "print('hello')" in listing["stdout"]
        assert "Task 1 done: write greet.py" in log["text"]


def test_a_gitea_that_refuses_the_push_costs_a_note_and_the_task_stays_done(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as gitea, vmd_with_gitea(tmp_path / "a", gitea) as (c, config):
        sid = c.call("session_open", project="greet", owner="alice", task="greet people")["session_id"]
        c.call("plan_tasks", tasks=["write greet.py"])
        c.call("write_file", path="greet.py", content="print('hello')\n")
        c.call("run", command="true")
        gitea.reject_git = True  # the token is revoked for git
        answer = c.call("update_task", id=1, status="done")
        assert "[x] 1. write greet.py" in answer["tasks"]
        assert "Checkpoint" in answer["text"] and "not pushed now" in answer["text"]
        notes = [e for e in record(config, sid) if e["kind"] == "checkpoint" and e.get("event") == "not_pushed"]
        assert len(notes) == 1 and notes[0]["text"].startswith(f"checkpoint {notes[0]['sha'][:10]} of task 1 "
                                                              "not pushed: ")
        assert "refused the token" in notes[0]["text"] and TOKEN not in notes[0]["text"]
        assert gitea.repo("alice", "greet") is None or not gitea.heads(gitea.repo("alice", "greet"))

        gitea.reject_git = False  # Gitea is back: the close pushes the checkpoint with the rest
        c.call("finish", summary="greets", verification="python3 greet.py")
        closed = c.call("session_close")
    assert closed["pushed"] is True
    assert git(gitea, "log", "--reverse", "--format=%s", "main").splitlines() == [
        "Task 1 done: write greet.py", "greet people"]


def test_without_gitea_the_checkpoint_stays_in_vmds_repository(tmp_path):
    config = make_config(tmp_path)
    server = VmdServer(config, LocalMachines()).start()
    c = RpcClient(config.socket, timeout=60)
    try:
        sid = c.call("session_open", project="greet", task="greet people")["session_id"]
        c.call("plan_tasks", tasks=["write greet.py"])
        c.call("run", command="echo hi > greet.txt")
        answer = c.call("update_task", id=1, status="done")["text"]
    finally:
        c.close()
        server.stop()
    assert "Checkpoint" in answer and "push" not in answer.lower()
    events = [e for e in record(config, sid) if e["kind"] == "checkpoint"]
    assert len(events) == 1 and events[0]["commit"]
