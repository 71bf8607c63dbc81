"""Host-side git for a session's project folder: restore it when a session opens,
commit it, push it on close (to Gitea, or to a local bare repository under the state
dir when no Gitea is configured).

vmd runs this as root on a folder the guest can write, `.git` included. So every git
call here is hardened against what a guest may have planted there: hooks are off,
system and global config are ignored, the repository's own `.git/config` is cut down to
a short list of harmless keys (a guest-written `core.fsmonitor`, `filter.*.clean`,
`core.worktree` or `url.*.insteadOf` would otherwise run a program as root, commit
host files, or send the token elsewhere), and a `.git` holding symbolic links is
refused.

The Gitea token travels only in an `http.<gitea-url>.extraHeader` given to git through
the environment (`GIT_CONFIG_COUNT`, the same as `git -c` but not visible in the
process list): never in a remote URL, never in `.git/config`, never in an error.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator

from vmd.gitea import GiteaClient, GiteaError, RepoInfo, StatusState

BRANCH = "main"
TOPICS = ["vmagent"]
# The owner folder for the local bare repository when a session names no owner.
LOCAL_OWNER = "local"

# Keys of a project's .git/config that survive; everything else may run a program, point
# git at other folders or rewrite URLs. A guest's `user.name` and remotes stay usable.
_SAFE_CONFIG_KEY = re.compile(
    r"^(core\.(repositoryformatversion|filemode|logallrefupdates|ignorecase|precomposeunicode"
    r"|symlinks|autocrlf|eol|safecrlf|quotepath)"
    r"|extensions\.objectformat"
    r"|user\.(name|email)"
    r"|init\.defaultbranch"
    r"|branch\.[^\s]+\.(remote|merge)"
    r"|remote\.[^\s]+\.(url|fetch))$")

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class PublishError(Exception):
    """The project folder could not be committed or restored; the message is a sentence."""


class Remote(BaseModel):
    """Where a project lives: Gitea when `gitea_url` and `gitea_token` are set, else a
    bare repository under `<state_dir>/git/<owner>/<project>.git`."""

    model_config = ConfigDict(extra="forbid")

    owner: str = ""  # empty: the token's user on Gitea, LOCAL_OWNER locally
    project: str
    description: str = ""
    gitea_url: str | None = None
    gitea_token: SecretStr | None = None
    state_dir: Path
    # A push of a large project over a slow link is the longest git call here.
    git_timeout_s: float = 300.0
    # API calls: tries in all and the first backoff; see GiteaClient.
    gitea_retries: int = 4
    gitea_backoff_s: float = 0.5

    @field_validator("owner", "project")
    @classmethod
    def _safe_name(cls, value: str, info) -> str:
        if value == "" and info.field_name == "owner":
            return value
        if not _NAME.match(value) or value.endswith(".git") or len(value) > 100:
            raise ValueError(
                f"{info.field_name} {value!r} is not a usable repository name: use letters, "
                "digits, '-', '_' and '.', start with a letter or digit, and do not end in .git")
        return value

    @field_validator("gitea_url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"gitea_url {value!r} must be an http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("gitea_url must not carry credentials; put the token in gitea_token")
        return value.rstrip("/")

    @property
    def uses_gitea(self) -> bool:
        return bool(self.gitea_url and self.gitea_token and self.gitea_token.get_secret_value())

    @property
    def local_path(self) -> Path:
        return self.state_dir / "git" / (self.owner or LOCAL_OWNER) / f"{self.project}.git"

    def token(self) -> str:
        return self.gitea_token.get_secret_value() if self.gitea_token else ""


class PushResult(BaseModel):
    sha: str | None
    branch: str = BRANCH
    remote_display: str  # the URL without credentials, or the local path
    web_url: str | None = None  # Gitea's page of the commit; None locally
    pushed: bool
    error: str | None = None  # why nothing was pushed; a sentence without the token
    warnings: list[str] = []  # pushed, but topics or commit status could not be set


# --- opening ------------------------------------------------------------------------

def prepare_project(project_dir: Path, remote: Remote) -> str:
    """Make `project_dir` a git repository holding the remote's history, when it has
    one; else a new repository on branch main. Returns a sentence for the session."""
    project_dir.mkdir(parents=True, exist_ok=True)
    if (project_dir / ".git").exists() or (project_dir / ".git").is_symlink():
        _check_git_dir(project_dir)
        count = _commit_count(project_dir)
        return (f"the project folder is already a git repository with {count} commit(s); "
                "kept as it is")
    _git(project_dir, "init", "-q", "-b", BRANCH)
    try:
        source, display, branch = _history_source(remote)
    except GiteaError as exc:
        return (f"new project (the history of {_display_name(remote)} could not be read: {exc} "
                "If it has history, the push at close will be refused.)")
    if source is None:
        return f"new project: {display} has no history yet"
    fetch = _git(project_dir, "fetch", "-q", "--no-tags", source,
                 f"refs/heads/{branch}", remote=remote, check=False)
    if fetch.returncode != 0:
        return (f"new project (fetching the history of {display} failed: "
                f"{_tail(fetch, remote)}; the push at close may be refused)")
    # The folder may already hold files (none are lost that the history does not hold);
    # point main at the fetched commit and check it out over them.
    _git(project_dir, "update-ref", f"refs/heads/{BRANCH}", "FETCH_HEAD")
    _git(project_dir, "reset", "-q", "--hard", "HEAD")
    count = _commit_count(project_dir)
    return f"restored {count} commit{'s' if count != 1 else ''} from {display}"


def _history_source(remote: Remote) -> tuple[str | None, str, str]:
    """(fetch URL or path, display name, branch) of the remote's history, or None as
    the URL when there is none."""
    if not remote.uses_gitea:
        path = remote.local_path
        display = str(path)
        if not path.exists():
            return None, display, BRANCH
        heads = _git(path, "for-each-ref", "--format=%(refname:short)", "refs/heads",
                     bare=True).stdout.split()
        branch = BRANCH if BRANCH in heads else (heads[0] if heads else BRANCH)
        return (str(path) if heads else None), display, branch
    with _client(remote) as client:
        owner = remote.owner or client.current_user()
        info = client.get_repo(owner, remote.project)
    display = f"{owner}/{remote.project}"
    if info is None or info.empty:
        return None, display, BRANCH
    return _push_url(remote, owner), display, info.default_branch or BRANCH


# --- committing ---------------------------------------------------------------------

def commit_project(project_dir: Path, message: str, author_name: str = "vmagent",
                   author_email: str = "vmagent@localhost") -> str | None:
    """Commit everything in the folder. Returns the new sha, HEAD when nothing changed,
    or None when there is no commit and nothing to commit."""
    if not (project_dir / ".git").exists() and not (project_dir / ".git").is_symlink():
        project_dir.mkdir(parents=True, exist_ok=True)
        _git(project_dir, "init", "-q", "-b", BRANCH)
    _check_git_dir(project_dir)
    _git(project_dir, "add", "-A")
    head = _head(project_dir)
    staged = _git(project_dir, "diff", "--cached", "--quiet", *(["HEAD"] if head else []),
                  check=False)
    if staged.returncode == 0:
        if head is None:
            # `diff --cached` without HEAD compares with an empty index: check files.
            if not _git(project_dir, "ls-files").stdout.strip():
                return None
        else:
            return head
    identity = {"GIT_AUTHOR_NAME": author_name, "GIT_AUTHOR_EMAIL": author_email,
                "GIT_COMMITTER_NAME": author_name, "GIT_COMMITTER_EMAIL": author_email}
    _git(project_dir, "commit", "-q", "--no-verify", "-m", message or "vmagent session",
         extra_env=identity)
    return _head(project_dir)


# --- pushing ------------------------------------------------------------------------

def push_project(project_dir: Path, remote: Remote, *, status: StatusState = "pending",
                 status_description: str = "vmd has not verified this commit",
                 status_url: str | None = None) -> PushResult:
    """Push HEAD to branch main of the remote; on Gitea also set the topics and the
    commit status (vmd's verification: `status`, `status_description`)."""
    display = _display_name(remote)
    try:
        _check_git_dir(project_dir)
        sha = _head(project_dir)
    except PublishError as exc:
        return PushResult(sha=None, remote_display=display, pushed=False, error=str(exc))
    if sha is None:
        return PushResult(sha=None, remote_display=display, pushed=False,
                          error="Nothing was pushed: the project folder has no commit yet.")
    if remote.uses_gitea:
        return _push_to_gitea(project_dir, remote, sha, status, status_description, status_url)
    return _push_to_local(project_dir, remote, sha)


def _push_to_local(project_dir: Path, remote: Remote, sha: str) -> PushResult:
    path = remote.local_path
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _git(path.parent, "init", "-q", "--bare", "-b", BRANCH, str(path))
    pushed = _git(project_dir, "push", "-q", str(path), f"HEAD:refs/heads/{BRANCH}",
                  remote=remote, check=False)
    if pushed.returncode != 0:
        return PushResult(sha=sha, remote_display=str(path), pushed=False,
                          error=_push_failure(pushed, str(path), remote))
    return PushResult(sha=sha, remote_display=str(path), pushed=True)


def _push_to_gitea(project_dir: Path, remote: Remote, sha: str, status: StatusState,
                   status_description: str, status_url: str | None) -> PushResult:
    display = _display_name(remote)
    warnings: list[str] = []
    with _client(remote) as client:
        try:
            info: RepoInfo = client.ensure_repo(remote.owner, remote.project, remote.description)
        except GiteaError as exc:
            return PushResult(sha=sha, remote_display=display, pushed=False,
                              error=f"Nothing was pushed: {exc}")
        owner, name = info.full_name.split("/", 1)
        url = _push_url(remote, owner, name)
        pushed = _git(project_dir, "push", "-q", url, f"HEAD:refs/heads/{BRANCH}",
                      remote=remote, check=False)
        if pushed.returncode != 0:
            return PushResult(sha=sha, remote_display=url, pushed=False,
                              error=_push_failure(pushed, info.full_name, remote))
        for what, call in (
            ("topics", lambda: client.set_topics(owner, name, TOPICS)),
            ("commit status", lambda: client.set_commit_status(
                owner, name, sha, status, status_description, target_url=status_url)),
        ):
            try:
                call()
            except GiteaError as exc:
                warnings.append(f"The push landed, but the {what} could not be set: {exc}")
    return PushResult(sha=sha, remote_display=url, pushed=True, warnings=warnings,
                      web_url=f"{info.html_url.rstrip('/')}/commit/{sha}")


def _push_failure(result: subprocess.CompletedProcess, where: str, remote: Remote) -> str:
    tail = _tail(result, remote)
    if "non-fast-forward" in tail or "fetch first" in tail or "[rejected]" in tail:
        return (f"The push to {where} was refused: its branch {BRANCH} holds commits this "
                f"project folder lacks (the session did not start from its history). Nothing "
                f"was overwritten; the work is committed locally. git said: {tail}")
    if "Authentication failed" in tail or re.search(r"\b40[13]\b", tail):
        return (f"The push to {where} failed: Gitea's git endpoint refused the token. Check "
                "that it is valid and has the write:repository scope (Gitea → Settings → "
                f"Applications). git said: {tail}")
    return f"The push to {where} failed: {tail}"


# --- git plumbing -------------------------------------------------------------------

def _client(remote: Remote) -> GiteaClient:
    assert remote.gitea_url
    return GiteaClient(remote.gitea_url, remote.token(), retries=remote.gitea_retries,
                       backoff=remote.gitea_backoff_s)


def _push_url(remote: Remote, owner: str, name: str | None = None) -> str:
    # Built from the configured URL, not the API's clone_url: Gitea's ROOT_URL is often
    # the public address, which vmd (next to Gitea) may not reach.
    assert remote.gitea_url
    return f"{remote.gitea_url}/{owner}/{name or remote.project}.git"


def _display_name(remote: Remote) -> str:
    if remote.uses_gitea:
        return f"{remote.gitea_url}/{remote.owner or '<token user>'}/{remote.project}.git"
    return str(remote.local_path)


def _git_env(remote: Remote | None, extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "true",  # never a guest-configured core.askpass program
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    })
    config = {
        "safe.directory": "*",  # the folder belongs to the guest's uid, we are root
        "core.hooksPath": os.devnull,
        "core.fsmonitor": "false",
        "commit.gpgSign": "false",
        "credential.helper": "",
        "protocol.ext.allow": "never",
    }
    if remote is not None and remote.uses_gitea:
        # Scoped to the Gitea URL so that a redirect elsewhere does not carry it along.
        config[f"http.{remote.gitea_url}/.extraHeader"] = f"Authorization: token {remote.token()}"
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for i, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env.update(extra or {})
    return env


def _git(cwd: Path, *args: str, remote: Remote | None = None, check: bool = True,
         bare: bool = False, extra_env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess:
    env = _git_env(remote, extra_env)
    if bare:
        env["GIT_DIR"] = str(cwd)
    elif (cwd / ".git").is_dir():
        # Explicit, so that a core.worktree or a .git file cannot point git elsewhere.
        env["GIT_DIR"] = str(cwd / ".git")
        env["GIT_WORK_TREE"] = str(cwd)
    timeout = remote.git_timeout_s if remote else 120.0
    try:
        result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True,
                                text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PublishError(f"git {args[0]} in {cwd} did not finish within {timeout:.0f} s; "
                           "check the network to the remote and the size of the project.")
    if check and result.returncode != 0:
        raise PublishError(f"git {args[0]} in {cwd} failed: {_tail(result, remote)}")
    return result


def _tail(result: subprocess.CompletedProcess, remote: Remote | None) -> str:
    lines = f"{result.stderr or ''}\n{result.stdout or ''}".splitlines()
    text = " ".join(" ".join(l for l in lines if not l.startswith("hint:")).split())
    if remote is not None and remote.token():
        text = text.replace(remote.token(), "***")
    return text[-600:] or f"exit code {result.returncode}"


def _head(project_dir: Path) -> str | None:
    result = _git(project_dir, "rev-parse", "--verify", "-q", "HEAD", check=False)
    return result.stdout.strip() or None if result.returncode == 0 else None


def _commit_count(project_dir: Path) -> int:
    result = _git(project_dir, "rev-list", "--count", "HEAD", check=False)
    return int(result.stdout.strip()) if result.returncode == 0 else 0


def _check_git_dir(project_dir: Path) -> None:
    """Refuse a .git that is not a plain folder or holds links; cut its config down."""
    git_dir = project_dir / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir():
        raise PublishError(
            f"{git_dir} is not a plain folder (a link or a file); vmd will not run git on "
            "it. Remove it from the project folder to start a fresh history.")
    for folder, dirs, files in os.walk(git_dir):
        for entry in (*dirs, *files):
            if os.path.islink(os.path.join(folder, entry)):
                raise PublishError(
                    f"{os.path.join(folder, entry)} is a symbolic link inside .git; vmd will "
                    "not run git as root on it. Remove the link and close again.")
    if (git_dir / "commondir").exists():
        raise PublishError(f"{git_dir} is a linked worktree (it has a commondir file); vmd "
                           "commits only a plain repository. Remove .git/commondir.")
    _sanitize_config(git_dir / "config")


def _safe_config_entry(key: str, value: str) -> bool:
    if key == "core.bare":
        return value == "false"
    return bool(_SAFE_CONFIG_KEY.match(key))


def _sanitize_config(config: Path) -> None:
    if not config.exists():
        return
    # `git config --file` only parses the file (includes are off for --file); safe to run.
    listed = subprocess.run(
        ["git", "config", "--file", str(config), "--null", "--list"],
        capture_output=True, text=True, env=_git_env(None, None), timeout=30)
    entries: list[tuple[str, str]] = []
    if listed.returncode == 0:  # unparsable: start from a fresh config
        for entry in filter(None, listed.stdout.split("\0")):
            key, _, value = entry.partition("\n")
            entries.append((key, value))
    kept = [(k, v) for k, v in entries if _safe_config_entry(k.lower(), v.lower())]
    if len(kept) == len(entries) and listed.returncode == 0:
        return
    stat = config.stat()
    config.unlink()
    config.touch()
    for key, value in kept:
        subprocess.run(["git", "config", "--file", str(config), "--add", key, value],
                       check=True, env=_git_env(None, None), timeout=30)
    if not any(k.lower() == "core.repositoryformatversion" for k, _ in kept):
        subprocess.run(["git", "config", "--file", str(config),
                        "core.repositoryformatversion", "0"],
                       check=True, env=_git_env(None, None), timeout=30)
    if os.geteuid() == 0:
        os.chown(config, stat.st_uid, stat.st_gid)
