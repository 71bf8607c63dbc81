"""The Gitea stand-in (tests/support/gitea_server.py) against Gitea itself: every JSON answer it
gave in a session that touches each of its operations fits the shapes of Gitea's own API
spec (a vendored subset of Gitea 1.22's swagger, tests/support/gitea_spec), every body vmd sent
fits the operation's body schema, and the behaviours vmd depends on (case rules, default
branches, reserved names, scopes, redirects) answer as Gitea's source does."""

from __future__ import annotations

import json
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.gitea_server import start_gitea
from tests.support.gitea_spec import (error_problems, operation, request_problems, response_problems,
                                      shape_problems, spec)
from vmd.projects.gitea import GiteaClient, GiteaError
from vmd.projects.owners import OwnerPolicy
from vmd.projects.publish import commit_project, prepare_project, push_project
from vmd.projects.remote import Remote

TOKEN = "spec-check-token-9c1d"
SHA = "0123456789abcdef0123456789abcdef01234567"
# Answers a Gitea middleware gives before any operation runs: authentication (401), token
# scopes (403), rename redirects (307), and the stand-in's injected failures (500).
MIDDLEWARE = {401, 403, 307, 500}
# Statuses Gitea's code answers that its swagger leaves out: /orgs/{org}/repos shares the
# handler of /user/repos (routers/api/v1/repo/repo.go CreateUserRepo), 409 and 422 included.
UNDOCUMENTED = {("post", "/orgs/{org}/repos"): {409, 422}}


def api(gitea, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{gitea.url}/api/v1{path}", timeout=10,
                         headers={"Authorization": f"token {TOKEN}"}, **kwargs)


def exercise(gitea, tmp_path) -> None:
    """One session through every operation the stand-in serves, answers good and bad."""
    with GiteaClient(gitea.url, TOKEN, timeout=10, backoff=0.01) as client:
        client.current_user()
        assert client.get_org("vmagent-projects") is None
        client.create_org("vmagent-projects")
        client.get_org("vmagent-projects")
        client.ensure_repo("vmagent-projects", "p-calc", "d", kind="org")
        client.ensure_repo("", "mine", "d")
        client.ensure_repo("bob", "theirs", "d")
        client.create_user("zoe", "zoe@example.org", "a-password-long-enough")
        client.find_user_by_email("zoe@example.org")
        client.set_topics("alice", "mine", ["vmagent", "calc"])
        client.add_topic("alice", "mine", "person-x")
        client.set_commit_status("alice", "mine", SHA, "success", "ok", target_url="http://x/1")
        for bad in ("notes.wiki", "-", "a b"):
            with pytest.raises(GiteaError):
                client.ensure_repo("alice", bad)
        with pytest.raises(GiteaError):
            client.create_org("bob")
    remote = Remote(owner="alice", project="calc", gitea_url=gitea.url, gitea_token=TOKEN,
                    state_dir=tmp_path / "state", people=OwnerPolicy(mode="user"))
    prepare_project(tmp_path / "p", remote)
    (tmp_path / "p" / "a.txt").write_text("a")
    commit_project(tmp_path / "p", remote, "work")
    assert push_project(remote).pushed
    gitea.rename_repo("alice", "calc", "calculator")
    assert push_project(remote, branch="main").pushed  # follows the redirect, branch exists
    for method, path, kwargs in [
        ("GET", "/repos/alice/calculator/topics", {}),
        ("GET", f"/repos/alice/mine/statuses/{SHA}", {}),
        ("GET", "/repos/alice/calculator/commits?limit=5", {}),
        ("GET", "/repos/alice/mine/commits", {}),  # empty: 409
        ("GET", "/repos/alice/nothing", {}),
        ("GET", "/repos/alice/calculator/branches/none", {}),
        ("GET", "/users/zoe", {}),
        ("GET", "/users/nobody", {}),
        ("GET", "/orgs/nobody", {}),
        ("PUT", "/repos/alice/mine/topics", {"json": {"topics": ["Not Valid"]}}),
        ("PUT", "/repos/alice/mine/topics/bad%20topic", {}),
        ("POST", "/user/repos", {"json": {"name": "mine"}}),
        ("POST", "/admin/users", {"json": {"username": "api", "email": "api@example.org", "password": "x" * 10}}),
    ]:
        api(gitea, method, path, **kwargs)


def test_every_answer_of_the_stand_in_fits_gitea_s_spec(tmp_path):
    with start_gitea(tmp_path, TOKEN, users={"bob"}, admin=True) as gitea:
        exercise(gitea, tmp_path)
    problems, seen = [], set()
    for answer in gitea.responses:
        path = urlsplit(answer.path).path
        if not path.startswith("/api/v1/"):
            continue
        api_path = path[len("/api/v1"):]
        seen.add((answer.method, answer.status))
        if answer.status in MIDDLEWARE:
            if answer.body is not None:
                problems += error_problems(answer.body, f"{answer.method} {api_path} {answer.status}")
            continue
        found = operation(answer.method, api_path)
        if found and answer.status in UNDOCUMENTED.get((answer.method.lower(), found[0]), ()):
            problems += error_problems(answer.body, f"{answer.method} {api_path} {answer.status}")
            continue
        problems += response_problems(answer.method, api_path, answer.status, answer.body)
    assert problems == []
    assert {200, 201, 204, 404, 409, 422, 307} <= {status for _, status in seen}


def test_every_body_vmd_sends_fits_gitea_s_spec(tmp_path):
    with start_gitea(tmp_path, TOKEN, users={"bob"}, admin=True) as gitea:
        exercise(gitea, tmp_path)
    problems = []
    for request in gitea.requests:
        path = urlsplit(request.path).path
        if not path.startswith("/api/v1/") or request.method == "GET":
            continue
        body = json.loads(request.body) if request.body else None
        problems += request_problems(request.method, path[len("/api/v1"):], body)
    assert problems == []


def test_the_checker_catches_an_invented_field_a_wrong_type_and_an_unvendored_ref():
    user = {"$ref": "#/definitions/User"}
    assert shape_problems({"login": "a", "id": 1}, user) == []
    assert shape_problems({"login": "a", "html_url": "x"}, user) == [
        "$: property 'html_url' is not in the definition"]
    assert shape_problems({"id": "1"}, user) == ["$.id: expected an integer, got str"]
    assert shape_problems({"repo_transfer": {}}, {"$ref": "#/definitions/Repository"}) == [
        "$.repo_transfer: refers to #/definitions/RepoTransfer, which the vendored subset lacks"]
    status = {"$ref": "#/definitions/CommitStatus"}
    assert shape_problems({"state": "success"}, status) == [
        "$: property 'state' is not in the definition"]  # Gitea answers `status`


def test_the_vendored_subset_is_gitea_1_22s():
    info = spec()["info"]
    assert "Gitea 1.22" in info["x-vendored-from"]
    assert set(spec()["definitions"]) >= {"Repository", "User", "Organization", "CommitStatus",
                                          "TopicName", "Branch", "CreateRepoOption"}


# --- behaviours, as Gitea's source has them ------------------------------------------------------

@pytest.fixture
def gitea(tmp_path):
    with start_gitea(tmp_path, TOKEN, orgs={"Team"}) as server:
        yield server


@pytest.mark.parametrize("name, message", [
    ("-", "name is reserved [name: -]"), (".", "name is reserved [name: .]"),
    ("..", "name is reserved [name: ..]"), ("x.git", "name pattern is not allowed [pattern: *.git]"),
    ("Notes.Wiki", "name pattern is not allowed [pattern: *.wiki]"),
    ("f.rss", "name pattern is not allowed [pattern: *.rss]"),
    ("f.atom", "name pattern is not allowed [pattern: *.atom]"),
])
def test_reserved_repository_names_get_gitea_s_422(gitea, name, message):
    answer = api(gitea, "POST", "/user/repos", json={"name": name})
    assert answer.status_code == 422
    assert answer.json() == {"message": message, "url": f"{gitea.url}/api/swagger"}


def test_owner_and_repository_names_are_looked_up_without_case(gitea):
    gitea.create_repo("Team", "Tool")
    answer = api(gitea, "GET", "/repos/team/TOOL")
    assert answer.status_code == 200 and answer.json()["full_name"] == "Team/Tool"
    assert api(gitea, "POST", "/orgs/TEAM/repos", json={"name": "tool"}).status_code == 409
    assert api(gitea, "POST", "/orgs", json={"username": "team"}).json()["message"] == \
        "user already exists [name: team]"


def test_new_repositories_take_gitea_s_default_branch_and_are_private_when_asked(tmp_path):
    with start_gitea(tmp_path, TOKEN, default_branch="master") as gitea:
        made = api(gitea, "POST", "/user/repos", json={"name": "a", "private": True}).json()
        chosen = api(gitea, "POST", "/user/repos", json={"name": "b", "default_branch": "trunk"}).json()
    assert (made["default_branch"], made["private"]) == ("master", True)
    assert (chosen["default_branch"], chosen["private"]) == ("trunk", False)


def test_the_first_push_into_an_empty_repository_sets_its_default_branch(gitea, tmp_path):
    gitea.create_repo("alice", "calc")
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "-b", "trunk", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                    "-q", "--allow-empty", "-m", "one"], check=True)
    subprocess.run(["git", "-C", str(work), "-c", f"http.extraHeader=Authorization: token {TOKEN}",
                    "push", "-q", f"{gitea.url}/alice/calc.git", "trunk"], check=True)
    repo = api(gitea, "GET", "/repos/alice/calc").json()
    assert (repo["default_branch"], repo["empty"]) == ("trunk", False)


@pytest.mark.parametrize("scopes, method, path, required", [
    ({"read:user"}, "GET", "/repos/alice/calc", "read:repository"),
    ({"read:repository"}, "PUT", "/repos/alice/calc/topics/x", "write:repository"),
    ({"write:repository"}, "POST", "/user/repos", "write:user"),
    ({"write:repository", "write:user"}, "POST", "/orgs", "write:organization"),
    ({"write:repository"}, "GET", "/user", "read:user"),
])
def test_a_missing_scope_is_named_in_gitea_s_403(tmp_path, scopes, method, path, required):
    with start_gitea(tmp_path, TOKEN, scopes=scopes) as gitea:
        gitea.create_repo("alice", "calc")
        answer = api(gitea, method, path, json={"name": "x", "username": "x"} if method == "POST" else None)
    assert answer.status_code == 403
    assert f"required=[{required}]" in answer.json()["message"]


def test_git_needs_the_repository_scope_for_reading_and_writing(tmp_path):
    with start_gitea(tmp_path, TOKEN, scopes={"read:repository"}) as gitea:
        gitea.create_repo("alice", "calc")
        header = f"http.extraHeader=Authorization: token {TOKEN}"
        read = subprocess.run(["git", "-c", header, "ls-remote", f"{gitea.url}/alice/calc.git"],
                              capture_output=True, text=True)
        work = tmp_path / "work"
        subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
        subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t",
                        "commit", "-q", "--allow-empty", "-m", "one"], check=True)
        write = subprocess.run(["git", "-C", str(work), "-c", header, "push",
                                f"{gitea.url}/alice/calc.git", "main"], capture_output=True, text=True)
    assert read.returncode == 0
    assert write.returncode != 0 and "403" in write.stderr


def test_renamed_repositories_answer_307_on_the_api_and_on_git(gitea):
    gitea.create_repo("alice", "calc")
    gitea.rename_repo("alice", "calc", "calculator")
    answer = api(gitea, "GET", "/repos/alice/calc/topics", follow_redirects=False)
    assert answer.status_code == 307 and answer.headers["location"] == "/api/v1/repos/alice/calculator/topics"
    header = f"http.extraHeader=Authorization: token {TOKEN}"
    strict = subprocess.run(["git", "-c", header, "-c", "http.followRedirects=false", "ls-remote",
                             f"{gitea.url}/alice/calc.git"], capture_output=True, text=True)
    followed = subprocess.run(["git", "-c", header, "ls-remote", f"{gitea.url}/alice/calc.git"],
                              capture_output=True, text=True)
    assert strict.returncode != 0 and "307" in strict.stderr
    assert followed.returncode == 0 and "alice/calculator.git" in followed.stderr
