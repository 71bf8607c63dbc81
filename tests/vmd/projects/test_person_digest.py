"""A person's repositories in the service's organisation are named with a 128-bit hash of
their id (vmd/projects/owners.py), and one an older vmd named with the 40-bit hash is found by its
old name and person topic and renamed, at the next open, against the Gitea stand-in: its
history reaches the folder, the push lands in it, and no second repository appears."""

from __future__ import annotations

import subprocess

from tests.support.gitea_server import start_gitea
from vmd.projects.owners import OwnerPolicy, legacy_place, org_repo_name, person_topic
from vmd.projects.publish import commit_project, prepare_project, push_project
from vmd.projects.remote import Remote

TOKEN = "digest-token-5e1f"
PERSON = "3f2a9c1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
ORG = "vmagent-projects"


def git(*args, cwd=None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def seed_legacy(gitea, tmp_path, name: str, topics: list[str]) -> str:
    """A repository as an older vmd left it: the old name, its topics, one commit."""
    repo = gitea.create_repo(ORG, name, private=True)
    repo.topics = topics
    work = tmp_path / "seed"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "old.txt").write_text("work from before\n")
    git("add", "old.txt", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "before", cwd=work)
    git("push", "-q", str(gitea.repo_path(ORG, name)), "main", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).strip()


def remote(gitea, tmp_path) -> Remote:
    return Remote(owner=PERSON, project="calc", gitea_url=gitea.url, gitea_token=TOKEN,
                  state_dir=tmp_path / "state", people=OwnerPolicy(), gitea_backoff_s=0.01)


def test_an_old_40_bit_repository_is_found_by_its_topic_renamed_and_carried_on(tmp_path):
    old_name, old_topic = legacy_place(PERSON, "calc")
    new_name = org_repo_name(PERSON, "calc")
    assert old_name != new_name and len(new_name) <= 100 and len(person_topic(PERSON)) <= 35
    with start_gitea(tmp_path, TOKEN, orgs={ORG}) as gitea:
        before = seed_legacy(gitea, tmp_path, old_name, ["vmagent", old_topic])
        r = remote(gitea, tmp_path)
        folder = tmp_path / "p"
        prepared = prepare_project(folder, r)
        assert prepared.base_commit == before and (folder / "old.txt").read_text() == "work from before\n"
        (folder / "new.txt").write_text("this session\n")
        commit_project(folder, r, "more")
        pushed = push_project(r)
        assert pushed.pushed, pushed.error
        assert [n for n in gitea.topics if n.startswith(f"{ORG}/")] == [f"{ORG}/{new_name}"]
        assert set(gitea.topics[f"{ORG}/{new_name}"]) == {"vmagent", person_topic(PERSON)}
        assert gitea.heads(gitea.repo(ORG, new_name))["main"] == pushed.sha


def test_a_repository_under_the_old_name_without_the_person_topic_is_left_alone(tmp_path):
    old_name, _ = legacy_place(PERSON, "calc")
    with start_gitea(tmp_path, TOKEN, orgs={ORG}) as gitea:
        seed_legacy(gitea, tmp_path, old_name, ["vmagent", "someone-else"])
        r = remote(gitea, tmp_path)
        prepared = prepare_project(tmp_path / "p", r)
        assert prepared.base_commit is None  # not this person's history
        assert gitea.repo(ORG, old_name) is not None
        assert gitea.repo(ORG, org_repo_name(PERSON, "calc")) is None
