"""A session's project: restored into its folder at open, committed from the folder's
bytes, pushed from vmd's own repository at close.

The folder is the guest's (it holds whatever a hostile guest left there); the history is
vmd's (vmd/projects/repository.py, a bare repository under the state dir). The flow:

- `prepare_project`: bring vmd's repository up to date with Gitea (when configured), move
  an old folder of the project aside, and check the history out into a new folder that
  the guest then gets (with a `.git` of its own to use as it likes).
- `commit_project`: walk the folder as bytes (vmd/projects/tree.py) and commit exactly
  that into vmd's repository. Nothing in the folder is read as configuration.
- `push_project`: push vmd's branch to a URL vmd builds; the token reaches only that
  one git process, through its environment.
- `resolve_place`: the place on Gitea that vmd/projects/owners.py planned, found (at open,
  reading only) or made (at a push: the service's organisation, a mapped user); a
  repository an older vmd named otherwise is renamed to it.

Every call here takes the project's `Remote` (vmd/projects/remote.py): vmd's repository and
Gitea's place, by the owner mapping of vmd's configuration (by default one organisation of
the service, with per-person repository names). This module does the I/O; owners.py only
plans. The branch is Gitea's default branch as read at open (a repository on `master` is
restored from and pushed back to `master`). Renamed repositories are followed through the
API, which answers with their new name; git itself never follows a redirect
(`http.followRedirects=false`), because git would send the token's header to wherever it
pointed.

Without Gitea, vmd's repository is where the project lives.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

from pydantic import BaseModel

from vmd.contract.bounds import LOCAL_OWNER
from vmd.errors import WordedError
from vmd.private_fs import passable_dir, private_dir
from vmd.projects.gitea import GiteaClient, GiteaError, GiteaUnavailable, RepoInfo, StatusState
from vmd.projects.owners import GiteaPlace, OwnerPolicy, user_names_for
from vmd.projects.remote import Remote
from vmd.projects.repository import BRANCH, Identity, Repository, RepositoryError, tail
from vmd.projects.tree import Limits, present_to_guest, walk


class PublishError(WordedError):
    """The project folder could not be committed or restored; the message is a sentence."""


class Prepared(BaseModel):
    text: str  # a sentence for the session's storage line
    base_commit: str | None  # the commit the folder was checked out from
    branch: str = BRANCH  # the remote branch the history came from (and goes back to)


class Committed(BaseModel):
    sha: str | None
    new: bool  # False: nothing changed since the last commit
    left_out: list[str] = []  # what the folder held that the commit does not, and why


class PushResult(BaseModel):
    sha: str | None
    branch: str = BRANCH
    remote_display: str  # the URL without credentials, or vmd's repository path
    web_url: str | None = None  # Gitea's page of the commit; None locally
    pushed: bool
    error: str | None = None  # why nothing was pushed; a sentence without the token
    warnings: list[str] = []  # pushed, but topics or commit status could not be set
    # Not pushed for a reason that may pass by itself (Gitea unreachable or answering 5xx,
    # a network error): vmd retries it later (vmd/server/push_retrier.py). A refusal, a redirect or
    # a bad token does not pass by waiting.
    retry: bool = False


# --- opening ------------------------------------------------------------------------

def prepare_project(project_dir: Path, remote: Remote, share_owner: tuple[int, int] | None = None,
                    attic: Path | None = None) -> Prepared:
    """Give `project_dir` the project's history, in a folder no guest has written to.
    An old folder of the project is moved into `attic` (nothing is deleted)."""
    repo = remote.repository()
    repo.ensure()
    text, branch = _sync_from_gitea(repo, remote) if remote.uses_gitea else (_local_story(repo, remote), BRANCH)
    if project_dir.exists() or project_dir.is_symlink():
        attic = attic or remote.state_dir / "attic"
        # The time for people, a random part so that no two opens meet (three opens of a
        # project in one second once found the second's folder in the third's way).
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
        kept = attic / (remote.owner or LOCAL_OWNER) / f"{remote.project}-{stamp}"
        private_dir(kept.parent)
        os.chmod(attic, 0o700)
        os.replace(project_dir, kept)
        text += f"; the previous folder was moved to {kept}"
    # QEMU's unprivileged user must pass through the projects folder and the owner folder,
    # but not list them (made with explicit modes: mkdir's follow the umask).
    passable_dir(project_dir.parent.parent, share_owner[1] if share_owner else None)
    private_dir(project_dir.parent)
    os.chmod(project_dir.parent, 0o711)
    head = repo.head()
    try:
        if head:
            repo.check_out(project_dir)
        else:
            Repository.init_work_tree(project_dir)
    except RepositoryError as exc:
        # A folder without the history would be committed as "every file deleted" at
        # close: refuse to start instead, and say what to fix.
        shutil.rmtree(project_dir, ignore_errors=True)
        raise PublishError(f"the history of {_display_name(remote)} could not be checked out into "
                           f"a new project folder: {exc}. Fix or remove the offending commit in the "
                           "repository, then open the session again.") from None
    present_to_guest(project_dir, share_owner)
    return Prepared(text=text, base_commit=head, branch=branch)


def _local_story(repo: Repository, remote: Remote) -> str:
    count = repo.count() if repo.head() else 0
    if not count:
        return f"new project: {repo.path} has no history yet"
    return f"restored {count} commit{'s' if count != 1 else ''} from {repo.path}"


def _sync_from_gitea(repo: Repository, remote: Remote) -> tuple[str, str]:
    """Bring vmd's branch up to Gitea's: (a sentence, the Gitea branch)."""
    try:
        with _client(remote) as client:
            place = resolve_place(client, remote.people, remote.place(), create=False)
            target = (place.owner or client.current_user(), place.repo) if place else None
            info = client.get_repo(*target) if target else None
    except GiteaError as exc:
        return (f"the history of {_display_name(remote)} could not be read ({exc}); vmd's own copy "
                f"({repo.count() if repo.head() else 0} commits) is used", BRANCH)
    if info is None:  # no such repository, or its owner does not exist yet
        where = "/".join(target) if target else remote.place().display
        return f"new project: {where} has no history yet", BRANCH
    display, branch = info.full_name, info.default_branch or BRANCH
    if info.empty:
        return f"new project: {display} has no history yet", branch
    try:
        theirs = repo.fetch(_push_url(remote, info.full_name), branch, remote.auth(),
                            secret=remote.token())
    except RepositoryError as exc:
        return (f"fetching the history of {display} failed ({exc}); the push at close may be "
                "refused", branch)
    ours = repo.head()
    if theirs and (ours is None or repo.is_ancestor(ours, theirs)):
        repo.set_branch(theirs, ours)
    elif theirs and not repo.is_ancestor(theirs, ours):
        # Both moved on: Gitea's history wins for the folder; vmd's own commits stay
        # reachable under a ref of their own so that nothing is lost.
        repo.git("update-ref", f"refs/vmd/diverged-{int(time.time())}", ours)
        repo.set_branch(theirs, ours)
    count = repo.count()
    return f"restored {count} commit{'s' if count != 1 else ''} from {display} ({branch})", branch


# --- committing ---------------------------------------------------------------------

def commit_project(project_dir: Path, remote: Remote, message: str, limits: Limits | None = None,
                   identity: Identity | None = None, allow_empty: bool = False) -> Committed:
    """Commit what the folder holds into vmd's repository."""
    if not project_dir.is_dir() or project_dir.is_symlink():
        raise PublishError(f"the project folder {project_dir} is missing; nothing to commit.")
    tree = walk(project_dir, limits)
    try:
        sha, new = remote.repository().commit(tree, message, identity, allow_empty=allow_empty)
    except RepositoryError as exc:
        raise PublishError(f"committing the project folder failed: {exc}") from None
    return Committed(sha=sha, new=new, left_out=tree.left_out)


def changed_files(remote: Remote, base: str | None) -> list[str]:
    repo = remote.repository()
    return repo.changed_files(base, repo.head()) if repo.exists() else []


# --- pushing ------------------------------------------------------------------------

def push_project(remote: Remote, *, branch: str = BRANCH, status: StatusState = "pending",
                 status_description: str = "vmd has not verified this commit",
                 status_url: str | None = None) -> PushResult:
    """Push vmd's branch to Gitea's `branch` (the one recorded at open); set the topics and
    the commit status (vmd's verification: `status`, `status_description`). Without Gitea
    the commit in vmd's repository is the result."""
    repo = remote.repository()
    sha = repo.head() if repo.exists() else None
    display = _display_name(remote)
    if sha is None:
        return PushResult(sha=None, remote_display=display, pushed=False,
                          error="Nothing was pushed: the project has no commit yet.")
    if not remote.uses_gitea:
        return PushResult(sha=sha, remote_display=str(repo.path), pushed=True)
    warnings: list[str] = []
    with _client(remote) as client:
        try:
            # With create=True the owner is found or made, or GiteaError says why not.
            place = resolve_place(client, remote.people, remote.place(), create=True) or remote.place()
            info: RepoInfo = client.ensure_repo(
                place.owner, place.repo, remote.description, private=remote.people.private,
                kind="org" if place.kind == "org" else "owner")
            branch = _target_branch(client, info, branch)
        except GiteaError as exc:
            return PushResult(sha=sha, remote_display=display, pushed=False,
                              error=f"Nothing was pushed: {exc}", retry=isinstance(exc, GiteaUnavailable))
        url = _push_url(remote, info.full_name)
        pushed = repo.push(url, branch, remote.auth(), secret=remote.token())
        if pushed.returncode != 0:
            error, retry = _push_failure(pushed, info.full_name, branch, remote)
            return PushResult(sha=sha, branch=branch, remote_display=url, pushed=False, error=error,
                              retry=retry)
        owner, name = info.owner, info.name
        for topic in place.topics:
            try:
                client.add_topic(owner, name, topic)
            except GiteaError as exc:
                warnings.append(f"The push landed, but the topic {topic} could not be set: {exc}")
        try:
            client.set_commit_status(owner, name, sha, status, status_description,
                                     target_url=status_url)
        except GiteaError as exc:
            warnings.append(f"The push landed, but the commit status could not be set: {exc}")
    return PushResult(sha=sha, branch=branch, remote_display=url, pushed=True, warnings=warnings,
                      web_url=f"{info.html_url.rstrip('/')}/commit/{sha}")


def _target_branch(client: GiteaClient, info: RepoInfo, recorded: str) -> str:
    """The Gitea branch to push to: the one the history came from at open, unless Gitea
    does not have it. A push to a branch Gitea lacks would start a second line of history
    beside the default branch (say vmd's fallback `main` beside `master`, when Gitea could
    not be read at open), so then the default branch it is: a push that does not descend
    from it is refused there, and nothing is overwritten."""
    if info.empty:
        return info.default_branch or recorded
    if recorded == info.default_branch or client.branch_exists(info.owner, info.name, recorded):
        return recorded
    return info.default_branch


def _push_failure(result, where: str, branch: str, remote: Remote) -> tuple[str, bool]:
    """Why git's push failed, in a sentence, and whether trying again later may help."""
    text = tail(result, remote.token())
    if "non-fast-forward" in text or "fetch first" in text or "[rejected]" in text:
        return (f"The push to {where} was refused: its branch {branch} holds commits this "
                f"session did not start from. Nothing was overwritten; the work is committed in "
                f"vmd's repository. git said: {text}"), False
    if re.search(r"\b30[12378]\b", text) or "redirect" in text.lower():
        return (f"The push to {where} failed: Gitea's git endpoint answered with a redirect, and "
                "vmd does not follow git redirects (the token would go along). Check the "
                f"repository's name and GITEA_URL in Gitea. git said: {text}"), False
    if "Authentication failed" in text or re.search(r"\b40[13]\b", text):
        return (f"The push to {where} failed: Gitea's git endpoint refused the token. Check "
                "that it is valid and has the write:repository scope (Gitea → Settings → "
                f"Applications). git said: {text}"), False
    return f"The push to {where} failed: {text}", True


# --- the place on Gitea: found, or made at a push ------------------------------------

def resolve_place(client: GiteaClient, policy: OwnerPolicy, place: GiteaPlace,
                  create: bool) -> GiteaPlace | None:
    """The place with an owner Gitea has. `create=False` (opening) reads only and returns
    None when the owner does not exist yet; `create=True` (pushing) creates the
    organisation, or the mapped user when `policy.create_users` allows it, and raises
    GiteaError with a sentence when it cannot."""
    if place.kind == "org":
        found = client.get_org(place.owner)
        if found is None and place.owner.lower() == client.current_user().lower():
            return replace(place, owner=client.current_user(), kind="owner")
        if found is None:
            if not create:
                return None
            found = client.create_org(place.owner)
        place = replace(place, owner=found)
        _rename_legacy(client, place)
        return place
    if place.kind == "email":
        login = client.find_user_by_email(place.email)
        if login is None and create:
            if not policy.create_users:
                raise GiteaError(
                    f"Gitea has no user with the e-mail {place.email}, which gitea_users maps this "
                    "person to. Create that user in Gitea, map the person to a username, or set "
                    "GITEA_CREATE_USERS=true with a site admin's token so vmd creates it.")
            login = _create_user_for(client, place.email)
        return replace(place, owner=login, kind="owner") if login else None
    return place


def _rename_legacy(client: GiteaClient, place: GiteaPlace) -> None:
    """The person's repository as an older vmd named it (a 40-bit hash), renamed to its
    name now and given the new person topic, so that the history carries on in one
    repository rather than a second, empty one beside it. Found by its old name and
    confirmed by its old person topic: a repository that lacks the topic is not one vmd
    made for this person and is left alone. Done at open as well as at push, since the
    open must restore that history into the folder."""
    if place.legacy is None or client.get_repo(place.owner, place.repo) is not None:
        return
    old_name, old_topic = place.legacy
    info = client.get_repo(place.owner, old_name)
    if info is None or info.owner.lower() != place.owner.lower():
        return
    topics = client.get_topics(info.owner, info.name)
    if old_topic not in topics:
        return
    client.rename_repo(info.owner, info.name, place.repo)
    person = next(t for t in place.topics if t.startswith("person-"))
    client.set_topics(info.owner, place.repo, sorted({*topics, person} - {old_topic}))


def _create_user_for(client: GiteaClient, email: str) -> str:
    names = user_names_for(email)
    for name in names:
        # A password nobody knows: the person sets their own (Gitea asks at the first sign-in,
        # or an admin resets it); vmd keeps none.
        created = client.create_user(name, email, password=secrets.token_urlsafe(24))
        if created:
            return created
    raise GiteaError(f"Gitea already has users named {names[0]!r} and {names[0]}-…, so vmd could not create "
                     f"one for {email}; create it in Gitea and map the person to its username.")


def _client(remote: Remote) -> GiteaClient:
    assert remote.gitea_url
    return GiteaClient(remote.gitea_url, remote.token(), retries=remote.gitea_retries,
                       backoff=remote.gitea_backoff_s)


def _push_url(remote: Remote, full_name: str) -> str:
    # Built from the configured URL and Gitea's own `full_name` (its spelling, after any
    # rename), not the API's clone_url: Gitea's ROOT_URL is often the public address, which
    # vmd (next to Gitea) may not reach.
    assert remote.gitea_url
    owner, name = full_name.split("/", 1)
    return f"{remote.gitea_url}/{quote(owner, safe='')}/{quote(name, safe='')}.git"


def _display_name(remote: Remote) -> str:
    if remote.uses_gitea:
        return f"{remote.gitea_url}/{remote.place().display}.git"
    return str(remote.repo_path)
