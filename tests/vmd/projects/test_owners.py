"""The person behind a job, mapped to a Gitea owner (vmd/projects/owners.py): slugs, the configured
policy, and the names Gitea refuses, refused when a session opens."""

from __future__ import annotations

import re
from dataclasses import asdict

import pytest
from pydantic import ValidationError

from vmd.config import VmdConfig
from vmd.config.gitea_names import owner_name_problem, repository_name_problem
from vmd.contract.bounds import NAME_PATTERN
from vmd.projects.owners import OwnerPolicy, gitea_name_problem, org_repo_name, person_slug, person_topic, plan_place

UUID = "3f2a9c1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
GITEA = {"gitea_url": "http://gitea:3000", "gitea_token": "t0ken"}


# --- slugs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("person", [UUID, "alice", "Alice", "jose.muller", "_", "x" * 100,
                                    "a-b", "a_b", "..."])
def test_a_slug_is_deterministic_short_and_within_gitea_s_alphabets(person):
    slug = person_slug(person)
    assert slug == person_slug(person)
    assert len(slug) <= 39 and re.fullmatch(r"[a-z0-9][a-z0-9-]*", slug)
    # 128 bits of hash or more (26 base32 characters), in the slug and in the topic.
    assert re.search(r"(^|-)[a-z2-7]{26}$", slug) and re.fullmatch(r"person-[a-z2-7]{26}", person_topic(person))
    assert repository_name_problem(f"{slug}-calc") is None
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,34}", person_topic(person))  # Gitea's topic rule


def test_an_open_webui_id_keeps_its_first_group_readable():
    assert person_slug(UUID).startswith("3f2a9c1e-5b6-")


def test_ids_that_differ_only_in_case_or_punctuation_get_different_slugs():
    people = ["alice", "Alice", "ALICE", "a-lice", "a_lice", "a.lice", UUID, UUID.upper()]
    assert len({person_slug(p) for p in people}) == len(people)


def test_a_long_project_name_is_cut_to_gitea_s_limit_without_collisions():
    long_a, long_b = "p" * 99 + "a", "p" * 99 + "b"
    names = {org_repo_name(UUID, long_a), org_repo_name(UUID, long_b)}
    assert len(names) == 2 and all(len(n) <= 100 and repository_name_problem(n) is None for n in names)
    assert org_repo_name(UUID, "calc") == f"{person_slug(UUID)}-calc"


# --- the policy ---------------------------------------------------------------------------------

def test_by_default_a_person_s_project_goes_to_the_service_org_with_a_topic():
    place = plan_place(OwnerPolicy(), UUID, "calc")
    assert (place.kind, place.owner, place.repo) == ("org", "vmagent-projects", org_repo_name(UUID, "calc"))
    assert place.topics == ("vmagent", person_topic(UUID))


def test_a_mapped_person_goes_to_their_own_account_under_the_project_s_name():
    policy = OwnerPolicy(users={UUID: "jose", "p2": "zoe@example.org"})
    assert asdict(plan_place(policy, UUID, "calc")) == {
        "owner": "jose", "repo": "calc", "kind": "owner", "topics": ("vmagent",), "email": "",
        "legacy": None}
    email = plan_place(policy, "p2", "calc")
    assert (email.kind, email.email, email.repo) == ("email", "zoe@example.org", "calc")


def test_in_user_mode_the_owner_is_the_gitea_owner():
    place = plan_place(OwnerPolicy(mode="user"), "alice", "calc")
    assert (place.kind, place.owner, place.repo) == ("owner", "alice", "calc")


def test_the_defaults_are_one_private_organisation():
    config = VmdConfig.load(env={})
    assert (config.gitea_owner_mode, config.gitea_org, config.gitea_private,
            config.gitea_create_users, config.gitea_users) == ("org", "vmagent-projects", True, False, {})
    assert OwnerPolicy.from_config(config) == OwnerPolicy()


def test_the_mapping_is_read_from_the_environment():
    env = {"GITEA_OWNER_MODE": "user", "GITEA_ORG": "jobs", "GITEA_PRIVATE": "false",
           "GITEA_CREATE_USERS": "true", "GITEA_USERS": f"{UUID}=jose, p2=zoe@example.org"}
    config = VmdConfig.load(env=env)
    assert config.gitea_users == {UUID: "jose", "p2": "zoe@example.org"}
    assert (config.gitea_owner_mode, config.gitea_org, config.gitea_private,
            config.gitea_create_users) == ("user", "jobs", False, True)
    as_json = VmdConfig.load(env={"GITEA_USERS": '{"%s": "jose"}' % UUID})
    assert as_json.gitea_users == {UUID: "jose"}


@pytest.mark.parametrize("settings, words", [
    ({"gitea_org": "admin"}, "Gitea reserves the name 'admin'"),
    ({"gitea_org": "my org"}, "not a name Gitea accepts"),
    ({"gitea_users": {UUID: "assets"}}, "Gitea reserves the name 'assets'"),
    ({"gitea_users": {UUID: "jose@"}}, "not an e-mail address"),
    ({"gitea_users": "no-equals-sign"}, "is not `person=gitea-user-or-email`"),
])
def test_an_unusable_mapping_is_refused_when_the_config_loads(settings, words):
    with pytest.raises(ValidationError, match=re.escape(words)):
        VmdConfig(**settings)


# --- names Gitea refuses -------------------------------------------------------------------------

@pytest.mark.parametrize("name, reason", [
    (".", "reserves the name '.'"), ("..", "reserves the name '..'"), ("-", "reserves the name '-'"),
    ("notes.wiki", "ending in '.wiki'"), ("feed.RSS", "ending in '.rss'"),
    ("news.atom", "ending in '.atom'"), ("X.GIT", "ending in '.git'"),
    ("a..b", "two dots in a row"),
])
def test_a_reserved_repository_name_is_refused_with_a_sentence(name, reason):
    problem = repository_name_problem(name, what="project")
    assert problem and reason in problem and problem.startswith(f"project {name!r} cannot be")
    assert "Choose another name, for example" in problem
    suggestion = re.search(r"for example '([^']+)'", problem)[1]
    assert repository_name_problem(suggestion) is None


@pytest.mark.parametrize("name", ["api", "Assets", "admin", "login", "x.keys", "me.png", "gitea-actions"])
def test_a_reserved_owner_name_is_refused(name):
    assert "cannot be a Gitea user or organisation" in owner_name_problem(name)


@pytest.mark.parametrize("name", ["calc", "my-app", "v2.0", "wiki", "rss-reader", "_private"])
def test_ordinary_names_pass(name):
    assert repository_name_problem(name) is None


def test_the_session_check_refuses_a_reserved_project_when_gitea_is_configured():
    config = VmdConfig(**GITEA)
    problem = gitea_name_problem(config, UUID, "notes.wiki")
    assert problem.startswith("project 'notes.wiki' cannot be a Gitea repository")
    assert NAME_PATTERN.match("notes.wiki")  # vmd's own rule lets it through
    assert gitea_name_problem(config, UUID, "calc") is None
    assert gitea_name_problem(config, UUID, None) is None  # no project, nothing pushed
    assert gitea_name_problem(VmdConfig(), UUID, "notes.wiki") is None  # no Gitea: vmd's repository only


def test_the_session_check_refuses_a_reserved_owner_only_where_it_names_a_gitea_owner():
    assert gitea_name_problem(VmdConfig(**GITEA), "api", "calc") is None  # org mode: a slug
    problem = gitea_name_problem(VmdConfig(**GITEA, gitea_owner_mode="user"), "api", "calc")
    assert problem.startswith("owner 'api' cannot be a Gitea user or organisation")


def test_a_session_for_a_name_gitea_reserves_is_refused_when_it_opens(tmp_path):
    from tests.support.vmd_fakes import LocalMachines, make_config
    from vmagent.link import VmdError
    from tests.support.vmd_wire import WireVmd
    from vmd.server.rpc import VmdServer

    config = make_config(tmp_path, gitea_url="http://127.0.0.1:9", gitea_token="t")
    server = VmdServer(config, LocalMachines()).start()
    c = WireVmd(config.socket, timeout=30).connect()
    try:
        with pytest.raises(VmdError) as refused:
            c.call("session_open", project="notes.wiki", task="notes")
        assert "notes.wiki" in refused.value.message and "notes-wiki" in refused.value.message
    finally:
        c.close()
        server.stop()


def test_the_owner_policy_plans_and_asks_nothing_of_gitea():
    # owners.py, documented as the policy, found, made and renamed owners on Gitea itself;
    # that I/O is publishing's now (vmd/projects/publish.py resolve_place), and the policy
    # plans: where a project goes, what a user made for an e-mail would be called.
    import ast
    from pathlib import Path

    from vmd.projects import owners
    from vmd.projects.owners import user_names_for

    tree = ast.parse(Path(owners.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {m for m in imported if m and m.startswith(("vmd.projects.gitea", "vmd.projects.publish", "httpx"))}
    first, second = user_names_for("Zoë..Smith@example.org")
    assert first == "Zo-Smith" and second.startswith("Zo-Smith-") and len(second) == len(first) + 7
    assert user_names_for("api@example.org")[0] == "u-api"  # Gitea reserves "api"
    assert user_names_for("Zoë..Smith@example.org") == (first, second)  # the same e-mail, the same names
