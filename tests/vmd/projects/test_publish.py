"""A session's project on the host: restored into a new folder at open, committed from the
folder's bytes into vmd's own repository, pushed from there to a real HTTP server speaking
Gitea (API + git smart HTTP through `git http-backend`, tests/support/gitea_server.py), or kept in
vmd's repository when there is no Gitea.

The second half plays the guest: it leaves traps in the project folder directly on the
host (no VM) and checks that nothing in them ran, that the honest files still arrive, and
that the token went nowhere but to the one push. History is always read with
`git --git-dir <repository>`; git runs inside a project folder only where a test plays
the guest using its own `.git`.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from tests.support.gitea_server import start_gitea, start_recorder

from vmd.config import VmdConfig
from vmd.projects.owners import person_slug, person_topic
from vmd.projects.publish import (Committed, PublishError, PushResult, changed_files, commit_project, prepare_project,
                                  push_project)
from vmd.projects.remote import Remote, remote_for
from vmd.projects.repository import Repository, repository_path
from vmd.projects.tree import XATTR_MODE, Limits, walk

TOKEN = "gitea-fake-token-5f1e2d9c-never-leak-me"
MIB = 1024 * 1024


@pytest.fixture
def gitea(tmp_path):
    with start_gitea(tmp_path, TOKEN) as server:
        yield server


def gitea_remote(gitea, tmp_path, **fields) -> Remote:
    fields.setdefault("owner", "alice")
    fields.setdefault("project", "calc")
    fields.setdefault("state_dir", tmp_path / "state")
    return Remote(description="Build a calculator", gitea_url=gitea.url, gitea_token=TOKEN,
                  gitea_backoff_s=0.01, **fields)


def local_remote(tmp_path, **fields) -> Remote:
    fields.setdefault("owner", "alice")
    return Remote(project="calc", state_dir=tmp_path / "state", **fields)


# --- reading repositories from outside --------------------------------------------------

def git(git_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True,
                          check=check)


def git_log(git_dir: Path, ref: str = "main") -> list[str]:
    return git(git_dir, "log", "--format=%H %s", ref).stdout.decode().splitlines()


def tree_of(git_dir: Path, ref: str = "main") -> dict[bytes, tuple[str, bytes]]:
    """path -> (mode, content) of every file and link in `ref`, names as raw bytes."""
    listing = git(git_dir, "ls-tree", "-r", "-z", ref).stdout
    result = {}
    for record in filter(None, listing.split(b"\0")):
        meta, path = record.split(b"\t", 1)
        mode, _, sha = meta.decode().split()
        result[path] = (mode, git(git_dir, "cat-file", "blob", sha).stdout)
    return result


def all_objects(git_dir: Path) -> list[str]:
    out = git(git_dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").stdout
    return out.decode().split()


def history_bytes(git_dir: Path) -> bytes:
    """Every object of the repository, reachable or not, uncompressed."""
    return git(git_dir, "cat-file", "--batch-all-objects", "--batch").stdout


def assert_token_nowhere(remote: Remote, gitea, *results) -> None:
    token = TOKEN.encode()
    repo = remote.repo_path
    for path in repo.rglob("*"):  # config, refs, logs; objects are checked uncompressed
        if path.is_file() and "objects" not in path.relative_to(repo).parts:
            assert token not in path.read_bytes(), path
    assert b"extraheader" not in (repo / "config").read_bytes().lower()
    assert token not in history_bytes(repo)
    for pushed in gitea.root.glob("*/*.git"):
        assert token not in history_bytes(pushed), pushed
    for result in results:
        assert TOKEN not in result.model_dump_json()
    for request in gitea.requests:  # every request, API and git, carried it as a header only
        assert TOKEN not in request.path
        assert request.headers.get("Authorization") == f"token {TOKEN}"


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def guest_git(folder: Path, *args: str, home: Path) -> subprocess.CompletedProcess:
    """git as the guest would run it in its own folder (its `.git`, its config, its hooks)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "guest", "GIT_AUTHOR_EMAIL": "g@guest",
           "GIT_COMMITTER_NAME": "guest", "GIT_COMMITTER_EMAIL": "g@guest"}
    home.mkdir(exist_ok=True)
    return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=folder, env=env,
                          capture_output=True, timeout=60)


def seed_repository(path: Path, files: dict[str, str], tmp_path: Path, message: str) -> str:
    """A bare repository at `path` whose `main` holds `files` (made with vmd's own commit)."""
    source = tmp_path / f"seed-{path.parent.name}-{path.stem}"
    for name, text in files.items():
        write(source, name, text)
    sha, _ = Repository(path).commit(walk(source), message)
    assert sha
    return sha


# --- commit -----------------------------------------------------------------------------

def test_commit_records_every_file_as_vmagent_in_vmds_repository(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "calc.py", "print(1+1)\n")
    write(project, "docs/README.md", "# calc\n")
    (project / "run.sh").write_text("#!/bin/sh\n")
    (project / "run.sh").chmod(0o755)
    committed = commit_project(project, remote, "Build a calculator")
    assert committed.new and committed.sha and len(committed.sha) == 40
    assert committed.left_out == []
    assert remote.repo_path == tmp_path / "state" / "repos" / "alice" / "calc.git"
    who = git(remote.repo_path, "show", "-s", "--format=%an <%ae>|%cn <%ce>|%s", committed.sha)
    assert who.stdout.decode().strip() == ("vmagent <vmagent@localhost>|vmagent <vmagent@localhost>|"
                                           "Build a calculator")
    assert tree_of(remote.repo_path) == {
        b"calc.py": ("100644", b"print(1+1)\n"),
        b"docs/README.md": ("100644", b"# calc\n"),
        b"run.sh": ("100755", b"#!/bin/sh\n"),
    }


def test_commit_when_nothing_changed_returns_the_same_sha_and_no_new_commit(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    first = commit_project(project, remote, "one")
    assert first.new
    assert commit_project(project, remote, "two") == Committed(sha=first.sha, new=False)
    assert commit_project(project, remote, "three") == Committed(sha=first.sha, new=False)
    assert git_log(remote.repo_path) == [f"{first.sha} one"]


def test_commit_of_an_empty_folder_makes_no_commit(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    assert commit_project(project, remote, "nothing") == Committed(sha=None, new=False)
    assert Repository(remote.repo_path).head() is None


def test_commit_of_a_folder_that_was_never_prepared_starts_the_history(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    project.mkdir()
    write(project, "a.txt", "a")
    committed = commit_project(project, remote, "first")
    assert committed.new and git_log(remote.repo_path) == [f"{committed.sha} first"]


def test_commit_of_a_missing_folder_is_refused_with_a_sentence(tmp_path):
    with pytest.raises(PublishError, match="is missing; nothing to commit"):
        commit_project(tmp_path / "gone", local_remote(tmp_path), "work")


def test_a_deleted_file_is_deleted_in_the_next_commit(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    write(project, "b.txt", "b")
    commit_project(project, remote, "two files")
    (project / "a.txt").unlink()
    committed = commit_project(project, remote, "one file")
    assert committed.new and set(tree_of(remote.repo_path)) == {b"b.txt"}
    assert len(git_log(remote.repo_path)) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another uid")
def test_commit_takes_files_as_qemu_leaves_them(tmp_path):
    # Mapped mode: owned by QEMU's user, 0600 on the host; the guest's mode is an xattr.
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "guest.txt", "written in the guest")
    write(project, "tool", "#!/bin/sh\n")
    os.setxattr(project / "tool", XATTR_MODE, struct.pack("<I", stat.S_IFREG | 0o755))
    for path in [project, *project.rglob("*")]:
        os.lchown(path, 4242, 4242)
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
    committed = commit_project(project, remote, "guest work")
    assert committed.new
    assert tree_of(remote.repo_path) == {b"guest.txt": ("100644", b"written in the guest"),
                                         b"tool": ("100755", b"#!/bin/sh\n")}


def test_changed_files_lists_what_changed_since_the_folder_was_prepared(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    write(project, "gone.txt", "x")
    commit_project(project, remote, "one")
    base = prepare_project(project, remote).base_commit
    write(project, "a.txt", "changed")
    write(project, "new.txt", "n")
    (project / "gone.txt").unlink()
    commit_project(project, remote, "two")
    assert sorted(changed_files(remote, base)) == ["A new.txt", "D gone.txt", "M a.txt"]
    assert sorted(changed_files(remote, None)) == ["A a.txt", "A new.txt"]


# --- open: restoring into a new folder ---------------------------------------------------

def test_prepare_of_a_new_project_gives_an_empty_folder_with_a_git_of_its_own(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepared = prepare_project(project, remote)
    assert prepared.text == f"new project: {remote.repo_path} has no history yet"
    assert prepared.base_commit is None and prepared.branch == "main"
    assert sorted(os.listdir(project)) == [".git"]
    assert not (project / ".git" / "hooks").exists()


def test_prepare_moves_an_old_folder_to_the_attic_and_checks_out_a_new_one(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "committed")
    sha = commit_project(project, remote, "work").sha
    write(project, "scratch.txt", "never committed")
    (project / ".git" / "config").write_text("[core]\n\tfsmonitor = touch /nowhere\n")
    prepared = prepare_project(project, remote)
    assert prepared.base_commit == sha
    assert "the previous folder was moved to" in prepared.text
    [kept] = (tmp_path / "state" / "attic" / "alice").iterdir()
    assert kept.name.startswith("calc-") and str(kept) in prepared.text
    assert (kept / "scratch.txt").read_text() == "never committed"  # nothing is deleted
    assert sorted(os.listdir(project)) == [".git", "a.txt"]
    assert (project / "a.txt").read_text() == "committed"
    assert b"fsmonitor" not in (project / ".git" / "config").read_bytes()  # a fresh .git
    assert b"[remote" not in (project / ".git" / "config").read_bytes()  # no host path to vmd's repo


def test_without_gitea_the_commit_lands_in_vmds_repository(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    sha = commit_project(project, remote, "work").sha
    result = push_project(remote)
    bare = repository_path(tmp_path / "state", "alice", "calc")
    assert result == PushResult(sha=sha, remote_display=str(bare), pushed=True)
    assert result.web_url is None
    assert git_log(bare) == [f"{sha} work"]


def test_without_gitea_a_later_session_restores_history_and_content(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "one")
    commit_project(project, remote, "one")
    write(project, "a.txt", "two")
    head = commit_project(project, remote, "two").sha
    push_project(remote)

    prepared = prepare_project(project, remote)
    assert prepared.text.startswith(f"restored 2 commits from {remote.repo_path}")
    assert prepared.base_commit == head
    assert (project / "a.txt").read_text() == "two"


def test_an_empty_owner_uses_the_local_owner_folder(tmp_path):
    remote = Remote(project="calc", state_dir=tmp_path / "state")
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, remote, "work")
    assert push_project(remote).remote_display == str(tmp_path / "state" / "repos" / "local" / "calc.git")


def test_push_without_a_commit_says_so(tmp_path):
    remote = local_remote(tmp_path)
    prepare_project(tmp_path / "p", remote)
    result = push_project(remote)
    assert not result.pushed and result.sha is None and "no commit" in result.error


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden", "x.git", "X.GIT", "", "-rf"])
def test_unsafe_project_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError):
        Remote(project=name, state_dir=tmp_path)


@pytest.mark.parametrize("owner", ["../bob", "a/b", ".."])
def test_unsafe_owner_names_are_refused(tmp_path, owner):
    with pytest.raises(ValueError):
        Remote(owner=owner, project="calc", state_dir=tmp_path)


def test_a_gitea_url_with_credentials_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must not carry credentials"):
        Remote(project="calc", state_dir=tmp_path, gitea_url="http://u:p@gitea:3000")


# --- push to Gitea ----------------------------------------------------------------------

def test_push_creates_the_repo_and_lands_the_commit_with_topics_and_status(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepared = prepare_project(project, remote)
    assert prepared.text == "new project: alice/calc has no history yet"
    write(project, "calc.py", "print(2)\n")
    sha = commit_project(project, remote, "Build a calculator").sha
    result = push_project(remote, branch=prepared.branch, status="success",
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


def test_the_token_is_in_no_url_no_repository_and_no_result(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepared = prepare_project(project, remote)
    write(project, "a.txt", "a")
    committed = commit_project(project, remote, "work")
    result = push_project(remote)
    assert result.pushed
    assert any("git-receive-pack" in r.path for r in gitea.requests)
    again = prepare_project(project, remote)  # a fetch from Gitea, and a checkout
    assert "restored 1 commit" in again.text
    assert_token_nowhere(remote, gitea, prepared, committed, result, again)
    for path in project.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_a_second_session_restores_the_history_and_content_from_gitea(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "one")
    commit_project(project, remote, "first session")
    assert push_project(remote).pushed

    # Another vmd (or this one after losing its state): only Gitea has the history.
    elsewhere = gitea_remote(gitea, tmp_path, state_dir=tmp_path / "state2")
    second = tmp_path / "p2"
    prepared = prepare_project(second, elsewhere)
    assert prepared.text == "restored 1 commit from alice/calc (main)"
    assert prepared.branch == "main"
    assert (second / "a.txt").read_text() == "one"
    write(second, "b.txt", "two")
    sha = commit_project(second, elsewhere, "second session").sha
    result = push_project(elsewhere, branch=prepared.branch)
    assert result.pushed, result.error
    log = git_log(gitea.repo_path("alice", "calc"))
    assert [line.split(" ", 1)[1] for line in log] == ["second session", "first session"]
    assert log[0].startswith(sha)


def test_a_push_over_foreign_history_is_refused_with_a_sentence(gitea, tmp_path):
    mine = gitea_remote(gitea, tmp_path)
    theirs = gitea_remote(gitea, tmp_path, state_dir=tmp_path / "other-vmd")
    prepare_project(tmp_path / "mine", mine)
    prepare_project(tmp_path / "theirs", theirs)  # both start from an empty Gitea
    write(tmp_path / "theirs", "b.txt", "theirs")
    commit_project(tmp_path / "theirs", theirs, "theirs")
    assert push_project(theirs).pushed
    write(tmp_path / "mine", "a.txt", "mine")
    commit_project(tmp_path / "mine", mine, "mine")
    result = push_project(mine)
    assert not result.pushed
    assert "holds commits this session did not start from" in result.error
    assert "Nothing was overwritten" in result.error
    assert TOKEN not in result.error
    assert [line.split(" ", 1)[1] for line in git_log(gitea.repo_path("alice", "calc"))] == ["theirs"]


def test_a_commit_whose_push_failed_is_pushed_by_the_next_session(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "one")
    commit_project(project, remote, "one")
    assert push_project(remote).pushed
    write(project, "a.txt", "two")
    commit_project(project, remote, "two")
    gitea.reject_git = True
    assert not push_project(remote).pushed
    gitea.reject_git = False

    prepared = prepare_project(project, remote)  # Gitea is behind vmd: vmd's branch stays
    assert (project / "a.txt").read_text() == "two"
    write(project, "a.txt", "three")
    commit_project(project, remote, "three")
    assert push_project(remote, branch=prepared.branch).pushed
    assert [line.split(" ", 1)[1] for line in git_log(gitea.repo_path("alice", "calc"))] == [
        "three", "two", "one"]


def test_when_both_moved_on_gitea_wins_and_vmds_commits_stay_under_a_ref(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    other = gitea_remote(gitea, tmp_path, state_dir=tmp_path / "other-vmd")
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "base")
    commit_project(project, remote, "base")
    assert push_project(remote).pushed
    prepare_project(tmp_path / "o", other)
    write(tmp_path / "o", "a.txt", "theirs")
    commit_project(tmp_path / "o", other, "theirs")
    assert push_project(other).pushed
    write(project, "a.txt", "mine")
    mine = commit_project(project, remote, "mine").sha
    gitea.reject_git = True
    push_project(remote)
    gitea.reject_git = False

    prepare_project(project, remote)
    assert (project / "a.txt").read_text() == "theirs"
    kept = git(remote.repo_path, "for-each-ref", "--format=%(objectname) %(refname)",
               "refs/vmd/").stdout.decode().split("\n")
    assert any(line.startswith(f"{mine} refs/vmd/diverged-") for line in kept)


def test_push_retries_gitea_server_errors(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    sha = commit_project(project, remote, "work").sha
    gitea.fail_next(2)
    result = push_project(remote)
    assert result.pushed, result.error
    assert git_log(gitea.repo_path("alice", "calc"))[0].startswith(sha)


def test_a_forbidden_token_gives_the_scope_sentence_and_pushes_nothing(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, remote, "work")
    gitea.forbid = True
    result = push_project(remote)
    assert not result.pushed and result.sha
    assert "write:repository" in result.error and TOKEN not in result.error
    assert not gitea.repo_path("alice", "calc").exists()


def test_git_refusing_the_token_fails_with_a_sentence_and_no_prompt(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a")
    commit_project(project, remote, "work")
    gitea.reject_git = True
    result = push_project(remote)  # returns: no terminal prompt for a password
    assert not result.pushed
    assert result.error.startswith("The push to alice/calc failed")
    assert "write:repository" in result.error and TOKEN not in result.error


def test_an_unreachable_gitea_at_open_still_gives_a_working_folder(tmp_path):
    remote = Remote(owner="alice", project="calc", gitea_url="http://127.0.0.1:9",
                    gitea_token=TOKEN, state_dir=tmp_path / "state", gitea_retries=1)
    project = tmp_path / "p"
    prepared = prepare_project(project, remote)
    assert "could not be read" in prepared.text and "vmd's own copy (0 commits)" in prepared.text
    assert TOKEN not in prepared.text
    assert prepared.base_commit is None
    write(project, "a.txt", "a")
    committed = commit_project(project, remote, "work")
    assert committed.new
    result = push_project(remote)
    assert not result.pushed and result.sha == committed.sha
    assert result.error.startswith("Nothing was pushed") and "could not" in result.error
    assert TOKEN not in result.error
    assert git_log(remote.repo_path) == [f"{committed.sha} work"]  # kept for the next try


# --- whose repository: the person, mapped to a Gitea owner that exists ----------------------

OPEN_WEBUI_USER = "3f2a9c1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"  # X-OpenWebUI-User-Id, as a job's owner


def configured_remote(gitea, tmp_path, owner: str, project: str = "calc", state: str = "state",
                      **settings) -> Remote:
    """The Remote vmd builds from its configuration (vmd.projects.remote.remote_for)."""
    config = VmdConfig(state_dir=tmp_path / state, gitea_url=gitea.url, gitea_token=TOKEN,
                       **settings)
    return remote_for(config, owner, project, "Build a calculator")


def heads(git_dir: Path) -> set[str]:
    out = git(git_dir, "for-each-ref", "--format=%(refname:strip=2)", "refs/heads").stdout
    return set(out.decode().split())


def test_an_open_webui_users_push_lands_in_the_service_org_private_on_the_default_branch(gitea, tmp_path):
    remote = configured_remote(gitea, tmp_path, OPEN_WEBUI_USER)
    slug = person_slug(OPEN_WEBUI_USER)
    name = f"{slug}-calc"
    project = tmp_path / "p"
    prepared = prepare_project(project, remote)
    assert prepared.text == f"new project: vmagent-projects/{name} has no history yet"
    write(project, "calc.py", "print(2)\n")
    sha = commit_project(project, remote, "Build a calculator").sha
    result = push_project(remote, branch=prepared.branch, status="success",
                          status_description="vmd ran `pytest -q`: exit 0")

    assert result.pushed and result.error is None and result.warnings == [], result
    assert result.branch == "main" and result.remote_display == f"{gitea.url}/vmagent-projects/{name}.git"
    assert result.web_url == f"{gitea.url}/vmagent-projects/{name}/commit/{sha}"
    org = gitea.account("vmagent-projects")
    assert org.kind == "org" and org.visibility == "private"  # vmd created it
    repo = gitea.repo("vmagent-projects", name)
    assert repo.private and repo.default_branch == "main"
    assert git_log(gitea.repo_path("vmagent-projects", name)) == [f"{sha} Build a calculator"]
    assert repo.topics == sorted(["vmagent", person_topic(OPEN_WEBUI_USER)])
    assert gitea.statuses[f"vmagent-projects/{name}@{sha}"][0]["state"] == "success"
    # Nothing was asked of an account named after the person.
    assert not any(OPEN_WEBUI_USER in r.path for r in gitea.requests)
    assert not any(r.path == "/api/v1/user/repos" for r in gitea.requests)
    # vmd's own repository stays keyed by the person and the project.
    assert remote.repo_path == tmp_path / "state" / "repos" / OPEN_WEBUI_USER / "calc.git"
    assert_token_nowhere(remote, gitea, prepared, result)

    # The next session of the same person and project, on another vmd, finds it there.
    again = configured_remote(gitea, tmp_path, OPEN_WEBUI_USER, state="state2")
    reopened = prepare_project(tmp_path / "p2", again)
    assert reopened.text == f"restored 1 commit from vmagent-projects/{name} (main)"
    assert (tmp_path / "p2" / "calc.py").read_text() == "print(2)\n"


def test_two_people_with_the_same_project_get_two_repositories(gitea, tmp_path):
    pushed = []
    for person in ("Alice", "alice"):  # two job owners; Gitea's names would ignore the case
        remote = configured_remote(gitea, tmp_path, person, state=f"state-{person}")
        prepare_project(tmp_path / person, remote)
        write(tmp_path / person, "who.txt", person)
        commit_project(tmp_path / person, remote, person)
        pushed.append(push_project(remote))
    assert all(p.pushed for p in pushed), pushed
    assert pushed[0].remote_display != pushed[1].remote_display
    assert len([r for r in gitea._repos.values() if r.owner.name == "vmagent-projects"]) == 2


def test_a_person_mapped_to_a_gitea_user_gets_the_project_under_that_user(tmp_path):
    with start_gitea(tmp_path, TOKEN, users={"jose"}, admin=True) as gitea:
        remote = configured_remote(gitea, tmp_path, OPEN_WEBUI_USER,
                                   gitea_users={OPEN_WEBUI_USER: "Jose"})
        prepare_project(tmp_path / "p", remote)
        write(tmp_path / "p", "a.txt", "a")
        commit_project(tmp_path / "p", remote, "work")
        result = push_project(remote)
        assert result.pushed, result.error
        assert result.remote_display == f"{gitea.url}/jose/calc.git"
        assert gitea.repo("jose", "calc").private
        assert ("POST", "/api/v1/admin/users/Jose/repos") in [(r.method, r.path) for r in gitea.requests]


def test_a_person_mapped_by_e_mail_is_looked_up_or_created_when_allowed(tmp_path):
    with start_gitea(tmp_path, TOKEN, users={"zoe"}, emails={"zoe": "zoe@example.org"},
                     admin=True) as gitea:
        found = configured_remote(gitea, tmp_path, "person-1", gitea_users={"person-1": "ZOE@example.org"})
        prepare_project(tmp_path / "p1", found)
        write(tmp_path / "p1", "a.txt", "a")
        commit_project(tmp_path / "p1", found, "work")
        assert push_project(found).remote_display == f"{gitea.url}/zoe/calc.git"

        unknown = configured_remote(gitea, tmp_path, "person-2", state="state2",
                                    gitea_users={"person-2": "jose.muller@example.org"})
        prepare_project(tmp_path / "p2", unknown)
        write(tmp_path / "p2", "a.txt", "a")
        commit_project(tmp_path / "p2", unknown, "work")
        refused = push_project(unknown)
        assert not refused.pushed
        assert "no user with the e-mail jose.muller@example.org" in refused.error
        assert "GITEA_CREATE_USERS" in refused.error

        allowed = configured_remote(gitea, tmp_path, "person-2", state="state2",
                                    gitea_users={"person-2": "jose.muller@example.org"},
                                    gitea_create_users=True)
        result = push_project(allowed)
        assert result.pushed, result.error
        assert result.remote_display == f"{gitea.url}/jose.muller/calc.git"
        assert gitea.account("jose.muller").email == "jose.muller@example.org"
        [created] = [r for r in gitea.requests if r.path == "/api/v1/admin/users"]
        sent = json.loads(created.body)
        assert sent["must_change_password"] is True and len(sent["password"]) >= 24
        assert sent["password"] not in result.model_dump_json()


def test_a_repository_on_master_is_restored_from_and_pushed_to_master(tmp_path):
    with start_gitea(tmp_path, TOKEN, default_branch="master") as gitea:
        gitea.create_repo("alice", "calc")
        bare = gitea.repo_path("alice", "calc")
        seed_repository(bare, {"a.txt": "from gitea\n"}, tmp_path, "on master")
        git(bare, "branch", "-m", "main", "master")
        git(bare, "symbolic-ref", "HEAD", "refs/heads/master")

        remote = gitea_remote(gitea, tmp_path)
        project = tmp_path / "p"
        prepared = prepare_project(project, remote)
        assert prepared.branch == "master"
        assert prepared.text == "restored 1 commit from alice/calc (master)"
        assert (project / "a.txt").read_text() == "from gitea\n"
        write(project, "b.txt", "by vmagent\n")
        sha = commit_project(project, remote, "second").sha
        result = push_project(remote, branch=prepared.branch)
        assert result.pushed and result.branch == "master", result.error
        assert heads(bare) == {"master"}  # no second, diverging branch
        assert git_log(bare, "master")[0] == f"{sha} second"

        # A session that could not read Gitea at open recorded vmd's fallback, main: the push
        # still goes to master, the branch Gitea has, not to a new main beside it.
        write(project, "c.txt", "third\n")
        third = commit_project(project, remote, "third").sha
        fallback = push_project(remote, branch="main")
        assert fallback.pushed and fallback.branch == "master", fallback.error
        assert heads(bare) == {"master"} and git_log(bare, "master")[0] == f"{third} third"


def test_an_empty_repository_on_master_is_pushed_to_master(tmp_path):
    with start_gitea(tmp_path, TOKEN, default_branch="master") as gitea:
        gitea.create_repo("alice", "calc")
        remote = gitea_remote(gitea, tmp_path)
        prepared = prepare_project(tmp_path / "p", remote)
        assert prepared.branch == "master" and "has no history yet" in prepared.text
        write(tmp_path / "p", "a.txt", "a")
        commit_project(tmp_path / "p", remote, "first")
        result = push_project(remote, branch="main")  # even with vmd's fallback recorded
        assert result.pushed and result.branch == "master", result.error
        assert heads(gitea.repo_path("alice", "calc")) == {"master"}
        assert gitea.repo("alice", "calc").default_branch == "master"


def test_a_new_repository_starts_on_the_branch_gitea_is_configured_for(tmp_path):
    # Gitea's [repository] DEFAULT_BRANCH is trunk: vmd does not impose main on a new repository.
    with start_gitea(tmp_path, TOKEN, default_branch="trunk") as gitea:
        remote = gitea_remote(gitea, tmp_path)
        prepared = prepare_project(tmp_path / "p", remote)
        write(tmp_path / "p", "a.txt", "a")
        sha = commit_project(tmp_path / "p", remote, "first").sha
        result = push_project(remote, branch=prepared.branch)
        assert result.pushed and result.branch == "trunk", result.error
        assert gitea.repo("alice", "calc").default_branch == "trunk"
        assert heads(gitea.repo_path("alice", "calc")) == {"trunk"}
        assert git_log(gitea.repo_path("alice", "calc"), "trunk")[0] == f"{sha} first"


def test_owner_and_name_case_differences_resolve_to_the_same_repository(tmp_path):
    with start_gitea(tmp_path, TOKEN, user="Alice", orgs={"VMAgent-Projects"}) as gitea:
        gitea.create_repo("Alice", "Calc")
        bare = gitea.repo_path("Alice", "Calc")
        seed_repository(bare, {"a.txt": "one\n"}, tmp_path, "one")

        remote = gitea_remote(gitea, tmp_path, owner="alice", project="calc")
        prepared = prepare_project(tmp_path / "p", remote)
        assert prepared.text == "restored 1 commit from Alice/Calc (main)"
        write(tmp_path / "p", "a.txt", "two\n")
        commit_project(tmp_path / "p", remote, "two")
        result = push_project(remote)
        assert result.pushed and result.remote_display == f"{gitea.url}/Alice/Calc.git", result.error
        assert [line.split(" ", 1)[1] for line in git_log(bare)] == ["two", "one"]

        org_remote = configured_remote(gitea, tmp_path, OPEN_WEBUI_USER, state="state2")
        prepare_project(tmp_path / "o", org_remote)
        write(tmp_path / "o", "a.txt", "a")
        commit_project(tmp_path / "o", org_remote, "work")
        pushed = push_project(org_remote)
        assert pushed.pushed and "/VMAgent-Projects/" in pushed.remote_display, pushed.error
    posts = [r.path for r in gitea.requests if r.method == "POST"]
    assert "/api/v1/user/repos" not in posts and "/api/v1/orgs" not in posts  # found, not made


def test_a_renamed_repository_is_followed_at_open_and_at_close(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    prepare_project(tmp_path / "p", remote)
    write(tmp_path / "p", "a.txt", "one")
    commit_project(tmp_path / "p", remote, "one")
    assert push_project(remote).pushed
    gitea.rename_repo("alice", "calc", "calculator")  # a person renamed it in Gitea
    since = len(gitea.requests)

    elsewhere = gitea_remote(gitea, tmp_path, state_dir=tmp_path / "state2")
    prepared = prepare_project(tmp_path / "p2", elsewhere)
    assert prepared.text == "restored 1 commit from alice/calculator (main)"
    write(tmp_path / "p2", "b.txt", "two")
    sha = commit_project(tmp_path / "p2", elsewhere, "two").sha
    result = push_project(elsewhere, branch=prepared.branch)
    assert result.pushed, result.error
    assert result.remote_display == f"{gitea.url}/alice/calculator.git"
    assert git_log(gitea.repo_path("alice", "calculator"))[0] == f"{sha} two"
    assert gitea.repo("alice", "calc") is None  # not created again under the old name
    assert gitea.statuses[f"alice/calculator@{sha}"]
    assert (307, "/api/v1/repos/alice/calc") in [(r.status, r.path) for r in gitea.responses]
    # git itself was only ever sent to the repository's current name.
    git_paths = [r.path for r in gitea.requests[since:] if not r.path.startswith("/api/")]
    assert git_paths and all(p.startswith("/alice/calculator.git/") for p in git_paths)
    assert_token_nowhere(elsewhere, gitea, prepared, result)


def test_a_renamed_organisation_is_followed(tmp_path):
    with start_gitea(tmp_path, TOKEN, orgs={"team"}) as gitea:
        remote = gitea_remote(gitea, tmp_path, owner="team")
        prepare_project(tmp_path / "p", remote)
        write(tmp_path / "p", "a.txt", "one")
        commit_project(tmp_path / "p", remote, "one")
        assert push_project(remote).pushed
        gitea.rename_account("team", "crew")
        write(tmp_path / "p", "a.txt", "two")
        commit_project(tmp_path / "p", remote, "two")
        result = push_project(remote)
        assert result.pushed and result.remote_display == f"{gitea.url}/crew/calc.git", result.error
        assert gitea.account("team") is None


def test_the_token_never_goes_to_an_api_redirect_on_another_host(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    with start_recorder(host="localhost") as (elsewhere, seen):
        gitea.api_elsewhere["alice/calc"] = elsewhere
        prepared = prepare_project(tmp_path / "p", remote)
        write(tmp_path / "p", "a.txt", "a")
        commit_project(tmp_path / "p", remote, "work")
        result = push_project(remote)
    assert seen == []  # not even a request without the token
    assert "could not be read" in prepared.text and "redirect" in prepared.text
    assert not result.pushed and result.error.startswith("Nothing was pushed")
    assert "GITEA_URL" in result.error and TOKEN not in result.error
    assert_token_nowhere(remote, gitea, prepared, result)


def test_the_token_never_goes_to_a_git_redirect_on_another_host(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    prepare_project(tmp_path / "p", remote)
    write(tmp_path / "p", "a.txt", "a")
    commit_project(tmp_path / "p", remote, "work")
    with start_recorder(host="localhost") as (elsewhere, seen):
        gitea.git_elsewhere["alice/calc"] = elsewhere
        result = push_project(remote)
    assert seen == []
    assert not result.pushed and "redirect" in result.error and "307" in result.error
    assert TOKEN not in result.error
    assert gitea.repo("alice", "calc") is not None and heads(gitea.repo_path("alice", "calc")) == set()


def test_a_project_name_gitea_reserves_fails_at_close_with_gitea_s_reason(gitea, tmp_path):
    # vmd refuses such names when the session opens (vmd.projects.owners.gitea_name_problem); should one
    # reach the close anyway, the sentence carries Gitea's reason and the work stays in vmd.
    remote = gitea_remote(gitea, tmp_path, project="notes.wiki")
    prepare_project(tmp_path / "p", remote)
    write(tmp_path / "p", "a.txt", "a")
    committed = commit_project(tmp_path / "p", remote, "work")
    result = push_project(remote)
    assert not result.pushed and "name pattern is not allowed [pattern: *.wiki]" in result.error
    assert git_log(remote.repo_path) == [f"{committed.sha} work"]


def test_a_token_without_the_organisation_scope_pushes_nothing_and_says_which(tmp_path):
    with start_gitea(tmp_path, TOKEN, scopes={"write:repository", "write:user"}) as gitea:
        remote = configured_remote(gitea, tmp_path, OPEN_WEBUI_USER)
        prepared = prepare_project(tmp_path / "p", remote)
        assert "could not be read" in prepared.text and "read:organization" in prepared.text
        write(tmp_path / "p", "a.txt", "a")
        commit_project(tmp_path / "p", remote, "work")
        result = push_project(remote)
    assert not result.pushed and "write:organization" in result.error and TOKEN not in result.error


# --- the guest's traps, laid on the host ----------------------------------------------------

@pytest.fixture
def markers(tmp_path) -> Path:
    """Where a trap that ran would leave its mark."""
    folder = tmp_path / "markers"
    folder.mkdir()
    return folder


def trap(markers: Path, name: str) -> str:
    return f"touch {markers / name}"


def close_session(project: Path, remote: Remote, limits: Limits | None = None):
    """What vmd does at close and at the next open: commit, list, push, restore."""
    committed = commit_project(project, remote, "guest work", limits)
    changed_files(remote, None)
    pushed = push_project(remote)
    reopened = prepare_project(project, remote)
    return committed, pushed, reopened


def test_a_nested_repository_with_a_clean_filter_runs_nothing(gitea, tmp_path, markers):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "app.py", "import vendor\n")
    write(project, "vendor/lib.py", "VALUE = 1\n")
    write(project, "vendor/.gitattributes", "* filter=x\n")
    assert guest_git(project / "vendor", "init", "-q", home=tmp_path / "guest-home").returncode == 0
    with open(project / "vendor" / ".git" / "config", "a") as config:
        config.write(f'[filter "x"]\n\tclean = "{trap(markers, "clean")}; cat"\n'
                     f'\tsmudge = "{trap(markers, "smudge")}; cat"\n\trequired = true\n')
    write(project, ".gitattributes", "*.py filter=x\n")  # the same filter asked for at the top
    with open(project / ".git" / "config", "a") as config:
        config.write(f'[filter "x"]\n\tclean = "{trap(markers, "top-clean")}; cat"\n'
                     f'\tsmudge = "{trap(markers, "top-smudge")}; cat"\n')

    committed, pushed, reopened = close_session(project, remote)
    assert list(markers.iterdir()) == []
    assert committed.new and pushed.pushed, pushed.error
    assert any(note.startswith("vendor/.git:") for note in committed.left_out)
    files = tree_of(gitea.repo_path("alice", "calc"))
    assert files == {b".gitattributes": ("100644", b"*.py filter=x\n"),
                     b"app.py": ("100644", b"import vendor\n"),
                     b"vendor/.gitattributes": ("100644", b"* filter=x\n"),
                     b"vendor/lib.py": ("100644", b"VALUE = 1\n")}
    assert (project / "vendor" / "lib.py").read_text() == "VALUE = 1\n"  # restored unfiltered
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)

    # The trap was armed: the guest's own git in the old folder does run it.
    [old] = (tmp_path / "state" / "attic" / "alice").iterdir()
    guest_git(old / "vendor", "add", "lib.py", home=tmp_path / "guest-home")
    assert (markers / "clean").exists()


def test_the_guests_hooks_fsmonitor_and_hooks_path_run_nothing(gitea, tmp_path, markers):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "honest\n")
    hooks = project / ".git" / "hooks"
    elsewhere = tmp_path / "guest-hooks"
    for folder in (hooks, elsewhere):
        folder.mkdir(exist_ok=True)
        for name in ("pre-commit", "post-commit", "reference-transaction", "pre-push",
                     "post-checkout", "pre-auto-gc", "fsmonitor-watchman"):
            (folder / name).write_text(f"#!/bin/sh\n{trap(markers, f'{folder.name}-{name}')}\n")
            (folder / name).chmod(0o755)
    fsmonitor = tmp_path / "fsmonitor.sh"
    fsmonitor.write_text(f"#!/bin/sh\n{trap(markers, 'fsmonitor')}\n")
    fsmonitor.chmod(0o755)
    with open(project / ".git" / "config", "a") as config:
        config.write(f"[core]\n\tfsmonitor = {fsmonitor}\n\thooksPath = {elsewhere}\n"
                     f'\tpager = "{trap(markers, "pager")}"\n\tworktree = {tmp_path}\n'
                     f"[commit]\n\tgpgSign = true\n"
                     f'[gpg]\n\tprogram = "{trap(markers, "gpg")}"\n'
                     f'[diff]\n\texternal = "{trap(markers, "diff")}"\n'
                     f"[include]\n\tpath = {tmp_path / 'included'}\n")
    (tmp_path / "included").write_text(f'[core]\n\tsshCommand = "{trap(markers, "ssh")}"\n')

    committed, pushed, reopened = close_session(project, remote)
    assert list(markers.iterdir()) == []
    assert committed.new and pushed.pushed, pushed.error
    assert tree_of(gitea.repo_path("alice", "calc")) == {b"a.txt": ("100644", b"honest\n")}
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)

    [old] = (tmp_path / "state" / "attic" / "alice").iterdir()
    guest_git(old, "commit", "-q", "--allow-empty", "--no-gpg-sign", "-m", "x",
              home=tmp_path / "guest-home")
    assert (markers / "guest-hooks-pre-commit").exists()  # the trap was armed


def test_a_remote_renamed_to_the_push_url_does_not_redirect_the_push(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    gitea.create_repo("bob", "secret")
    seed_repository(gitea.repo_path("bob", "secret"), {"plan.txt": "bob's plan\n"}, tmp_path,
                    "bob's work")
    bob_refs = git(gitea.repo_path("bob", "secret"), "for-each-ref").stdout
    bob_objects = set(all_objects(gitea.repo_path("bob", "secret")))
    push_url = f"{gitea.url}/alice/calc.git"
    bob_url = f"{gitea.url}/bob/secret.git"
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "alice's work\n")
    with open(project / ".git" / "config", "a") as config:
        config.write(f'[remote "{push_url}"]\n\turl = {bob_url}\n\tpushurl = {bob_url}\n'
                     f"\tpush = +refs/heads/*:refs/heads/stolen\n"
                     f'[url "{bob_url}"]\n\tinsteadOf = {push_url}\n\tpushInsteadOf = {push_url}\n'
                     f'[url "{bob_url[:-len("secret.git")]}"]\n\tinsteadOf = {gitea.url}/alice/\n')

    committed, pushed, reopened = close_session(project, remote)
    assert pushed.pushed and pushed.remote_display == push_url
    assert git_log(gitea.repo_path("alice", "calc")) == [f"{committed.sha} guest work"]
    assert tree_of(gitea.repo_path("alice", "calc")) == {b"a.txt": ("100644", b"alice's work\n")}
    assert git(gitea.repo_path("bob", "secret"), "for-each-ref").stdout == bob_refs
    assert set(all_objects(gitea.repo_path("bob", "secret"))) == bob_objects
    assert not any("/bob/" in request.path for request in gitea.requests)
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


def test_git_files_and_alternates_pointing_at_another_repository_take_nothing_from_it(gitea, tmp_path):
    state = tmp_path / "state"
    bob = repository_path(state, "bob", "secret")
    seed_repository(bob, {"plan.txt": "bob's secret plan\n", "keys/id": "bob's key\n"}, tmp_path,
                    "bob's secret")
    bob_objects = all_objects(bob)
    bob_refs = git(bob, "for-each-ref").stdout
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "alice\n")
    write(project, "sub/b.txt", "alice too\n")
    (project / "sub" / ".git").write_text(f"gitdir: {bob}\n")
    (project / "linked").mkdir()
    (project / "linked" / ".git").symlink_to(bob)
    write(project, "linked/c.txt", "and here\n")
    info = project / ".git" / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text(f"{bob / 'objects'}\n")
    (project / ".git" / "commondir").write_text(f"{bob}\n")

    committed, pushed, reopened = close_session(project, remote)
    assert committed.new and pushed.pushed, pushed.error
    assert {note.split(":")[0] for note in committed.left_out} == {"sub/.git", "linked/.git"}
    for repository in (remote.repo_path, gitea.repo_path("alice", "calc")):
        assert tree_of(repository) == {b"a.txt": ("100644", b"alice\n"),
                                       b"linked/c.txt": ("100644", b"and here\n"),
                                       b"sub/b.txt": ("100644", b"alice too\n")}
        assert not (repository / "objects" / "info" / "alternates").exists()
        for sha in bob_objects:
            assert git(repository, "cat-file", "-e", sha, check=False).returncode != 0, sha
    assert git(bob, "for-each-ref").stdout == bob_refs
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


def test_a_stale_lock_and_commitless_nested_repositories_do_not_stop_the_commit(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a\n")
    (project / ".git" / "index.lock").write_text("")
    (project / ".git" / "HEAD.lock").write_text("")
    write(project, "lib/x.py", "x = 1\n")
    (project / "lib" / ".git").write_text("gitdir: /nonexistent/modules/lib\n")
    write(project, "tool/y.py", "y = 2\n")
    assert guest_git(project / "tool", "init", "-q", home=tmp_path / "guest-home").returncode == 0
    write(project, "garbage/z.txt", "z\n")
    (project / "garbage" / ".git").mkdir()
    (project / "garbage" / ".git" / "HEAD").write_bytes(b"\xff\xfenot a ref")

    committed, pushed, reopened = close_session(project, remote)
    assert committed.new and pushed.pushed, pushed.error
    assert set(tree_of(gitea.repo_path("alice", "calc"))) == {
        b"a.txt", b"garbage/z.txt", b"lib/x.py", b"tool/y.py"}
    assert (project / "tool" / "y.py").read_text() == "y = 2\n"
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


def test_a_huge_sparse_file_is_left_out_with_a_note(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a\n")
    (project / "big.bin").touch()
    os.truncate(project / "big.bin", 200 * MIB)  # sparse: no real bytes written

    committed, pushed, reopened = close_session(project, remote, Limits(max_file_bytes=100 * MIB))
    assert committed.new and pushed.pushed, pushed.error
    [note] = committed.left_out
    assert note.startswith("big.bin: 200.0 MiB is over the 100.0 MiB limit")
    assert set(tree_of(gitea.repo_path("alice", "calc"))) == {b"a.txt"}
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


@pytest.mark.timeout(60)
def test_a_fifo_and_a_socket_are_left_out_without_a_hang(gitea, tmp_path, monkeypatch):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a\n")
    os.mkfifo(project / "pipe")  # nobody writes it: opening it to read would block
    monkeypatch.chdir(project)  # a socket's path must be short
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("sock")
    listener.listen()
    try:
        committed, pushed, reopened = close_session(project, remote)
    finally:
        listener.close()
    assert committed.new and pushed.pushed, pushed.error
    assert sorted(committed.left_out) == [
        "pipe: a named pipe (FIFO), which git cannot hold; left out.",
        "sock: a socket, which git cannot hold; left out."]
    assert set(tree_of(gitea.repo_path("alice", "calc"))) == {b"a.txt"}
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


def test_links_out_of_the_folder_are_stored_as_links_and_never_followed(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a\n")
    (project / "passwd").symlink_to("/etc/passwd")
    (project / "up").symlink_to("../../outside")
    (project / "etc").symlink_to("/etc")
    (project / "mapped").write_bytes(b"/etc/shadow")  # a guest link as 9p stores it
    os.setxattr(project / "mapped", XATTR_MODE, struct.pack("<I", stat.S_IFLNK | 0o777))

    committed, pushed, reopened = close_session(project, remote)
    assert committed.new and pushed.pushed, pushed.error
    assert tree_of(gitea.repo_path("alice", "calc")) == {
        b"a.txt": ("100644", b"a\n"),
        b"etc": ("120000", b"/etc"),
        b"mapped": ("120000", b"/etc/shadow"),
        b"passwd": ("120000", b"/etc/passwd"),
        b"up": ("120000", b"../../outside"),
    }
    passwd = Path("/etc/passwd").read_bytes()
    assert passwd not in history_bytes(remote.repo_path)
    # Restored as the guest's links: regular host files holding the target, never real links.
    for name, target in (("passwd", b"/etc/passwd"), ("etc", b"/etc"), ("up", b"../../outside")):
        assert not (project / name).is_symlink()
        assert (project / name).read_bytes() == target
        mode = struct.unpack("<I", os.getxattr(project / name, XATTR_MODE))[0]
        assert stat.S_ISLNK(mode)
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


ODD_NAMES = [b"new\nline.txt", b'quo"te.txt', b"back\\slash.txt", b"-rf", b"--help",
             b"caf\xe9-latin1.txt", b"\xff\xfe.bin", b"with space.txt", b" leading",
             b"tab\there", b"\"quoted\"", b"sub dir/inner \\ name"]
# Names git itself refuses (core.protectNTFS is on by default): in a commit, each would make
# the next checkout fail and the next session start from an empty folder.
GIT_LIKE = [b".GIT", b".git.", b".Git ", b"git~1", b"GIT~1", b".git\\config", b".git:x",
            b".git. :stream", b"sub dir/.GIT", b"sub dir/.git. .", b"sub dir/git~1\\hooks"]


def test_odd_names_are_committed_and_git_like_ones_left_out(gitea, tmp_path):
    remote = gitea_remote(gitea, tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    root = os.fsencode(project)
    os.mkdir(root + b"/sub dir")
    for name in ODD_NAMES + GIT_LIKE:
        with open(root + b"/" + name, "wb") as f:
            f.write(b"content of " + name)

    committed, pushed, reopened = close_session(project, remote)
    assert committed.new and pushed.pushed, pushed.error
    assert tree_of(gitea.repo_path("alice", "calc")) == {
        name: ("100644", b"content of " + name) for name in ODD_NAMES}
    assert len([n for n in committed.left_out if n.startswith("sub dir/")]) == 3
    assert "could not be checked out" not in reopened.text
    restored = os.fsencode(project)
    for name in ODD_NAMES:
        with open(restored + b"/" + name, "rb") as f:
            assert f.read() == b"content of " + name
    assert_token_nowhere(remote, gitea, committed, pushed, reopened)


def test_a_link_named_gitmodules_does_not_break_the_next_restore(tmp_path):
    remote = local_remote(tmp_path)
    project = tmp_path / "p"
    prepare_project(project, remote)
    write(project, "a.txt", "a\n")
    (project / ".gitmodules").symlink_to("a.txt")
    commit_project(project, remote, "work")
    reopened = prepare_project(project, remote)
    assert "could not be checked out" not in reopened.text
    assert (project / "a.txt").read_text() == "a\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a folder's group needs root")
def test_the_repos_group_may_read_the_history_and_nobody_else(tmp_path):
    # The compose setup's job service runs as uid/gid 1001 and reads history for /ask:
    # VMD_REPOS_GROUP gives its group read access to repos/<owner>/, and no other user.
    import pwd
    import subprocess as sp

    from vmd.config import VmdConfig
    from vmd.projects.remote import remote_for

    from tests.conftest import make_traversable

    nobody = pwd.getpwnam("nobody")
    config = VmdConfig.load(env={}, state_dir=tmp_path / "state", repos_group=str(nobody.pw_gid))
    make_traversable(tmp_path)  # pytest's own folders are 0700: the other user must pass them
    (tmp_path / "state").mkdir(mode=0o755)
    remote = remote_for(config, "alice", "calc")
    write(tmp_path / "p", "a.txt", "history\n")
    sha = commit_project(tmp_path / "p", remote, "first").sha
    owner_dir = remote.repo_path.parent
    assert os.stat(owner_dir).st_gid == nobody.pw_gid and (os.stat(owner_dir).st_mode & 0o777) == 0o750
    (tmp_path / "state" / "repos").chmod(0o755)

    def log_as(uid: int, gid: int) -> sp.CompletedProcess:
        return sp.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "git",
                       "-c", "safe.directory=*", "--git-dir", str(remote.repo_path), "log", "--format=%H"],
                      capture_output=True, text=True, env={"PATH": os.environ["PATH"], "HOME": "/"})

    assert log_as(65000, nobody.pw_gid).stdout.strip() == sha  # the readers' group reads it
    assert log_as(65000, 65000).returncode != 0  # another user does not
    # Without the setting the folder is vmd's alone again, also for a repository made before.
    commit_project(tmp_path / "p", remote_for(VmdConfig.load(env={}, state_dir=tmp_path / "state"), "alice",
                                              "calc"), "second", allow_empty=True)
    assert (os.stat(owner_dir).st_mode & 0o777) == 0o700
