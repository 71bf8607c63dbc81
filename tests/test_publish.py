"""Host-side git of a project folder: restore on open, commit, push to a real HTTP server
speaking Gitea (API + git smart HTTP through `git http-backend`) or to a local bare
repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.gitea_server import start_gitea
from vmd.publish import (PublishError, PushResult, Remote, commit_project, prepare_project,
                         push_project)

TOKEN = "tok-7c21e9-publish-test"


@pytest.fixture
def gitea(tmp_path):
    with start_gitea(tmp_path, TOKEN) as server:
        yield server


def gitea_remote(gitea, tmp_path, **fields) -> Remote:
    fields.setdefault("owner", "alice")
    fields.setdefault("project", "calc")
    return Remote(description="Build a calculator", gitea_url=gitea.url, gitea_token=TOKEN,
                  state_dir=tmp_path / "state", gitea_backoff_s=0.01, **fields)


def local_remote(tmp_path, **fields) -> Remote:
    fields.setdefault("owner", "alice")
    return Remote(project="calc", state_dir=tmp_path / "state", **fields)


def git_log(git_dir: Path) -> list[str]:
    out = subprocess.run(["git", "--git-dir", str(git_dir), "log", "--format=%H %s", "main"],
                         capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


# --- commit -------------------------------------------------------------------------

def test_commit_records_every_file_as_vmagent(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    write(project, "calc.py", "print(1+1)\n")
    write(project, "docs/README.md", "# calc\n")
    sha = commit_project(project, "Build a calculator")
    assert sha and len(sha) == 40
    show = subprocess.run(["git", "-C", str(project), "show", "--stat", "--format=%an <%ae>|%s",
                           sha], capture_output=True, text=True, check=True).stdout
    assert show.startswith("vmagent <vmagent@localhost>|Build a calculator")
    assert "calc.py" in show and "docs/README.md" in show


def test_commit_when_nothing_changed_returns_the_same_head(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    write(project, "a.txt", "a")
    first = commit_project(project, "one")
    assert commit_project(project, "two") == first
    assert commit_project(project, "three") == first
    assert len(git_log(project / ".git")) == 1


def test_commit_of_an_empty_folder_returns_none(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    assert commit_project(project, "nothing") is None


def test_commit_initialises_a_folder_that_was_never_prepared(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    write(project, "a.txt", "a")
    assert commit_project(project, "first") is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to uid 1000")
def test_commit_takes_files_owned_by_the_guest_uid(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    write(project, "guest.txt", "written in the guest")
    for path in [project, *project.rglob("*")]:
        os.chown(path, 1000, 1000)
    sha = commit_project(project, "guest work")
    assert sha is not None
    files = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(project), "ls-files"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert files == ["guest.txt"]


def test_a_guest_planted_hook_and_config_do_not_run_on_the_host(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    marker = tmp_path / "ran"
    hook = project / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    with open(project / ".git" / "config", "a") as config:
        config.write(f'[core]\n\tfsmonitor = "touch {marker}-fsmonitor; echo"\n'
                     f'\tworktree = {tmp_path}\n'
                     f'[filter "x"]\n\tclean = "touch {marker}-filter; cat"\n'
                     f'[user]\n\tname = guest\n')
    write(project, ".gitattributes", "* filter=x\n")
    write(project, "a.txt", "a")
    assert commit_project(project, "work") is not None
    assert not list(tmp_path.glob("ran*"))
    config = (project / ".git" / "config").read_text()
    assert "fsmonitor" not in config and "filter" not in config and "worktree" not in config
    assert "name = guest" in config  # harmless keys survive
    files = subprocess.run(["git", "-C", str(project), "ls-files"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert files == [".gitattributes", "a.txt"]  # the worktree stayed the project folder


def test_a_git_folder_holding_a_symlink_is_refused(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    (project / ".git" / "info" / "evil").symlink_to("/etc")
    with pytest.raises(PublishError, match="symbolic link"):
        commit_project(project, "work")


# --- push to Gitea ------------------------------------------------------------------

def test_push_creates_the_repo_and_lands_the_commit_with_topics_and_status(gitea, tmp_path):
    project = tmp_path / "p"
    remote = gitea_remote(gitea, tmp_path)
    assert prepare_project(project, remote).startswith("new project")
    write(project, "calc.py", "print(2)\n")
    sha = commit_project(project, "Build a calculator")
    result = push_project(project, remote, status="success",
                          status_description="vmd ran `pytest -q`: exit 0")
    assert result.pushed and result.error is None and result.warnings == []
    assert result.sha == sha and result.branch == "main"
    assert result.remote_display == f"{gitea.url}/alice/calc.git"
    assert result.web_url == f"{gitea.url}/alice/calc/commit/{sha}"
    assert git_log(gitea.repo_path("alice", "calc")) == [f"{sha} Build a calculator"]
    assert gitea.descriptions["alice/calc"] == "Build a calculator"
    assert gitea.topics["alice/calc"] == ["vmagent"]
    [status] = gitea.statuses[f"alice/calc@{sha}"]
    assert status["state"] == "success" and status["context"] == "vmagent/verification"
    assert "exit 0" in status["description"]


def test_the_token_is_in_no_url_no_git_config_and_no_result(gitea, tmp_path):
    project = tmp_path / "p"
    remote = gitea_remote(gitea, tmp_path)
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, "work")
    result = push_project(project, remote)
    assert result.pushed
    git_requests = [r for r in gitea.requests if ".git/" in r.path]
    assert any("git-receive-pack" in r.path for r in git_requests)
    for request in gitea.requests:  # every request, API and git, carried it as a header
        assert TOKEN not in request.path
        assert request.headers.get("Authorization") == f"token {TOKEN}"
    for path in (project / ".git").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in result.model_dump_json()


def test_a_second_session_starts_from_the_previous_content_and_history(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    first = tmp_path / "session1"
    prepare_project(first, remote)
    write(first, "a.txt", "one")
    commit_project(first, "first session")
    assert push_project(first, remote).pushed

    second = tmp_path / "session2"
    said = prepare_project(second, remote)
    assert said == "restored 1 commit from alice/calc"
    assert (second / "a.txt").read_text() == "one"
    write(second, "b.txt", "two")
    sha = commit_project(second, "second session")
    result = push_project(second, remote)
    assert result.pushed, result.error
    log = git_log(gitea.repo_path("alice", "calc"))
    assert [line.split(" ", 1)[1] for line in log] == ["second session", "first session"]
    assert log[0].startswith(sha)


def test_a_push_over_foreign_history_is_refused_with_a_sentence(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    first = tmp_path / "session1"
    prepare_project(first, remote)
    write(first, "a.txt", "one")
    commit_project(first, "first")
    push_project(first, remote)
    stray = tmp_path / "stray"  # never restored from the remote
    stray.mkdir()
    write(stray, "b.txt", "two")
    commit_project(stray, "stray")
    result = push_project(stray, remote)
    assert not result.pushed
    assert "holds commits this project folder lacks" in result.error
    assert TOKEN not in result.error
    assert len(git_log(gitea.repo_path("alice", "calc"))) == 1


def test_push_retries_gitea_server_errors(gitea, tmp_path):
    project = tmp_path / "p"
    remote = gitea_remote(gitea, tmp_path)
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    sha = commit_project(project, "work")
    gitea.fail_next(2)
    result = push_project(project, remote)
    assert result.pushed, result.error
    assert git_log(gitea.repo_path("alice", "calc"))[0].startswith(sha)


def test_a_forbidden_token_gives_the_scope_sentence_and_pushes_nothing(gitea, tmp_path):
    project = tmp_path / "p"
    remote = gitea_remote(gitea, tmp_path)
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, "work")
    gitea.forbid = True
    result = push_project(project, remote)
    assert not result.pushed and result.sha
    assert "write:repository" in result.error and TOKEN not in result.error
    assert not gitea.repo_path("alice", "calc").exists()


def test_git_refusing_the_token_fails_with_a_sentence_and_no_prompt(gitea, tmp_path):
    project = tmp_path / "p"
    remote = gitea_remote(gitea, tmp_path)
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, "work")
    gitea.reject_git = True
    result = push_project(project, remote)  # returns: no terminal prompt for a password
    assert not result.pushed
    assert result.error.startswith("The push to alice/calc failed")
    assert TOKEN not in result.error


def test_an_unreachable_gitea_at_open_still_gives_a_working_folder(tmp_path):
    remote = Remote(owner="alice", project="calc", gitea_url="http://127.0.0.1:9",
                    gitea_token=TOKEN, state_dir=tmp_path / "state", gitea_retries=1)
    project = tmp_path / "p"
    said = prepare_project(project, remote)
    assert said.startswith("new project") and "could not be read" in said
    assert TOKEN not in said
    write(project, "a.txt", "a")
    assert commit_project(project, "work")
    result = push_project(project, remote)
    assert not result.pushed and "could not" in result.error and TOKEN not in result.error


# --- push to the local default ------------------------------------------------------

def test_without_gitea_the_push_goes_to_a_local_bare_repository(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    sha = commit_project(project, "work")
    result = push_project(project, remote)
    bare = tmp_path / "state" / "git" / "alice" / "calc.git"
    assert result == PushResult(sha=sha, remote_display=str(bare), pushed=True)
    assert result.web_url is None
    assert git_log(bare) == [f"{sha} work"]


def test_the_local_default_restores_a_later_session(tmp_path):
    remote = local_remote(tmp_path)
    first = tmp_path / "s1"
    prepare_project(first, remote)
    write(first, "a.txt", "one")
    commit_project(first, "one")
    push_project(first, remote)
    write(first, "a.txt", "two")
    commit_project(first, "two")
    push_project(first, remote)

    second = tmp_path / "s2"
    assert prepare_project(second, remote) == "restored 2 commits from " + str(remote.local_path)
    assert (second / "a.txt").read_text() == "two"


def test_prepare_keeps_a_folder_that_is_already_a_repository(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, "work")
    assert "already a git repository with 1 commit" in prepare_project(project, remote)


def test_an_empty_owner_uses_a_local_owner_folder(tmp_path):
    remote = Remote(project="calc", state_dir=tmp_path / "state")
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, "work")
    assert push_project(project, remote).remote_display.endswith("git/local/calc.git")


def test_push_without_a_commit_says_so(tmp_path):
    project = tmp_path / "p"
    prepare_project(project, local_remote(tmp_path))
    result = push_project(project, local_remote(tmp_path))
    assert not result.pushed and "no commit" in result.error


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden", "x.git", ""])
def test_unsafe_project_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError):
        Remote(project=name, state_dir=tmp_path)


def test_a_gitea_url_with_credentials_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must not carry credentials"):
        Remote(project="calc", state_dir=tmp_path, gitea_url="http://u:p@gitea:3000")
