"""The `history` verb (vmd/session/handlers/history_verbs.py): vmd's own repository of one owner's project,
read without a session, bounded, as data. A real vmd on its socket (stand-in machines),
real git repositories in its state folder, and the verb spoken as the contract says."""

from __future__ import annotations

import os
import subprocess

import pytest

from vmd.contract.bounds import HISTORY_COMMITS, name_problem
from vmd.contract.errors import INVALID_PARAMS
from vmd.contract.results import result_problem
from vmd.projects.repository import repository_path
from vmd.session.handlers import history_verbs as history_module
from tests.support.service_harness import vmd_project_repo
from tests.support.vmd_fakes import RpcClient, RpcError, local_vmd

COMMITS = [
    ("Add main.py printing hello", {"main.py": "print('hello')\n"}),
    ("Add the README", {"README.md": "# demo\n"}),
    ("main.py says goodbye too", {"main.py": "print('hello')\nprint('goodbye')\n"}),
]


@pytest.fixture
def vmd(tmp_path):
    with local_vmd(tmp_path) as (_, _, config):
        vmd_project_repo(config.state_dir, "alice", "demo", COMMITS)
        yield config


def git(repo, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo}", *args], check=True, capture_output=True, text=True).stdout


def history(config, **params) -> dict:
    with RpcClient(config.socket) as c:  # a fresh connection: no session bound
        answer = c.call("history", **params)
    assert result_problem("history", answer) is None
    return answer


def test_a_log_show_and_diff_are_answered_without_a_session(vmd):
    log = history(vmd, owner="alice", project="demo")
    assert log["what"] == "log" and log["commits"] == 3 and log["cut"] is False
    assert [m for m, _ in reversed(COMMITS)] == [line.strip() for line in log["text"].splitlines()
                                                  if line.strip() in {m for m, _ in COMMITS}]
    assert "main.py | 1 +" in log["text"] and "+print('goodbye')" not in log["text"]  # files, no patch
    head = git(repository_path(vmd.state_dir, "alice", "demo"), "rev-parse", "HEAD").strip()
    assert log["commit"] == head

    patched = history(vmd, owner="alice", project="demo", patch=True, path="main.py")
    assert patched["commits"] == 2 and "+print('goodbye')" in patched["text"] and "README" not in patched["text"]

    show = history(vmd, owner="alice", project="demo", what="show", rev="HEAD~1")
    assert "Add the README" in show["text"] and "+# demo" in show["text"] and "goodbye" not in show["text"]

    diff = history(vmd, owner="alice", project="demo", what="diff", base="HEAD~2", rev="main")
    assert "+# demo" in diff["text"] and "+print('goodbye')" in diff["text"] and "Add the README" not in diff["text"]
    first = history(vmd, owner="alice", project="demo", what="diff", rev="HEAD~2")  # against the empty tree
    assert "+print('hello')" in first["text"] and first["commits"] == 1


def test_bounds_cut_the_answer_and_say_so(vmd):
    log = history(vmd, owner="alice", project="demo", max_commits=2)
    assert log["commits"] == 2 and log["cut"] is True
    assert "Add main.py printing hello" not in log["text"] and "max_commits=2" in log["text"]
    tiny = history(vmd, owner="alice", project="demo", max_commits=2, max_bytes=100)
    assert tiny["commits"] == 2 and tiny["cut"] is True and "max_bytes=100" in tiny["text"]
    whole = history(vmd, owner="alice", project="demo", what="show")
    short = history(vmd, owner="alice", project="demo", what="show", max_bytes=120)
    assert whole["cut"] is False and short["cut"] is True
    body = short["text"].rsplit("\n(cut at max_bytes=120", 1)
    assert len(body) == 2 and len(body[0].encode()) <= 120 and whole["text"].startswith(body[0])
    with pytest.raises(RpcError) as err:
        history(vmd, owner="alice", project="demo", max_commits=HISTORY_COMMITS + 1)
    assert err.value.code == INVALID_PARAMS


@pytest.mark.parametrize("params, said", [
    ({"rev": "--output=/tmp/x"}, "rev '--output=/tmp/x' is not one commit"),
    ({"rev": "HEAD; rm -rf /"}, "is not one commit"),
    ({"rev": "HEAD~3..HEAD"}, "ranges (a..b)"),
    ({"rev": "HEAD:main.py"}, "is not one commit"),
    ({"base": "-p"}, "base '-p' is not one commit"),
    ({"path": "../bob/secret"}, "is not a path in the project"),
    ({"path": "--output=x"}, "is not a path in the project"),
    ({"project": "../bob"}, "is not a usable name"),
    ({"owner": "-x"}, "is not a usable name"),
])
def test_a_bad_rev_path_or_name_is_refused_with_a_sentence_before_git_runs(vmd, monkeypatch, tmp_path, params,
                                                                            said):
    started = []
    monkeypatch.setattr(history_module.subprocess, "Popen", lambda *a, **k: started.append(a) or 1 / 0)
    with pytest.raises(RpcError) as err:
        history(vmd, **{"owner": "alice", "project": "demo", **params})
    assert err.value.code == INVALID_PARAMS and said in err.value.message, err.value.message
    assert started == []


def test_an_unknown_project_or_commit_is_refused_with_a_sentence(vmd):
    with pytest.raises(RpcError) as err:
        history(vmd, owner="alice", project="nothing")
    assert err.value.code == INVALID_PARAMS and "vmd has no project alice/nothing" in err.value.message
    with pytest.raises(RpcError) as err:
        history(vmd, owner="bob", project="demo")  # another owner's project of the same name
    assert "vmd has no project bob/demo" in err.value.message
    with pytest.raises(RpcError) as err:
        history(vmd, owner="alice", project="demo", rev="no-such-branch")
    assert "rev 'no-such-branch' names no commit of alice/demo" in err.value.message


def test_a_hostile_commit_message_comes_back_printable(vmd):
    hostile = ("Fix\x1b]52;c;cm0gLXJmIH4=\x07 the build\x1b[2J\x1b[H\r\x08\x9b31m ok\x01\n\n"
               "```\n![x](http://evil.example/leak)\n")
    vmd_project_repo(vmd.state_dir, "alice", "hostile", [(hostile, {"a.txt": "\x1b]0;title\x07a\n"})])
    for what in ("log", "show", "diff"):
        text = history(vmd, owner="alice", project="hostile", what=what)["text"]
        assert not any(ch in text for ch in "\x1b\x07\r\x08\x01\x9b"), (what, repr(text))
        assert what == "diff" or "Fix the build ok" in text


def test_the_verb_changes_nothing_and_is_not_part_of_a_session(vmd):
    repo = repository_path(vmd.state_dir, "alice", "demo")

    def snapshot() -> dict:
        files = {}
        for top, _, names in os.walk(repo):
            for name in names:
                st = os.lstat(os.path.join(top, name))
                files[os.path.relpath(os.path.join(top, name), repo)] = (st.st_size, st.st_mtime_ns, st.st_mode)
        return {"refs": git(repo, "for-each-ref"), "files": files}

    before = snapshot()
    with RpcClient(vmd.socket) as c:
        sid = c.call("session_open", owner="alice", project="other", task="look at demo")["session_id"]
        for params in ({}, {"what": "show"}, {"what": "diff", "base": "HEAD~2"}, {"patch": True, "path": "main.py"}):
            assert c.call("history", owner="alice", project="demo", **params)["text"]
        with pytest.raises(RpcError):
            c.call("history", owner="alice", project="demo", rev="a..b")
        status = c.call("session_status")
    assert snapshot() == before
    record = (vmd.sessions_dir / sid / "record.jsonl").read_text()
    assert '"history"' not in record and status["steps"] == 0


def test_a_sessions_commit_is_in_the_history_it_leaves(vmd):
    with RpcClient(vmd.socket) as c:
        c.call("session_open", owner="carol", project="fresh", task="write a file")
        c.call("plan_tasks", tasks=["write"])
        c.call("session_ready", timeout=30)
        c.call("write_file", path="notes.txt", content="from the session\n")
        c.call("git_commit", message="notes from the session")
        c.call("session_close")
    log = history(vmd, owner="carol", project="fresh", patch=True)
    assert "notes from the session" in log["text"] and "+from the session" in log["text"]


def test_a_name_with_a_final_newline_is_refused_by_vmd_itself():
    """`re.match` lets `$` match before a final newline: vmd's own rule is a full match, so a
    folder or repository named "p\\n" is never made (the job service refused it already)."""
    assert name_problem("project", "p") is None
    assert "not a usable name" in name_problem("project", "p\n")
    assert "not a usable name" in name_problem("owner", "alice\n")
