"""A small client for Gitea's REST API (`/api/v1`): the repository, its owner (an
organisation or a user), its topics, its branches and the commit status that carries vmd's
verification.

Plain sync httpx. The token travels only in the `Authorization: token …` header, only to
the configured Gitea, and never appears in an error message. 5xx answers and connection
errors are retried with exponential backoff, because a Gitea that restarts (or a proxy in
front of it) answers 502/503 for a few seconds; auth errors are not retried, they need a
person.

Gitea answers a renamed user or repository with a redirect (307, to the new name under the
same site). Redirects are followed by hand, and only within the configured Gitea's scheme,
host, port and API path: httpx would send the client's headers, token included, wherever a
Location pointed.
"""

from __future__ import annotations

import time
from typing import Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, SecretStr

from vmd.errors import WordedError

# Gitea's commit status states (its API: pending, success, error, failure, warning).
StatusState = Literal["success", "failure", "error", "pending", "warning"]

# Gitea stores a status description in a VARCHAR(255) column; longer ones are refused.
STATUS_DESCRIPTION_MAX = 255
# A rename answers one redirect; a chain this long is a loop or a misconfigured proxy.
MAX_REDIRECTS = 5
_REDIRECTS = {301, 302, 303, 307, 308}


class GiteaError(WordedError):
    """Gitea answered, but not with what was asked for."""


class GiteaAuthError(GiteaError):
    """Gitea refused the token (401) or its scope (403)."""


class GiteaUnavailable(GiteaError):
    """Gitea could not be reached, or kept answering 5xx after every retry."""


class RepoInfo(BaseModel):
    full_name: str
    clone_url: str
    html_url: str
    default_branch: str = "main"
    empty: bool = True
    private: bool = False

    @property
    def owner(self) -> str:
        return self.full_name.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.full_name.split("/", 1)[1]


class GiteaClient:
    """`GiteaClient(base_url, token)`; use as a context manager or call `close()`.

    `retries` is the number of tries in all (not extra tries); `backoff` the first
    wait in seconds, doubled after each failed try.
    """

    def __init__(
        self,
        base_url: str,
        token: str | SecretStr,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self._token = secret
        self.retries = max(1, retries)
        self.backoff = backoff
        self._api = httpx.URL(f"{self.base_url}/api/v1/")
        self._http = httpx.Client(
            base_url=f"{self.base_url}/api/v1",
            headers={"Authorization": f"token {secret}", "Accept": "application/json"},
            timeout=timeout,
            follow_redirects=False,
        )
        self._login: str | None = None

    def __enter__(self) -> GiteaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- the verbs ------------------------------------------------------------------

    def current_user(self) -> str:
        """The login of the token's user."""
        if self._login is None:
            self._login = str(self._request("GET", "/user", what="read the token's user").json()["login"])
        return self._login

    def get_repo(self, owner: str, name: str) -> RepoInfo | None:
        """The repository, or None when it does not exist. A renamed repository (or owner)
        is followed: the answer's `full_name` is its name now."""
        response = self._request("GET", f"/repos/{_seg(owner)}/{_seg(name)}", ok_missing=True,
                                 what=f"read the repository {owner}/{name}")
        return None if response.status_code == 404 else _repo_info(response)

    def ensure_repo(self, owner: str, name: str, description: str = "", private: bool = True,
                    kind: Literal["org", "owner"] = "owner") -> RepoInfo:
        """The repository `owner/name`, created (empty, private unless told otherwise) when
        missing. An empty `owner` means the token's user. `kind="org"`: the owner is known to
        be an organisation; "owner": a user or an organisation, tried in that order."""
        owner = owner or self.current_user()
        existing = self.get_repo(owner, name)
        if existing is not None:
            return existing
        # No default_branch: Gitea then uses its own DEFAULT_BRANCH setting (service/repository
        # create.go), and the first push goes to that branch (publish._target_branch).
        body = {"name": name, "description": description[:2048], "private": private,
                "auto_init": False}
        what = f"create the repository {owner}/{name}"
        if kind == "owner" and owner.lower() == self.current_user().lower():  # Gitea's names ignore case
            response = self._request("POST", "/user/repos", json=body, what=what, ok={409})
        else:
            # An organisation first; a 404 there means no such organisation, so the owner
            # may be another user, which only a site admin may create repositories for.
            response = self._request("POST", f"/orgs/{_seg(owner)}/repos", json=body, what=what,
                                     ok={404, 409})
            if response.status_code == 404 and kind == "org":
                raise GiteaError(f"Gitea has no organisation named {owner!r}, so {owner}/{name} "
                                 "cannot be created; create it in Gitea or set GITEA_ORG.")
            if response.status_code == 404:
                response = self._request("POST", f"/admin/users/{_seg(owner)}/repos", json=body,
                                         what=what, ok={404, 409})
                if response.status_code == 404:
                    raise GiteaError(
                        f"Gitea has no user or organisation named {owner!r}, so {owner}/{name} "
                        "cannot be created; create that owner in Gitea or use another owner.")
        if response.status_code == 409:  # created meanwhile, or a name clash: it exists
            existing = self.get_repo(owner, name)
            if existing is None:
                raise GiteaError(f"Gitea said {owner}/{name} already exists (409) but then "
                                 "did not return it; check the repository in Gitea.")
            return existing
        return _repo_info(response)

    def branch_exists(self, owner: str, repo: str, branch: str) -> bool:
        response = self._request("GET", f"/repos/{_seg(owner)}/{_seg(repo)}/branches/{_seg(branch)}",
                                 ok_missing=True, what=f"read the branch {branch} of {owner}/{repo}")
        return response.status_code != 404

    def get_org(self, name: str) -> str | None:
        """The organisation's name as Gitea spells it, or None when there is none."""
        response = self._request("GET", f"/orgs/{_seg(name)}", ok_missing=True,
                                 what=f"read the organisation {name}")
        if response.status_code == 404:
            return None
        body = response.json()
        return str(body.get("name") or body.get("username") or name)

    def create_org(self, name: str, description: str = "Projects built by vmagent") -> str:
        """Create a private organisation (the token's user becomes its owner); its name."""
        response = self._request("POST", "/orgs", what=f"create the organisation {name}", ok={422},
                                 json={"username": name, "visibility": "private",
                                       "description": description})
        if response.status_code == 422:
            if self.get_org(name) is not None:  # created meanwhile
                return str(self.get_org(name))
            raise GiteaError(
                f"Gitea refused to create the organisation {name!r}: {self._message(response)}. "
                "A user may already have that name (users and organisations share one "
                "namespace); set GITEA_ORG to another name, or create the organisation in Gitea.")
        body = response.json()
        return str(body.get("name") or body.get("username") or name)

    def find_user_by_email(self, email: str) -> str | None:
        """The login of the user with this e-mail, or None. Gitea shows a user's address to
        a site admin and to everybody when the user made it public, so a non-admin token
        finds only those."""
        response = self._request("GET", f"/users/search?q={quote(email, safe='')}&limit=50",
                                 what=f"look up the Gitea user of {email}")
        for user in response.json().get("data") or []:
            if str(user.get("email", "")).lower() == email.lower():
                return str(user["login"])
        return None

    def create_user(self, username: str, email: str, password: str) -> str | None:
        """Create a user (a site admin's token); its login, or None when the name is taken."""
        response = self._request(
            "POST", "/admin/users", what=f"create a Gitea user for {email}", ok={422},
            json={"username": username, "email": email, "password": password,
                  "must_change_password": True, "send_notify": False})
        if response.status_code == 422:
            message = self._message(response)
            if "user already exists" in message:
                return None
            raise GiteaError(f"Gitea refused to create the user {username!r} for {email}: {message}.")
        return str(response.json()["login"])

    def set_topics(self, owner: str, repo: str, topics: list[str]) -> None:
        """Replace the repository's topics."""
        self._request("PUT", f"/repos/{_seg(owner)}/{_seg(repo)}/topics", json={"topics": topics},
                      what=f"set the topics of {owner}/{repo}")

    def get_topics(self, owner: str, repo: str) -> list[str]:
        response = self._request("GET", f"/repos/{_seg(owner)}/{_seg(repo)}/topics",
                                 what=f"read the topics of {owner}/{repo}")
        return [str(t) for t in response.json().get("topics") or []]

    def rename_repo(self, owner: str, repo: str, new_name: str) -> RepoInfo:
        """Gitea's repository edit (PATCH, EditRepoOption `name`); the old name then answers
        with a redirect to the new one."""
        response = self._request("PATCH", f"/repos/{_seg(owner)}/{_seg(repo)}", json={"name": new_name},
                                 what=f"rename the repository {owner}/{repo} to {new_name}")
        return _repo_info(response)

    def add_topic(self, owner: str, repo: str, topic: str) -> None:
        """Add one topic, keeping those a person gave the repository."""
        self._request("PUT", f"/repos/{_seg(owner)}/{_seg(repo)}/topics/{_seg(topic)}",
                      what=f"add the topic {topic} to {owner}/{repo}")

    def set_commit_status(
        self,
        owner: str,
        repo: str,
        sha: str,
        state: StatusState,
        description: str,
        context: str = "vmagent/verification",
        target_url: str | None = None,
    ) -> None:
        body: dict[str, str] = {"state": state, "context": context,
                                "description": description[:STATUS_DESCRIPTION_MAX]}
        if target_url:
            body["target_url"] = target_url
        self._request("POST", f"/repos/{_seg(owner)}/{_seg(repo)}/statuses/{sha}", json=body,
                      what=f"set the commit status of {owner}/{repo}@{sha[:12]}")

    # --- transport ------------------------------------------------------------------

    def _request(self, method: str, path: str, *, what: str, json: object = None,
                 ok: set[int] = frozenset(), ok_missing: bool = False) -> httpx.Response:
        """One API call with retries. Returns 2xx answers and those in `ok` (and 404
        with `ok_missing`); raises a GiteaError subclass with a sentence otherwise."""
        accepted = set(ok) | ({404} if ok_missing else set())
        last_problem = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._send(method, path, json, what)
            except httpx.TransportError as exc:
                last_problem = f"{type(exc).__name__}: {self._redact(str(exc))}"
                continue
            if response.status_code >= 500:
                last_problem = f"HTTP {response.status_code} {self._message(response)}".strip()
                continue
            if response.is_success or response.status_code in accepted:
                return response
            raise self._error_for(response, what)
        raise GiteaUnavailable(
            f"Gitea at {self.base_url} could not {what} after {self.retries} tries "
            f"({last_problem}); check that Gitea is running and reachable from vmd, then "
            "close the session again to retry the push.")

    def _send(self, method: str, path: str, json: object, what: str) -> httpx.Response:
        """One request, following Gitea's rename redirects within its own API only."""
        url: str | httpx.URL = path
        for _ in range(MAX_REDIRECTS + 1):
            response = self._http.request(method, url, json=json)
            location = response.headers.get("location")
            if response.status_code not in _REDIRECTS or not location:
                return response
            target = response.url.join(location)
            if not self._inside_api(target):
                raise GiteaError(
                    f"Gitea at {self.base_url} answered the request to {what} with a redirect to "
                    f"{_origin(target)}{target.path}, outside its API at {self.base_url}/api/v1; "
                    "vmd sends its token nowhere else and stopped there. If Gitea moved, set "
                    "GITEA_URL to its new address.")
            if response.status_code in (301, 302, 303) and method != "GET":
                raise GiteaError(
                    f"Gitea at {self.base_url} answered the request to {what} with HTTP "
                    f"{response.status_code} to {target.path}, which would turn the {method} into "
                    "a GET; check the repository's name in Gitea.")
            url = target
        raise GiteaError(f"Gitea at {self.base_url} redirected the request to {what} more than "
                         f"{MAX_REDIRECTS} times; check the repository's name in Gitea.")

    def _inside_api(self, target: httpx.URL) -> bool:
        return (_origin(target) == _origin(self._api)
                and target.path.startswith(self._api.path))

    def _error_for(self, response: httpx.Response, what: str) -> GiteaError:
        detail = self._message(response)
        detail = f" Gitea said: {detail}" if detail else ""
        if response.status_code == 401:
            return GiteaAuthError(
                f"Gitea at {self.base_url} refused the token (401) when trying to {what}: it is "
                "wrong, expired or revoked. Create a new access token in Gitea (Settings → "
                "Applications) with the write:repository and write:user scopes and set it in "
                f"vmd's configuration.{detail}")
        if response.status_code == 403:
            return GiteaAuthError(
                f"Gitea at {self.base_url} accepted the token but forbade it to {what} (403): the "
                "token lacks the write:repository / write:user scope (or write:organization, or "
                "a site admin's token for another user's repositories), or its user has no "
                "write access there. Create a token with those scopes in Gitea (Settings → "
                f"Applications) and set it in vmd's configuration.{detail}")
        if response.status_code == 422:
            return GiteaError(f"Gitea at {self.base_url} refused to {what} (422): the name or a "
                              f"value is not one Gitea accepts.{detail}")
        return GiteaError(f"Gitea at {self.base_url} could not {what}: HTTP "
                          f"{response.status_code}.{detail}")

    def _message(self, response: httpx.Response) -> str:
        try:
            body = response.json()
            text = str(body.get("message", "")) if isinstance(body, dict) else ""
        except ValueError:
            text = response.text[:300]
        return self._redact(text.strip())

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text


def _seg(part: str) -> str:
    """One path segment: names come from config and people, never a path of their own."""
    return quote(part, safe="")


def _origin(url: httpx.URL) -> str:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return f"{url.scheme}://{url.host}:{url.port or default}"


def _repo_info(response: httpx.Response) -> RepoInfo:
    return RepoInfo.model_validate(response.json(), strict=False)
