"""Who owns a project on Gitea: the person behind a job, mapped once, by config, to a
Gitea owner that exists.

A job's owner is whoever the job service authenticated: an Open WebUI user id (a UUID), a
terminal user's name. That is rarely a Gitea account, so vmd maps it:

- `org` (the default): every project lives in one organisation of the service
  (`gitea_org`), named `<person>-<project>`, where `<person>` is a slug derived from the
  owner id (`person_slug`), and carries a topic naming the person. Nobody needs a Gitea
  account; vmd creates the organisation (private) on the first push when it is missing.
- `user`: the job owner *is* a Gitea user or organisation name (a terminal setup whose
  users are named like their Gitea logins). An empty owner means the token's own user.
- `gitea_users`, in either mode: a person's id -> a Gitea username or e-mail. Their projects
  go to that account, under the project's own name; an e-mail is looked up through the
  API and, with `gitea_create_users` and a site admin's token, the user is created.

vmd's own repository stays keyed by vmd's owner and project (vmd/projects/repository.py repository_path);
only the Gitea side is mapped. Gitea compares owner and repository names case-insensitively
and refuses a few names (its rules: vmd/config/gitea_names.py, which vmd's settings check
too); `gitea_name_problem` says so when a session opens, before any work.

This module plans and asks nothing of Gitea: `plan_place` says where a project goes,
`user_names_for` what a created user would be called. Finding or making that place on
Gitea is publishing's I/O (vmd/projects/publish.py `resolve_place`).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from vmd.config.gitea_names import (DEFAULT_ORG, GiteaOrgName, OwnerMode, PersonMap, owner_name_problem,
                                    repository_name_problem)
from vmd.contract.bounds import LOCAL_OWNER

SERVICE_TOPIC = "vmagent"
# The readable part of a person's slug; the rest is a hash of the whole id. 12 keeps the
# first group of a UUID and leaves a project name 60 of Gitea's 100 characters.
SLUG_READABLE = 12
# The person's hash: 26 base32 characters, 130 bits of SHA-256 (at least the 128 that make a
# collision out of reach where people choose their own ids; 32 hex characters would be the
# same bits but push the topic, person-<hash>, past Gitea's 35 characters).
DIGEST_CHARS = 26
# What vmd used before: 8 characters, 40 bits, which a person choosing ids can collide with
# another's in about 2^20 tries. Repositories named so are found and renamed (publish.py `resolve_place`).
LEGACY_DIGEST_CHARS = 8


# --- people ---------------------------------------------------------------------------

def _digest(text: str, length: int = 8) -> str:
    # base32 keeps the hash inside Gitea's name and topic alphabets (5 bits a character).
    raw = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return base64.b32encode(raw).decode("ascii").lower()[:length]


def person_slug(person: str, digest_chars: int = DIGEST_CHARS) -> str:
    """The person's part of repository names: `<readable>-<hash>`.

    Deterministic (the same id always gives the same slug), within Gitea's repository and
    topic alphabets, at most 39 characters, and collision-resistant: the 128-bit hash covers
    the exact id, so ids that differ only in case or punctuation get different slugs, and
    nobody can choose an id that shares another person's repositories.
    """
    readable = re.sub(r"[^a-z0-9]+", "-", person.lower()).strip("-")
    readable = readable[:SLUG_READABLE].strip("-")
    digest = _digest(person, digest_chars)
    return f"{readable}-{digest}" if readable else digest


def person_topic(person: str) -> str:
    """The topic that names the person on each of their repositories in the organisation:
    `person-<hash>` (33 characters; the readable part would not fit Gitea's 35)."""
    return f"person-{_digest(person, DIGEST_CHARS)}"


def legacy_place(person: str, project: str) -> tuple[str, str]:
    """(repository name, person topic) as vmd named them with the 40-bit hash."""
    return (org_repo_name(person, project, LEGACY_DIGEST_CHARS),
            f"person-{person_slug(person, LEGACY_DIGEST_CHARS)}")


def org_repo_name(person: str, project: str, digest_chars: int = DIGEST_CHARS) -> str:
    """`<person-slug>-<project>`, cut to Gitea's 100 characters with a hash of the project
    when it is longer, so that two long project names never meet."""
    slug = person_slug(person, digest_chars)
    name = f"{slug}-{project}"
    if len(name) <= 100:
        return name
    keep = 100 - len(slug) - 2 - 8
    return f"{slug}-{project[:keep].rstrip('.-_')}-{_digest(project)}"


class OwnerPolicy(BaseModel):
    """How a person maps to a Gitea owner; `from_config` reads vmd's configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: OwnerMode = "org"
    org: GiteaOrgName = DEFAULT_ORG
    users: PersonMap = {}
    create_users: bool = False
    private: bool = True

    @classmethod
    def from_config(cls, config) -> "OwnerPolicy":
        return cls(mode=config.gitea_owner_mode, org=config.gitea_org,
                   users=dict(config.gitea_users), create_users=config.gitea_create_users,
                   private=config.gitea_private)


@dataclass(frozen=True)
class GiteaPlace:
    """Where one person's project lives on Gitea.

    kind "org": the service's organisation (created when missing); "owner": a user or
    organisation named as it is ("" is the token's user); "email": a user still to be found
    by `email`. `owner` and `repo` are what vmd asks Gitea for; Gitea's answer (its
    `full_name`, after any rename) is what vmd then uses.
    """

    owner: str
    repo: str
    kind: Literal["org", "owner", "email"]
    topics: tuple[str, ...] = (SERVICE_TOPIC,)
    email: str = ""
    # kind "org": (name, person topic) of the same project as an older vmd named it, which
    # publish.py `resolve_place` renames to `repo` when only that one exists.
    legacy: tuple[str, str] | None = None

    @property
    def display(self) -> str:
        owner = self.owner or (f"<the Gitea user of {self.email}>" if self.email else "<token user>")
        return f"{owner}/{self.repo}"


def plan_place(policy: OwnerPolicy, person: str, project: str) -> GiteaPlace:
    """Where `person`'s `project` goes, from the policy alone (no network)."""
    mapped = policy.users.get(person) if person else None
    if mapped and "@" in mapped:
        return GiteaPlace(owner="", repo=project, kind="email", email=mapped)
    if mapped:
        return GiteaPlace(owner=mapped, repo=project, kind="owner")
    if policy.mode == "org":
        who = person or LOCAL_OWNER
        return GiteaPlace(owner=policy.org, repo=org_repo_name(who, project), kind="org",
                          topics=(SERVICE_TOPIC, person_topic(who)), legacy=legacy_place(who, project))
    return GiteaPlace(owner=person, repo=project, kind="owner")


def user_names_for(email: str) -> tuple[str, str]:
    """The names vmd tries, in order, for a Gitea user it creates for `email` (a person the
    mapping names by e-mail, with `gitea_create_users`): the address's local part as Gitea
    takes a name, then the same with a hash of the address."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", email.partition("@")[0])
    base = re.sub(r"[-._]{2,}", "-", base).strip("-._")[:30] or "person"
    if owner_name_problem(base):
        base = f"u-{base}"[:30].strip("-._")
    return base, f"{base}-{_digest(email, 6)}"


# --- when a session opens -----------------------------------------------------------------

def gitea_name_problem(config, owner: str, project: str | None) -> str | None:
    """A sentence when `owner`'s `project` cannot be kept on Gitea as vmd would name it
    (a name Gitea reserves or refuses), else None. vmd calls it when a session opens, after
    vmd's own name rule (vmd/contract/bounds.py name_problem), so that nothing is worked on that could
    never be pushed. Without Gitea configured, or without a project, there is nothing to
    check."""
    if not project or not (config.gitea_url and config.gitea_token.get_secret_value()):
        return None
    if problem := repository_name_problem(project, what="project"):
        return problem
    place = plan_place(OwnerPolicy.from_config(config), owner, project)
    if place.kind == "owner" and place.owner:
        what = ("owner" if place.owner == owner else
                f"gitea_users[{owner!r}]")
        if problem := owner_name_problem(place.owner, what=what):
            return problem
    return repository_name_problem(place.repo)
