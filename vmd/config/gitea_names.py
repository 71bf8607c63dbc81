"""Gitea's name rules, and the settings of the Gitea owner mapping that they check: the
service's organisation (`gitea_org`) and the person map (`gitea_users`). vmd's settings
(settings.py) take their types from here, and vmd/projects/owners.py its rules, so that a
name Gitea would refuse is refused when vmd's configuration is read, and when a session
opens, never at a push.

Pure pydantic and stdlib.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator

# --- Gitea's name rules ------------------------------------------------------------------
# From Gitea's source (models/repo/repo.go, models/user/user.go, models/db/name.go): names
# are compared lowercased and trimmed; a reserved name is refused exactly, a pattern
# `*.x` as a suffix. Gitea answers 422 "name is reserved [name: …]" or "name pattern is
# not allowed [pattern: …]" when such a repository or user is created.
RESERVED_REPO_NAMES = (".", "..", "-")
RESERVED_REPO_PATTERNS = ("*.git", "*.wiki", "*.rss", "*.atom")
RESERVED_USER_NAMES = (
    ".", "..", ".well-known", "admin", "api", "assets", "attachments", "avatar", "avatars",
    "captcha", "commits", "debug", "error", "explore", "favicon.ico", "ghost", "issues",
    "login", "manifest.json", "metrics", "milestones", "new", "notifications", "org", "pulls",
    "raw", "repo", "repo-avatars", "robots.txt", "search", "serviceworker.js", "ssh_info",
    "swagger.v1.json", "user", "v2", "gitea-actions")
RESERVED_USER_PATTERNS = ("*.keys", "*.gpg", "*.rss", "*.atom", "*.png")
# CreateRepoOption's binding: AlphaDashDot, MaxSize(100); newer Gitea also refuses "..".
REPO_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
# Gitea's validUsernamePattern (organisations follow the user rule); 40 is its MaxSize.
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
# Gitea's topic rule (models/repo/topic.go): lowercase, 35 characters at most.
TOPIC = re.compile(r"^[a-z0-9][a-z0-9.-]{0,34}$")

# The organisation that holds every project in the "org" mode (vmd/projects/owners.py).
DEFAULT_ORG = "vmagent-projects"


def _reserved(name: str, names: tuple[str, ...], patterns: tuple[str, ...]) -> str | None:
    lowered = name.strip().lower()
    if lowered in names:
        return f"Gitea reserves the name {lowered!r}"
    for pattern in patterns:
        if lowered.endswith(pattern[1:]):
            return f"Gitea refuses names ending in {pattern[1:]!r}"
    return None


def repository_name_problem(name: str, what: str = "repository name") -> str | None:
    """None when Gitea accepts `name` as a repository name, else a sentence."""
    if not REPO_NAME.fullmatch(name):
        return (f"{what} {name!r} is not a name Gitea accepts for a repository: use up to 100 "
                "letters, digits, '-', '_' and '.'.")
    reason = _reserved(name, RESERVED_REPO_NAMES, RESERVED_REPO_PATTERNS)
    if reason is None and ".." in name:
        reason = "Gitea refuses names with two dots in a row"
    if reason:
        return (f"{what} {name!r} cannot be a Gitea repository: {reason} (it keeps '.', '..', "
                "'-' and names ending in .git, .wiki, .rss or .atom for itself). Choose another "
                f"name, for example {_suggestion(name)!r}.")
    return None


def owner_name_problem(name: str, what: str = "Gitea owner") -> str | None:
    """None when `name` can be a Gitea user or organisation name, else a sentence."""
    if not USER_NAME.fullmatch(name) or re.search(r"[-._]{2}", name):
        return (f"{what} {name!r} is not a name Gitea accepts for a user or organisation: use "
                "up to 40 letters, digits, '-', '_' and '.', starting with a letter or digit, "
                "without two punctuation marks in a row.")
    reason = _reserved(name, RESERVED_USER_NAMES, RESERVED_USER_PATTERNS)
    if reason:
        return (f"{what} {name!r} cannot be a Gitea user or organisation: {reason}. Choose "
                f"another name, for example {_suggestion(name)!r}.")
    return None


def _suggestion(name: str) -> str:
    head, dot, tail = name.rpartition(".")
    candidate = f"{head}-{tail}" if dot and head else name
    candidate = re.sub(r"\.{2,}", ".", candidate).strip(".-") or "project"
    return candidate if candidate.lower() not in RESERVED_USER_NAMES else f"{candidate}-1"


# --- the owner mapping's settings -------------------------------------------------------

def parse_person_map(value: object) -> object:
    """`gitea_users` from the environment: a JSON object, or `id=name,id=mail@host`."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return {}
    if text.startswith("{"):
        return json.loads(text)
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        person, sep, target = item.partition("=")
        if not sep or not person.strip() or not target.strip():
            raise ValueError(f"gitea_users entry {item!r} is not `person=gitea-user-or-email`.")
        pairs[person.strip()] = target.strip()
    return pairs


def _check_person_map(value: dict[str, str]) -> dict[str, str]:
    for person, target in value.items():
        if "@" in target:
            local, _, domain = target.rpartition("@")
            if not local or "." not in domain:
                raise ValueError(f"gitea_users maps {person!r} to {target!r}, which is not an "
                                 "e-mail address or a Gitea username.")
        elif problem := owner_name_problem(target, what=f"gitea_users[{person!r}]"):
            raise ValueError(problem)
    return value


def _check_org(value: str) -> str:
    if problem := owner_name_problem(value, what="gitea_org"):
        raise ValueError(problem)
    return value


PersonMap = Annotated[dict[str, str], BeforeValidator(parse_person_map),
                      AfterValidator(_check_person_map)]
GiteaOrgName = Annotated[str, AfterValidator(_check_org)]
OwnerMode = Literal["org", "user"]
