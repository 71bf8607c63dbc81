"""A real HTTP server that speaks enough of Gitea for vmd's close path.

`/api/v1`: GET /user; GET /repos/{o}/{r}; POST /user/repos, /orgs/{org}/repos,
/admin/users/{u}/repos (409 when the repository exists); PUT /repos/{o}/{r}/topics;
POST and GET /repos/{o}/{r}/statuses/{sha}; GET /repos/{o}/{r}/commits?limit=N.
Git's smart HTTP on /{o}/{r}.git/… through `git http-backend` as CGI, so a push lands in
a real bare repository. Every request (API and git) must carry `Authorization: token
<TOKEN>`; every request's method, path and headers are recorded so tests can check
where the token went. `fail_next(n)` answers the next n requests with 500, `forbid =
True` answers 403, `reject_git = True` answers git with 401.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

_REPO = r"(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+?)"
_GIT_PATH = re.compile(rf"^/{_REPO}\.git(?P<rest>/.*)$")


@dataclass
class RecordedRequest:
    method: str
    path: str  # as sent, query included
    headers: dict[str, str]


@dataclass
class FakeGitea:
    root: Path
    token: str
    user: str = "alice"
    orgs: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)  # other users, reachable by an admin
    admin: bool = False
    url: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    descriptions: dict[str, str] = field(default_factory=dict)
    topics: dict[str, list[str]] = field(default_factory=dict)
    statuses: dict[str, list[dict]] = field(default_factory=dict)  # "o/r@sha" -> statuses
    forbid: bool = False
    reject_git: bool = False  # answer git's smart HTTP with 401, as for a revoked token
    _fail: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

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

    def repo_path(self, owner: str, name: str) -> Path:
        return self.root / owner / f"{name}.git"

    def create_repo(self, owner: str, name: str, description: str = "") -> None:
        path = self.repo_path(owner, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
        subprocess.run(["git", "--git-dir", str(path), "config", "http.receivepack", "true"],
                       check=True)
        self.descriptions[f"{owner}/{name}"] = description

    def repo_json(self, owner: str, name: str) -> dict:
        path = self.repo_path(owner, name)
        heads = subprocess.run(["git", "--git-dir", str(path), "for-each-ref", "refs/heads"],
                               capture_output=True, text=True, check=True).stdout
        full = f"{owner}/{name}"
        return {"id": abs(hash(full)) % 10**6, "name": name, "full_name": full,
                "owner": {"login": owner}, "description": self.descriptions.get(full, ""),
                "empty": not heads.strip(), "private": False, "default_branch": "main",
                "clone_url": f"{self.url}/{full}.git", "html_url": f"{self.url}/{full}",
                "ssh_url": f"git@localhost:{full}.git", "topics": self.topics.get(full, [])}


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeGitea/1.0"
    gitea: FakeGitea  # set on the subclass made per server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
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

    def _handle(self) -> None:
        g = self.gitea
        g.requests.append(RecordedRequest(self.command, self.path, dict(self.headers.items())))
        body = self._body()
        if g._take_failure():
            return self._json(500, {"message": "injected failure"})
        if self.headers.get("Authorization") != f"token {g.token}":
            return self._send(401, json.dumps({"message": "token is required"}).encode(),
                              extra={"WWW-Authenticate": 'Basic realm="Gitea"'})
        if g.forbid:
            return self._json(403, {"message": "token does not have at least one of "
                                               "required scope(s): [write:repository]"})
        split = urlsplit(self.path)
        if split.path.startswith("/api/v1/"):
            return self._api(split.path[len("/api/v1"):], parse_qs(split.query), body)
        match = _GIT_PATH.match(split.path)
        if match and g.reject_git:
            return self._send(401, b"Unauthorized\n", "text/plain",
                              extra={"WWW-Authenticate": 'Basic realm="Gitea"'})
        if match:
            return self._git(match["owner"], match["repo"], match["rest"], split.query, body)
        self._json(404, {"message": "not found"})

    # --- the API --------------------------------------------------------------------

    def _api(self, path: str, query: dict[str, list[str]], raw: bytes) -> None:
        g, method = self.gitea, self.command
        body = json.loads(raw) if raw else {}
        if method == "GET" and path == "/user":
            return self._json(200, {"id": 1, "login": g.user, "is_admin": g.admin})
        if method == "POST" and path == "/user/repos":
            return self._create(g.user, body)
        if m := re.fullmatch(r"/orgs/([\w.-]+)/repos", path):
            if method == "POST":
                if m[1] not in g.orgs:
                    return self._json(404, {"message": "GetOrgByName"})
                return self._create(m[1], body)
        if m := re.fullmatch(r"/admin/users/([\w.-]+)/repos", path):
            if method == "POST":
                if not g.admin:
                    return self._json(403, {"message": "reqSiteAdmin"})
                if m[1] not in g.users | {g.user}:
                    return self._json(404, {"message": "user does not exist"})
                return self._create(m[1], body)
        m = re.fullmatch(rf"/repos/{_REPO}(?P<rest>/.*)?", path)
        if not m:
            return self._json(404, {"message": "not found"})
        owner, repo, rest = m["owner"], m["repo"], m["rest"] or ""
        full = f"{owner}/{repo}"
        if not g.repo_path(owner, repo).exists():
            return self._json(404, {"message": "The target couldn't be found."})
        if method == "GET" and rest == "":
            return self._json(200, g.repo_json(owner, repo))
        if method == "PUT" and rest == "/topics":
            g.topics[full] = list(body.get("topics", []))
            return self._send(204)
        if s := re.fullmatch(r"/statuses/([0-9a-f]{40})", rest):
            key = f"{full}@{s[1]}"
            if method == "POST":
                if body.get("state") not in ("success", "failure", "error", "pending", "warning"):
                    return self._json(422, {"message": "invalid state"})
                status = {"id": len(g.statuses.get(key, [])) + 1, **body}
                g.statuses.setdefault(key, []).append(status)
                return self._json(201, status)
            return self._json(200, list(reversed(g.statuses.get(key, []))))
        if method == "GET" and rest == "/commits":
            limit = int(query.get("limit", ["30"])[0])
            log = subprocess.run(
                ["git", "--git-dir", str(g.repo_path(owner, repo)), "log", f"-{limit}",
                 "--format=%H%x00%s", "main"], capture_output=True, text=True)
            if log.returncode:
                return self._json(409, {"message": "Git Repository is empty."})
            commits = [dict(zip(("sha", "message"), line.split("\0")))
                       for line in log.stdout.splitlines()]
            return self._json(200, [{"sha": c["sha"], "commit": {"message": c["message"]}}
                                    for c in commits])
        self._json(404, {"message": "not found"})

    def _create(self, owner: str, body: dict) -> None:
        g = self.gitea
        name = body.get("name", "")
        if not re.fullmatch(r"[\w.-]+", name):
            return self._json(422, {"message": "invalid repository name"})
        if g.repo_path(owner, name).exists():
            return self._json(409, {"message": "The repository with the same name already exists."})
        g.create_repo(owner, name, body.get("description", ""))
        self._json(201, g.repo_json(owner, name))

    # --- git smart HTTP -------------------------------------------------------------

    def _git(self, owner: str, repo: str, rest: str, query: str, body: bytes) -> None:
        g = self.gitea
        if not g.repo_path(owner, repo).exists():
            return self._send(404, b"Repository not found\n", "text/plain")
        env = {
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "GIT_PROJECT_ROOT": str(g.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": f"/{owner}/{repo}.git{rest}",
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
    gitea = FakeGitea(root=tmp_path / "gitea-repos", token=token, **options)
    gitea.root.mkdir(parents=True, exist_ok=True)
    handler = type("Handler", (_Handler,), {"gitea": gitea})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    gitea.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield gitea
    finally:
        server.shutdown()
        server.server_close()
