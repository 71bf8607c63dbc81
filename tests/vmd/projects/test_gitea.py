"""GiteaClient against a real HTTP server speaking Gitea's /api/v1 (tests/support/gitea_server.py)."""

from __future__ import annotations

import socket

import pytest

from tests.support.gitea_server import start_gitea, start_recorder
from vmd.projects.gitea import GiteaAuthError, GiteaClient, GiteaError, GiteaUnavailable

TOKEN = "tok-4f9a1c-test"
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def gitea(tmp_path):
    with start_gitea(tmp_path, TOKEN, orgs={"team"}, users={"bob"}) as server:
        yield server


def client_for(gitea, **kwargs) -> GiteaClient:
    kwargs.setdefault("backoff", 0.01)
    return GiteaClient(gitea.url, kwargs.pop("token", TOKEN), timeout=5, **kwargs)


def test_a_missing_repository_is_created_with_its_description(gitea):
    with client_for(gitea) as client:
        info = client.ensure_repo("alice", "calc", "A calculator, built by vmagent")
    assert info.full_name == "alice/calc"
    assert info.clone_url == f"{gitea.url}/alice/calc.git"
    assert info.html_url == f"{gitea.url}/alice/calc"
    assert info.empty and info.default_branch == "main" and info.private
    assert gitea.repo_path("alice", "calc").is_dir()
    assert gitea.descriptions["alice/calc"] == "A calculator, built by vmagent"
    assert [(r.method, r.path) for r in gitea.requests] == [
        ("GET", "/api/v1/repos/alice/calc"), ("GET", "/api/v1/user"),
        ("POST", "/api/v1/user/repos")]
    assert all(r.headers["Authorization"] == f"token {TOKEN}" for r in gitea.requests)


def test_an_existing_repository_is_returned_without_creating(gitea):
    gitea.create_repo("alice", "calc", "old")
    with client_for(gitea) as client:
        info = client.ensure_repo("alice", "calc", "new")
    assert info.full_name == "alice/calc"
    assert gitea.descriptions["alice/calc"] == "old"
    assert not any(r.method == "POST" for r in gitea.requests)


def test_an_empty_owner_means_the_tokens_user(gitea):
    with client_for(gitea) as client:
        assert client.ensure_repo("", "calc").full_name == "alice/calc"


def test_a_409_on_create_means_it_exists_and_is_fetched(gitea, monkeypatch):
    with client_for(gitea) as client:
        real_get = client.get_repo
        calls = []

        def racing_get(owner, name):
            # The first look finds nothing; another session creates it meanwhile.
            calls.append(name)
            if len(calls) == 1:
                gitea.create_repo(owner, name, "made by the other session")
                return None
            return real_get(owner, name)

        monkeypatch.setattr(client, "get_repo", racing_get)
        info = client.ensure_repo("alice", "calc", "mine")
    assert info.full_name == "alice/calc"
    posts = [r for r in gitea.requests if r.method == "POST"]
    assert len(posts) == 1 and posts[0].path == "/api/v1/user/repos"
    assert gitea.descriptions["alice/calc"] == "made by the other session"


def test_an_organisation_repository_is_created_under_the_org(gitea):
    with client_for(gitea) as client:
        assert client.ensure_repo("team", "tool", "d").full_name == "team/tool"
    assert ("POST", "/api/v1/orgs/team/repos") in [(r.method, r.path) for r in gitea.requests]


def test_another_users_repository_needs_the_admin_route(tmp_path):
    with start_gitea(tmp_path, TOKEN, users={"bob"}, admin=True) as gitea:
        with client_for(gitea) as client:
            assert client.ensure_repo("bob", "tool", "d").full_name == "bob/tool"
        paths = [(r.method, r.path) for r in gitea.requests]
    assert ("POST", "/api/v1/orgs/bob/repos") in paths
    assert ("POST", "/api/v1/admin/users/bob/repos") in paths


def test_another_users_repository_without_admin_says_what_scope_is_missing(gitea):
    with client_for(gitea) as client, pytest.raises(GiteaAuthError) as caught:
        client.ensure_repo("bob", "tool", "d")
    assert "admin" in str(caught.value)


def test_an_unknown_owner_is_a_clear_error(tmp_path):
    with start_gitea(tmp_path, TOKEN, admin=True) as gitea, client_for(gitea) as client:
        with pytest.raises(GiteaError, match="no user or organisation named 'nobody'"):
            client.ensure_repo("nobody", "tool")


def test_topics_and_commit_status_are_set(gitea):
    gitea.create_repo("alice", "calc")
    with client_for(gitea) as client:
        client.set_topics("alice", "calc", ["vmagent"])
        client.set_commit_status("alice", "calc", SHA, "success", "pytest -q exited 0",
                                 target_url="http://preview.example/job/1")
    assert gitea.topics["alice/calc"] == ["vmagent"]
    [status] = gitea.statuses[f"alice/calc@{SHA}"]
    assert status == {"id": 1, "state": "success", "context": "vmagent/verification",
                      "description": "pytest -q exited 0",
                      "target_url": "http://preview.example/job/1"}
    answered = [r.body for r in gitea.responses if r.path.endswith(f"/statuses/{SHA}")]
    assert answered[0]["status"] == "success" and "state" not in answered[0]  # Gitea's shape


def test_adding_a_topic_keeps_those_a_person_gave(gitea):
    gitea.create_repo("alice", "calc").topics = ["homework"]
    with client_for(gitea) as client:
        client.add_topic("alice", "calc", "vmagent")
        client.add_topic("alice", "calc", "vmagent")
    assert gitea.topics["alice/calc"] == ["homework", "vmagent"]


def test_a_long_status_description_is_cut_to_what_gitea_stores(gitea):
    gitea.create_repo("alice", "calc")
    with client_for(gitea) as client:
        client.set_commit_status("alice", "calc", SHA, "failure", "x" * 1000)
    assert len(gitea.statuses[f"alice/calc@{SHA}"][0]["description"]) == 255


def test_server_errors_are_retried_until_success(gitea):
    gitea.create_repo("alice", "calc")
    gitea.fail_next(2)
    with client_for(gitea, retries=4) as client:
        client.set_topics("alice", "calc", ["vmagent"])
    assert gitea.topics["alice/calc"] == ["vmagent"]
    assert [r.path for r in gitea.requests] == ["/api/v1/repos/alice/calc/topics"] * 3


def test_persistent_server_errors_end_in_gitea_unavailable(gitea):
    gitea.create_repo("alice", "calc")
    gitea.fail_next(10)
    with client_for(gitea, retries=3) as client, pytest.raises(GiteaUnavailable) as caught:
        client.set_topics("alice", "calc", ["vmagent"])
    assert len(gitea.requests) == 3
    assert "after 3 tries" in str(caught.value) and "HTTP 500" in str(caught.value)


def test_an_unreachable_gitea_ends_in_gitea_unavailable_after_retries():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = GiteaClient(f"http://127.0.0.1:{port}", TOKEN, timeout=2, retries=2, backoff=0.01)
    with client, pytest.raises(GiteaUnavailable, match="could not read the token's user after 2 tries"):
        client.current_user()


def test_a_403_says_which_scopes_the_token_needs(gitea):
    gitea.forbid = True
    with client_for(gitea) as client, pytest.raises(GiteaAuthError) as caught:
        client.ensure_repo("alice", "calc")
    message = str(caught.value)
    assert "write:repository" in message and "write:user" in message
    assert "Settings" in message and TOKEN not in message
    assert len(gitea.requests) == 1  # not retried


def test_a_wrong_token_gives_a_401_sentence_without_the_token(gitea):
    with client_for(gitea, token="wrong-token-xyz") as client, \
            pytest.raises(GiteaAuthError) as caught:
        client.current_user()
    assert "refused the token (401)" in str(caught.value)
    assert "wrong-token-xyz" not in str(caught.value)


# --- owners Gitea compares without case, and names it refuses ---------------------------

def test_the_token_users_own_name_in_another_case_creates_under_the_user(tmp_path):
    with start_gitea(tmp_path, TOKEN, user="Alice") as gitea, client_for(gitea) as client:
        info = client.ensure_repo("alice", "calc")
        again = client.ensure_repo("ALICE", "CALC")
    assert info.full_name == again.full_name == "Alice/calc"
    posts = [r.path for r in gitea.requests if r.method == "POST"]
    assert posts == ["/api/v1/user/repos"]  # not /orgs/alice/repos, not the admin route


def test_a_repository_is_found_whatever_the_case_of_its_names(gitea):
    gitea.create_repo("team", "Tool")
    with client_for(gitea) as client:
        assert client.get_repo("TEAM", "tool").full_name == "team/Tool"
        assert client.get_org("Team") == "team"


@pytest.mark.parametrize("name, message", [
    ("notes.wiki", "name pattern is not allowed [pattern: *.wiki]"),
    ("feed.RSS", "name pattern is not allowed [pattern: *.rss]"),
    ("-", "name is reserved [name: -]"),
])
def test_a_name_gitea_reserves_is_refused_with_its_reason(gitea, name, message):
    with client_for(gitea) as client, pytest.raises(GiteaError) as caught:
        client.ensure_repo("alice", name)
    assert "422" in str(caught.value) and message in str(caught.value)
    assert not gitea.repo_path("alice", name).exists()


# --- organisations and users -------------------------------------------------------------

def test_a_missing_organisation_is_created_private(gitea):
    with client_for(gitea) as client:
        assert client.get_org("vmagent-projects") is None
        assert client.create_org("vmagent-projects") == "vmagent-projects"
        info = client.ensure_repo("vmagent-projects", "p-calc", kind="org")
    assert gitea.account("vmagent-projects").visibility == "private"
    assert info.full_name == "vmagent-projects/p-calc" and info.private


def test_an_organisation_named_like_a_user_is_refused_with_a_sentence(gitea):
    with client_for(gitea) as client, pytest.raises(GiteaError) as caught:
        client.create_org("bob")
    assert "user already exists" in str(caught.value) and "GITEA_ORG" in str(caught.value)


def test_a_user_is_found_by_e_mail_only_where_gitea_shows_it(tmp_path):
    emails = {"zoe": "Zoe@Example.org"}
    with start_gitea(tmp_path / "admin", TOKEN, users={"zoe"}, emails=emails, admin=True) as gitea:
        with client_for(gitea) as client:
            assert client.find_user_by_email("zoe@example.org") == "zoe"
    with start_gitea(tmp_path / "plain", TOKEN, users={"zoe"}, emails=emails) as gitea:
        with client_for(gitea) as client:
            assert client.find_user_by_email("zoe@example.org") is None


def test_creating_a_user_needs_a_site_admin_and_a_free_name(tmp_path):
    with start_gitea(tmp_path / "admin", TOKEN, users={"jose"}, admin=True) as gitea:
        with client_for(gitea) as client:
            assert client.create_user("jose", "jm@example.org", "pw-long-enough") is None
            assert client.create_user("jose-m", "jm@example.org", "pw-long-enough") == "jose-m"
            with pytest.raises(GiteaError, match="e-mail already in use"):
                client.create_user("jm", "jm@example.org", "pw-long-enough")
    with start_gitea(tmp_path / "plain", TOKEN) as gitea, client_for(gitea) as client:
        with pytest.raises(GiteaAuthError, match="site admin"):
            client.create_user("jose", "jose@example.org", "pw-long-enough")


def test_a_token_without_the_organisation_scope_gets_the_scope_named(tmp_path):
    with start_gitea(tmp_path, TOKEN, scopes={"write:repository", "write:user"}) as gitea:
        with client_for(gitea) as client, pytest.raises(GiteaAuthError) as caught:
            client.create_org("vmagent-projects")
    message = str(caught.value)
    assert "403" in message and "required=[write:organization]" in message
    assert TOKEN not in message
    assert len(gitea.requests) == 1  # not retried


def test_a_branch_exists_or_not(gitea, tmp_path):
    import subprocess
    gitea.create_repo("alice", "calc")
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                    "-q", "--allow-empty", "-m", "one"], check=True)
    subprocess.run(["git", "-C", str(work), "push", "-q", str(gitea.repo_path("alice", "calc")),
                    "main"], check=True)
    with client_for(gitea) as client:
        assert client.branch_exists("alice", "calc", "main")
        assert not client.branch_exists("alice", "calc", "master")


# --- redirects ------------------------------------------------------------------------------

def test_a_renamed_repository_is_followed_to_its_new_name(gitea):
    gitea.create_repo("alice", "calc", "d")
    gitea.rename_repo("alice", "calc", "calculator")
    with client_for(gitea) as client:
        info = client.get_repo("alice", "calc")
        client.set_commit_status("alice", "calc", SHA, "pending", "not verified")
    assert info.full_name == "alice/calculator"
    assert (307, "/api/v1/repos/alice/calc") in [(r.status, r.path) for r in gitea.responses]
    assert f"alice/calculator@{SHA}" in gitea.statuses  # a 307 keeps the POST and its body


def test_a_renamed_owner_is_followed(gitea):
    gitea.create_repo("team", "tool")
    gitea.rename_account("team", "crew")
    with client_for(gitea) as client:
        assert client.get_repo("team", "tool").full_name == "crew/tool"
        assert client.get_org("team") == "crew"


def test_a_redirect_to_another_host_is_not_followed_and_carries_no_token(gitea):
    gitea.create_repo("alice", "calc")
    with start_recorder(host="localhost") as (elsewhere, seen):
        gitea.api_elsewhere["alice/calc"] = elsewhere
        with client_for(gitea) as client, pytest.raises(GiteaError) as caught:
            client.get_repo("alice", "calc")
    assert seen == []
    message = str(caught.value)
    assert "redirect" in message and elsewhere.split("//")[1].split(":")[0] in message
    assert "GITEA_URL" in message and TOKEN not in message


def test_a_redirect_out_of_the_api_is_not_followed(gitea):
    gitea.create_repo("alice", "calc")
    gitea.api_elsewhere["alice/calc"] = gitea.url + "/login?redirect_to="
    with client_for(gitea) as client, pytest.raises(GiteaError, match="outside its API"):
        client.get_repo("alice", "calc")
