"""A real HTTP server that behaves like Gitea (1.22) where vmd depends on it.

`/api/v1`: GET /user; GET /users/search, /users/{name}; POST /admin/users (site admin);
POST /orgs, GET /orgs/{org}; POST /user/repos, /orgs/{org}/repos, /admin/users/{u}/repos;
GET and PATCH (its `name`: a rename) /repos/{o}/{r}; GET /repos/{o}/{r}/branches/{b}; GET and PUT /repos/{o}/{r}/topics,
PUT /repos/{o}/{r}/topics/{t}; POST and GET /repos/{o}/{r}/statuses/{sha};
GET /repos/{o}/{r}/commits. Git's smart HTTP on /{o}/{r}.git/… through `git http-backend`
as CGI, so a push lands in a real bare repository.

As Gitea does (its source and swagger, tests/support/gitea_spec): owner and repository names are
looked up case-insensitively and answered in their own spelling; a repository has a
default branch (`default_branch`, Gitea's DEFAULT_BRANCH, for new ones; a first push into
an empty repository makes the pushed branch the default) and a private flag; reserved
names and patterns are refused with 422 "name is reserved [name: …]" / "name pattern is not
allowed [pattern: …]"; a token lacking a scope gets 403 "token does not have at least one
of required scope(s), required=[…], token scope=…" (`scopes`); a renamed user or repository
answers 307 to its new name, on the API and on git (`rename_repo`, `rename_account`);
organisations and users are accounts of one namespace. JSON answers follow the vendored
swagger subset, which tests/project/test_gitea_server.py checks.

Every request (API and git) must carry `Authorization: token <TOKEN>`; every request's
method, path, headers and body, and every answer, is recorded so tests can check where the
token went. `fail_next(n)` answers the next n requests with 500, `forbid = True` answers
403, `reject_git = True` answers git with 401, `api_elsewhere` / `git_elsewhere` ("o/r" ->
a base URL) answer that repository's API or git requests with a 307 to another host.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.support.http_stand_in import StandInHTTPServer

_GIT_PATH = re.compile(r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+?)\.git(?P<rest>/.*)$")
SWAGGER = "/api/swagger"
# Gitea's rules (models/repo/repo.go, models/user/user.go, models/repo/topic.go).
RESERVED_REPO_NAMES = {".", "..", "-"}
RESERVED_REPO_PATTERNS = ("*.git", "*.wiki", "*.rss", "*.atom")
RESERVED_USER_NAMES = {
    ".", "..", ".well-known", "admin", "api", "assets", "attachments", "avatar", "avatars",
    "captcha", "commits", "debug", "error", "explore", "favicon.ico", "ghost", "issues",
    "login", "manifest.json", "metrics", "milestones", "new", "notifications", "org", "pulls",
    "raw", "repo", "repo-avatars", "robots.txt", "search", "serviceworker.js", "ssh_info",
    "swagger.v1.json", "user", "v2", "gitea-actions"}
RESERVED_USER_PATTERNS = ("*.keys", "*.gpg", "*.rss", "*.atom", "*.png")
VALID_USERNAME = re.compile(r"^[\da-zA-Z][-.\w]*$")
VALID_TOPIC = re.compile(r"^[a-z0-9][-.a-z0-9]*$")
ALPHA_DASH_DOT = re.compile(r"^[-.\w]+$")
CATEGORIES = ("activitypub", "admin", "issue", "misc", "notification", "organization",
              "package", "repository", "user")
CREATED = "2025-01-01T00:00:00Z"


@dataclass
class RecordedRequest:
    method: str
    path: str  # as sent, query included
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class RecordedResponse:
    method: str
    path: str  # as requested, query included
    status: int
    body: object  # the JSON answer, or None (empty, or not JSON)


@dataclass
class Account:
    """A user or an organisation: Gitea keeps both in one table, one namespace."""
    id: int
    name: str
    kind: Literal["user", "org"]
    email: str = ""
    admin: bool = False
    visibility: str = "public"


@dataclass
class Repo:
    id: int
    owner: Account
    name: str
    description: str = ""
    private: bool = False
    default_branch: str = "main"
    topics: list[str] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.owner.name}/{self.name}"


def _reserved(name: str, names: set[str], patterns: tuple[str, ...]) -> str | None:
    """Gitea's db.IsUsableName: the error message it answers, or None."""
    lowered = name.strip().lower()
    if lowered in names:
        return f"name is reserved [name: {lowered}]"
    for pattern in patterns:
        if lowered.endswith(pattern[1:]):
            return f"name pattern is not allowed [pattern: {pattern}]"
    return None


@dataclass
class FakeGitea:
    root: Path
    token: str
    user: str = "alice"
    orgs: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)  # other users, reachable by an admin
    admin: bool = False
    # The token's scopes, as Gitea names them ("all", "write:repository", "read:user", …).
    scopes: set[str] = field(default_factory=lambda: {"all"})
    # Gitea's [repository] DEFAULT_BRANCH: the default branch of repositories created
    # without one.
    default_branch: str = "main"
    emails: dict[str, str] = field(default_factory=dict)  # login -> e-mail
    url: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    responses: list[RecordedResponse] = field(default_factory=list)
    statuses: dict[str, list[dict]] = field(default_factory=dict)  # "o/r@sha" -> bodies posted
    forbid: bool = False
    reject_git: bool = False  # answer git's smart HTTP with 401, as for a revoked token
    api_elsewhere: dict[str, str] = field(default_factory=dict)  # "o/r" -> base URL
    git_elsewhere: dict[str, str] = field(default_factory=dict)  # "o/r" -> base URL
    _fail: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _accounts: dict[str, Account] = field(default_factory=dict)  # lowercased name -> account
    _repos: dict[tuple[int, str], Repo] = field(default_factory=dict)  # (owner id, lower name)
    _account_redirects: dict[str, int] = field(default_factory=dict)  # old lower name -> id
    _repo_redirects: dict[tuple[int, str], int] = field(default_factory=dict)  # -> repo id
    _next_id: int = 0

    def __post_init__(self) -> None:
        self.add_account(self.user, "user", admin=self.admin)
        for name in sorted(self.users):
            self.add_account(name, "user")
        for name in sorted(self.orgs):
            self.add_account(name, "org")

    # --- state -----------------------------------------------------------------------

    def fail_next(self, n: int) -> None:
        """Answer the next n requests with 500."""
        with self._lock:
            self._fail = n

    def _take_failure(self) -> bool:
        with self._lock:
            if self._fail > 0:
                self._fail -= 1
                return True
            return False

    def _id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    def add_account(self, name: str, kind: Literal["user", "org"], email: str = "",
                    admin: bool = False) -> Account:
        with self._lock:
            existing = self._accounts.get(name.lower())
            if existing:
                return existing
            account = Account(self._id(), name, kind, email or self.emails.get(name, f"{name}@example.org"),
                              admin=admin)
            self._accounts[name.lower()] = account
            self._account_redirects.pop(name.lower(), None)
            return account

    def account(self, name: str) -> Account | None:
        return self._accounts.get(name.lower())

    @property
    def me(self) -> Account:
        me = self._accounts[self.user.lower()]
        me.admin = self.admin
        return me

    def create_repo(self, owner: str, name: str, description: str = "", *,
                    default_branch: str | None = None, private: bool = False) -> Repo:
        """A repository as Gitea would have it; an unknown owner becomes a user (an
        organisation when it is in `orgs`)."""
        with self._lock:
            account = self.account(owner) or self.add_account(
                owner, "org" if owner.lower() in {o.lower() for o in self.orgs} else "user")
            existing = self.repo(account.name, name)
            if existing:
                return existing
            repo = Repo(self._id(), account, name, description, private,
                        default_branch or self.default_branch)
            path = self.root / account.name / f"{name}.git"
            path.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "init", "-q", "--bare", "-b", repo.default_branch, str(path)],
                           check=True)
            subprocess.run(["git", "--git-dir", str(path), "config", "http.receivepack", "true"],
                           check=True)
            self._repos[(account.id, name.lower())] = repo
            self._repo_redirects.pop((account.id, name.lower()), None)
            return repo

    def repo(self, owner: str, name: str) -> Repo | None:
        account = self.account(owner)
        return self._repos.get((account.id, name.lower())) if account else None

    def repo_path(self, owner: str, name: str) -> Path:
        repo = self.repo(owner, name)
        return self._path(repo) if repo else self.root / owner / f"{name}.git"

    def _path(self, repo: Repo) -> Path:
        return self.root / repo.owner.name / f"{repo.name}.git"

    def rename_repo(self, owner: str, old: str, new: str) -> None:
        """As Gitea's settings page does: the old name answers with a redirect."""
        with self._lock:
            repo = self.repo(owner, old)
            assert repo is not None
            old_path = self._path(repo)
            del self._repos[(repo.owner.id, old.lower())]
            repo.name = new
            old_path.rename(self._path(repo))
            self._repos[(repo.owner.id, new.lower())] = repo
            self._repo_redirects[(repo.owner.id, old.lower())] = repo.id

    def rename_account(self, old: str, new: str) -> None:
        with self._lock:
            account = self.account(old)
            assert account is not None
            del self._accounts[old.lower()]
            (self.root / account.name).mkdir(parents=True, exist_ok=True)
            (self.root / account.name).rename(self.root / new)
            account.name = new
            self._accounts[new.lower()] = account
            self._account_redirects[old.lower()] = account.id
            if old.lower() == self.user.lower():
                self.user = new

    def heads(self, repo: Repo) -> dict[str, str]:
        out = subprocess.run(["git", "--git-dir", str(self._path(repo)), "for-each-ref",
                              "--format=%(refname:strip=2) %(objectname)", "refs/heads"],
                             capture_output=True, text=True, check=True).stdout
        return dict(line.split(" ", 1) for line in out.splitlines())

    @property
    def descriptions(self) -> dict[str, str]:
        return {r.full_name: r.description for r in self._repos.values()}

    @property
    def topics(self) -> dict[str, list[str]]:
        return {r.full_name: list(r.topics) for r in self._repos.values()}

    # --- JSON as Gitea answers it (tests/support/gitea_spec) ------------------------------------

    def user_json(self, account: Account) -> dict:
        me = self.me
        # Gitea shows an address to a site admin and to its owner; others see a placeholder.
        email = account.email if me.admin or account is me else f"{account.name}@noreply.localhost"
        return {"id": account.id, "login": account.name, "login_name": "", "source_id": 0,
                "full_name": "", "email": email, "avatar_url": f"{self.url}/avatars/{account.id}",
                "language": "", "is_admin": account.admin, "last_login": CREATED,
                "created": CREATED, "restricted": False, "active": True, "prohibit_login": False,
                "location": "", "website": "", "description": "",
                "visibility": account.visibility, "followers_count": 0, "following_count": 0,
                "starred_repos_count": 0}

    def org_json(self, account: Account) -> dict:
        return {"id": account.id, "name": account.name, "username": account.name,
                "full_name": "", "email": "", "avatar_url": f"{self.url}/avatars/{account.id}",
                "description": "", "website": "", "location": "",
                "visibility": account.visibility, "repo_admin_change_team_access": False}

    def repo_json(self, repo: Repo) -> dict:
        full = repo.full_name
        return {"id": repo.id, "owner": self.user_json(repo.owner), "name": repo.name,
                "full_name": full, "description": repo.description,
                "empty": not self.heads(repo), "private": repo.private, "fork": False,
                "template": False, "mirror": False, "size": 0, "language": "",
                "languages_url": f"{self.url}/api/v1/repos/{full}/languages",
                "html_url": f"{self.url}/{full}", "url": f"{self.url}/api/v1/repos/{full}",
                "link": "", "ssh_url": f"git@localhost:{full}.git",
                "clone_url": f"{self.url}/{full}.git", "original_url": "", "website": "",
                "stars_count": 0, "forks_count": 0, "watchers_count": 0,
                "open_issues_count": 0, "open_pr_counter": 0, "release_counter": 0,
                "default_branch": repo.default_branch, "archived": False,
                "created_at": CREATED, "updated_at": CREATED, "archived_at": "1970-01-01T00:00:00Z",
                "permissions": {"admin": True, "push": True, "pull": True},
                "has_issues": True, "has_wiki": True, "has_pull_requests": True,
                "has_projects": True, "has_releases": True, "has_packages": True,
                "has_actions": False, "ignore_whitespace_conflicts": False,
                "allow_merge_commits": True, "allow_rebase": True, "allow_rebase_explicit": True,
                "allow_squash_merge": True, "allow_fast_forward_only_merge": True,
                "allow_rebase_update": True, "default_delete_branch_after_merge": False,
                "default_merge_style": "merge", "default_allow_maintainer_edit": False,
                "avatar_url": "", "internal": False, "mirror_interval": "",
                "object_format_name": "sha1", "projects_mode": "all"}

    def branch_json(self, repo: Repo, branch: str, sha: str) -> dict:
        message, name, email, when = subprocess.run(
            ["git", "--git-dir", str(self._path(repo)), "log", "-1", "--format=%B%x00%an%x00%ae%x00%aI",
             sha], capture_output=True, text=True, check=True).stdout.split("\0")
        person = {"name": name, "email": email, "username": ""}
        return {"name": branch,
                "commit": {"id": sha, "message": message, "url": f"{self.url}/{repo.full_name}/commit/{sha}",
                           "author": person, "committer": person, "timestamp": when.strip()},
                "protected": False, "required_approvals": 0, "enable_status_check": False,
                "status_check_contexts": [], "user_can_push": True, "user_can_merge": True,
                "effective_branch_protection_name": ""}

    def status_json(self, repo: Repo, sha: str, posted: dict) -> dict:
        return {"id": posted["id"], "status": posted["state"],
                "target_url": posted.get("target_url", ""),
                "description": posted.get("description", ""),
                "url": f"{self.url}/api/v1/repos/{repo.full_name}/statuses/{sha}",
                "context": posted.get("context", ""), "creator": self.user_json(self.me),
                "created_at": CREATED, "updated_at": CREATED}

    def has_scope(self, level: str, category: str) -> bool:
        """Gitea's AccessTokenScope.HasScope: "all", or the category at this level or write."""
        return bool({"all", f"write:{category}", f"{level}:{category}"} & self.scopes)


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeGitea/1.22"
    gitea: FakeGitea  # set on the subclass made per server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    # --- plumbing -------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json",
              extra: dict[str, str] | None = None) -> None:
        parsed = None
        if body and content_type.startswith("application/json"):
            parsed = json.loads(body)
        self.gitea.responses.append(RecordedResponse(self.command, self.path, status, parsed))
        self.send_response(status)
        if body or status not in (204, 304):
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, status: int, obj: object) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, **more: object) -> None:
        # Gitea's APIContext.Error: {"message", "url"}; NotFound adds "errors".
        self._json(status, {"message": message, "url": f"{self.gitea.url}{SWAGGER}", **more})

    def _not_found(self, *errors: str, message: str = "The target couldn't be found.") -> None:
        self._error(404, message, errors=list(errors))

    def _redirect(self, location: str) -> None:
        # Gitea's RedirectToRepo / RedirectToUser: 307 to a path under the same site.
        self._send(307, b"", "text/html", extra={"Location": location})

    def _handle(self) -> None:
        g = self.gitea
        body = self._body()
        g.requests.append(RecordedRequest(self.command, self.path, dict(self.headers.items()), body))
        if g._take_failure():
            return self._json(500, {"message": "injected failure"})
        if self.headers.get("Authorization") != f"token {g.token}":
            return self._send(401, json.dumps({"message": "token is required",
                                               "url": f"{g.url}{SWAGGER}"}).encode(),
                              extra={"WWW-Authenticate": 'Basic realm="Gitea"'})
        if g.forbid:
            return self._error(403, "token does not have at least one of required scope(s), "
                                    "required=[write:repository], token scope=read:user")
        split = urlsplit(self.path)
        if split.path.startswith("/api/v1/"):
            return self._api(split.path[len("/api/v1"):], parse_qs(split.query), body)
        match = _GIT_PATH.match(split.path)
        if match:
            return self._git(unquote(match["owner"]), unquote(match["repo"]), match["rest"],
                             split.query, body)
        self._not_found()

    # --- the API --------------------------------------------------------------------

    def _scoped(self, *categories: str) -> bool:
        """Gitea's tokenRequiresScopes: read for GET, write otherwise. False (and a 403
        answered) when the token lacks one."""
        g = self.gitea
        level = "read" if self.command in ("GET", "HEAD") else "write"
        for category in categories:
            if not g.has_scope(level, category):
                self._error(403, "token does not have at least one of required scope(s), "
                                 f"required=[{level}:{category}], token scope={','.join(sorted(g.scopes))}")
                return False
        return True

    def _site_admin(self) -> bool:
        if not self.gitea.me.admin:
            self._error(403, "user should be the site admin")
            return False
        return True

    def _api(self, path: str, query: dict[str, list[str]], raw: bytes) -> None:
        g, method = self.gitea, self.command
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return self._error(422, "invalid JSON body")
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts == ["user"] and method == "GET":
            return self._scoped("user") and self._json(200, g.user_json(g.me))
        if parts == ["user", "repos"] and method == "POST":
            return self._scoped("user", "repository") and self._create_repo(g.me, body)
        if parts == ["users", "search"] and method == "GET":
            return self._scoped("user") and self._search_users(query.get("q", [""])[0])
        if len(parts) == 2 and parts[0] == "users" and method == "GET":
            if not self._scoped("user"):
                return
            # Users and organisations share Gitea's user table: either answers here.
            account = self._account_or_redirect(parts[1], "/api/v1/users/{}")
            if account:
                return self._json(200, g.user_json(account))
            return None if account is False else self._not_found(
                f"user redirect does not exist [name: {parts[1].lower()}]", message="GetUserByName")
        if parts == ["admin", "users"] and method == "POST":
            return self._scoped("admin") and self._site_admin() and self._create_user(body)
        if len(parts) == 4 and parts[:2] == ["admin", "users"] and parts[3] == "repos" and method == "POST":
            if not (self._scoped("admin") and self._site_admin()):
                return
            account = g.account(parts[2])
            if account is None or account.kind != "user":
                return self._not_found(f"user does not exist [uid: 0, name: {parts[2]}]")
            return self._create_repo(account, body)
        if parts == ["orgs"] and method == "POST":
            return self._scoped("organization") and self._create_org(body)
        if len(parts) in (2, 3) and parts[0] == "orgs":
            if not self._scoped("organization"):
                return
            account = self._account_or_redirect(parts[1], "/api/v1/orgs/{}" + ("/repos" if len(parts) == 3 else ""))
            if account is False:
                return
            if account is None or account.kind != "org":
                return self._not_found(f"org does not exist [id: 0, name: {parts[1]}]",
                                       message="GetOrgByName")
            if len(parts) == 2 and method == "GET":
                return self._json(200, g.org_json(account))
            if len(parts) == 3 and parts[2] == "repos" and method == "POST":
                return self._create_repo(account, body)
        if len(parts) >= 3 and parts[0] == "repos":
            if not self._scoped("repository"):
                return
            return self._repo_api(parts[1], parts[2], parts[3:], query, body)
        self._not_found()

    def _account_or_redirect(self, name: str, template: str) -> Account | None | Literal[False]:
        """The account; None when there is none; False when a redirect was answered."""
        g = self.gitea
        account = g.account(name)
        if account is None and name.lower() in g._account_redirects:
            moved = next(a for a in g._accounts.values() if a.id == g._account_redirects[name.lower()])
            self._redirect(template.format(quote(moved.name)))
            return False
        return account

    def _search_users(self, keyword: str) -> None:
        g = self.gitea
        keyword = keyword.lower()
        found = []
        for account in g._accounts.values():
            if account.kind != "user":
                continue
            # Gitea's SearchUsers: by name; by e-mail only where the doer may see it.
            by_email = g.me.admin or account is g.me
            if keyword in account.name.lower() or (by_email and keyword in account.email.lower()):
                found.append(g.user_json(account))
        self._json(200, {"ok": True, "data": found})

    def _create_user(self, body: dict) -> None:
        g = self.gitea
        name, email = str(body.get("username", "")), str(body.get("email", ""))
        if not name or not email:
            return self._error(422, "[Username]: Required" if not name else "[Email]: Required")
        if not VALID_USERNAME.match(name):
            return self._error(422, f"User name is invalid [{name}]: must be valid alpha or numeric or dash(-_) or dot characters")
        if problem := _reserved(name, RESERVED_USER_NAMES, RESERVED_USER_PATTERNS):
            return self._error(422, problem)
        if g.account(name):
            return self._error(422, f"user already exists [name: {name}]")
        if any(a.email.lower() == email.lower() for a in g._accounts.values()):
            return self._error(422, f"e-mail already in use [email: {email}]")
        if len(str(body.get("password", ""))) < 8:
            return self._error(400, "PasswordIsRequired")
        account = g.add_account(name, "user", email=email)
        self._json(201, g.user_json(account))

    def _create_org(self, body: dict) -> None:
        g = self.gitea
        name = str(body.get("username", ""))
        if not VALID_USERNAME.match(name):
            return self._error(422, "[UserName]: Username should contain only alphanumeric, dash ('-'), underscore ('_') and dot ('.') characters.")
        if problem := _reserved(name, RESERVED_USER_NAMES, RESERVED_USER_PATTERNS):
            return self._error(422, problem)
        if g.account(name):
            return self._error(422, f"user already exists [name: {name}]")
        account = g.add_account(name, "org")
        account.visibility = str(body.get("visibility") or "public")
        self._json(201, g.org_json(account))

    def _create_repo(self, owner: Account, body: dict) -> None:
        g = self.gitea
        name = str(body.get("name", ""))
        if not name:
            return self._error(422, "[Name]: Required")
        if not ALPHA_DASH_DOT.match(name):
            return self._error(422, "[Name]: AlphaDashDot")
        if len(name) > 100:
            return self._error(422, "[Name]: MaxSize")
        if problem := _reserved(name, RESERVED_REPO_NAMES, RESERVED_REPO_PATTERNS):
            return self._error(422, problem)
        if g.repo(owner.name, name):
            return self._error(409, "The repository with the same name already exists.")
        repo = g.create_repo(owner.name, name, str(body.get("description", "")),
                             default_branch=body.get("default_branch") or None,
                             private=bool(body.get("private", False)))
        self._json(201, g.repo_json(repo))

    def _repo_api(self, owner_name: str, name: str, rest: list[str], query: dict[str, list[str]],
                  body: dict) -> None:
        g, method = self.gitea, self.command
        if f"{owner_name}/{name}".lower() in {k.lower(): v for k, v in g.api_elsewhere.items()}:
            base = {k.lower(): v for k, v in g.api_elsewhere.items()}[f"{owner_name}/{name}".lower()]
            return self._redirect(base.rstrip("/") + self.path)
        repo = self._repo_or_redirect(owner_name, name, "/api/v1/repos/{}/{}" +
                                      "".join(f"/{quote(p, safe='')}" for p in rest))
        if repo is False:
            return
        if repo is None:
            return self._not_found()
        if method == "GET" and not rest:
            return self._json(200, g.repo_json(repo))
        if method == "PATCH" and not rest:
            # Gitea's repo.Edit (routers/api/v1/repo/repo.go updateBasicProperties): a new
            # name is checked as at creation; a taken one is 422; the old name redirects.
            new = body.get("name")
            if new is not None and str(new).lower() != repo.name.lower():
                new = str(new)
                if not ALPHA_DASH_DOT.match(new) or len(new) > 100:
                    return self._error(422, "[Name]: AlphaDashDot" if len(new) <= 100 else "[Name]: MaxSize")
                if problem := _reserved(new, RESERVED_REPO_NAMES, RESERVED_REPO_PATTERNS):
                    return self._error(422, problem)
                if g.repo(repo.owner.name, new):
                    return self._error(422, f"repo name is already taken [name: {new}]")
                g.rename_repo(repo.owner.name, repo.name, new)
            return self._json(200, g.repo_json(repo))
        if method == "GET" and len(rest) == 2 and rest[0] == "branches":
            sha = g.heads(repo).get(rest[1])
            if sha is None:
                return self._not_found(f"branch does not exist [name: {rest[1]}]")
            return self._json(200, g.branch_json(repo, rest[1], sha))
        if rest == ["topics"] and method == "GET":
            return self._json(200, {"topics": list(repo.topics)})
        if rest == ["topics"] and method == "PUT":
            topics = [str(t).strip().lower() for t in body.get("topics") or []]
            invalid = [t for t in topics if not VALID_TOPIC.match(t) or len(t) > 35]
            if invalid:
                return self._json(422, {"invalidTopics": invalid, "message": "Topic names are invalid"})
            if len(set(topics)) > 25:
                return self._json(422, {"invalidTopics": None, "message": "Exceeding maximum number of topics per repo"})
            repo.topics = sorted(set(topics))
            return self._send(204)
        if len(rest) == 2 and rest[0] == "topics" and method == "PUT":
            topic = rest[1].strip().lower()
            if not VALID_TOPIC.match(topic) or len(topic) > 35:
                return self._json(422, {"invalidTopics": [topic], "message": "Topic names are invalid"})
            if topic not in repo.topics and len(repo.topics) >= 25:
                return self._json(422, {"message": "Exceeding maximum allowed topics per repo."})
            repo.topics = sorted(set(repo.topics) | {topic})
            return self._send(204)
        if len(rest) == 2 and rest[0] == "statuses" and re.fullmatch(r"[0-9a-f]{40}", rest[1]):
            key = f"{repo.full_name}@{rest[1]}"
            if method == "POST":
                if body.get("state") not in ("success", "failure", "error", "pending", "warning"):
                    return self._error(400, f"invalid state {body.get('state')!r}")
                posted = {"id": len(g.statuses.get(key, [])) + 1, **body}
                g.statuses.setdefault(key, []).append(posted)
                return self._json(201, g.status_json(repo, rest[1], posted))
            return self._json(200, [g.status_json(repo, rest[1], s)
                                    for s in reversed(g.statuses.get(key, []))])
        if method == "GET" and rest == ["commits"]:
            limit = int(query.get("limit", ["30"])[0])
            log = subprocess.run(
                ["git", "--git-dir", str(g._path(repo)), "log", f"-{limit}",
                 "--format=%H%x00%s", repo.default_branch], capture_output=True, text=True)
            if log.returncode:
                return self._error(409, "Git Repository is empty.")
            commits = [line.split("\0") for line in log.stdout.splitlines()]
            return self._json(200, [{"sha": sha, "url": f"{g.url}/api/v1/repos/{repo.full_name}/git/commits/{sha}",
                                     "html_url": f"{g.url}/{repo.full_name}/commit/{sha}",
                                     "commit": {"message": message}} for sha, message in commits])
        self._not_found()

    def _repo_or_redirect(self, owner_name: str, name: str, template: str) -> Repo | None | Literal[False]:
        """The repository; None when there is none; False when a redirect was answered
        (Gitea's repoAssignment: a renamed owner first, then a renamed repository)."""
        g = self.gitea
        owner = g.account(owner_name)
        if owner is None and owner_name.lower() in g._account_redirects:
            moved = next(a for a in g._accounts.values() if a.id == g._account_redirects[owner_name.lower()])
            self._redirect(template.format(quote(moved.name), quote(name)))
            return False
        if owner is None:
            return None
        repo = g._repos.get((owner.id, name.lower()))
        if repo is None and (owner.id, name.lower()) in g._repo_redirects:
            moved = next(r for r in g._repos.values() if r.id == g._repo_redirects[(owner.id, name.lower())])
            self._redirect(template.format(quote(moved.owner.name), quote(moved.name)))
            return False
        return repo

    # --- git smart HTTP -------------------------------------------------------------

    def _git(self, owner: str, name: str, rest: str, query: str, body: bytes) -> None:
        g = self.gitea
        elsewhere = {k.lower(): v for k, v in g.git_elsewhere.items()}.get(f"{owner}/{name}".lower())
        if elsewhere:
            return self._redirect(elsewhere.rstrip("/") + self.path)
        suffix = f"{rest}?{query}" if query else rest
        repo = self._repo_or_redirect(owner, name, "/{}/{}.git" + suffix.replace("{", "{{").replace("}", "}}"))
        if repo is False:
            return
        if repo is None:
            return self._send(404, b"Repository not found\n", "text/plain")
        if g.reject_git:
            return self._send(401, b"Unauthorized\n", "text/plain",
                              extra={"WWW-Authenticate": 'Basic realm="Gitea"'})
        pushing = "git-receive-pack" in rest or "service=git-receive-pack" in query
        if not g.has_scope("write" if pushing else "read", "repository"):
            return self._send(403, b"User permission denied\n", "text/plain")
        before = g.heads(repo) if pushing else {}
        env = {
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "GIT_PROJECT_ROOT": str(g.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": f"/{repo.owner.name}/{repo.name}.git{rest}",
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": g.user,
            "REMOTE_ADDR": self.client_address[0],
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(g.root),
        }
        if encoding := self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = encoding
        if protocol := self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = protocol
        result = subprocess.run(["git", "http-backend"], input=body, env=env,
                                capture_output=True, timeout=120)
        if pushing and self.command == "POST" and not before:
            # Gitea (services/repository/push.go): the first branch pushed into an empty
            # repository becomes its default branch.
            after = g.heads(repo)
            if after and repo.default_branch not in after:
                repo.default_branch = sorted(after)[0]
                subprocess.run(["git", "--git-dir", str(g._path(repo)), "symbolic-ref", "HEAD",
                                f"refs/heads/{repo.default_branch}"], check=True)
        head, _, payload = result.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = result.stdout.partition(b"\n\n")
        status, headers = 200, {}
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers[key.strip()] = value.strip()
        content_type = headers.pop("Content-Type", "application/octet-stream")
        self._send(status, payload, content_type, headers)


@contextlib.contextmanager
def start_gitea(tmp_path: Path, token: str = "s3cret-token-for-tests", **options) -> Iterator[FakeGitea]:
    """A running fake Gitea on 127.0.0.1 with its repositories under tmp_path."""
    root = tmp_path / "gitea-repos"
    root.mkdir(parents=True, exist_ok=True)
    gitea = FakeGitea(root=root, token=token, **options)
    handler = type("Handler", (_Handler,), {"gitea": gitea})
    server = StandInHTTPServer(("127.0.0.1", 0), handler)
    gitea.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield gitea
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def start_recorder(host: str = "127.0.0.1") -> Iterator[tuple[str, list[RecordedRequest]]]:
    """Another host: a server that records every request and answers 404, for tests that a
    redirect off Gitea carries no token. Yields (its base URL, its requests)."""
    seen: list[RecordedRequest] = []

    class Recorder(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen.append(RecordedRequest(self.command, self.path, dict(self.headers.items()),
                                        self.rfile.read(length) if length else b""))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = _any

    server = StandInHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
