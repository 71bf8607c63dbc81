"""A small client for Gitea's REST API (`/api/v1`): the repository, its topics and
the commit status that carries vmd's verification.

Plain sync httpx. The token travels only in the `Authorization: token …` header and
never appears in an error message. 5xx answers and connection errors are retried with
exponential backoff, because a Gitea that restarts (or a proxy in front of it) answers
502/503 for a few seconds; auth errors are not retried, they need a person.
"""

from __future__ import annotations

import time
from typing import Literal

import httpx
from pydantic import BaseModel, SecretStr

# Gitea's commit status states (its API: pending, success, error, failure, warning).
StatusState = Literal["success", "failure", "error", "pending", "warning"]

# Gitea stores a status description in a VARCHAR(255) column; longer ones are refused.
STATUS_DESCRIPTION_MAX = 255


class GiteaError(Exception):
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
        self._http = httpx.Client(
            base_url=f"{self.base_url}/api/v1",
            headers={"Authorization": f"token {secret}", "Accept": "application/json"},
            timeout=timeout,
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
        """The repository, or None when it does not exist."""
        response = self._request("GET", f"/repos/{owner}/{name}", ok_missing=True,
                                 what=f"read the repository {owner}/{name}")
        return None if response.status_code == 404 else _repo_info(response)

    def ensure_repo(self, owner: str, name: str, description: str = "",
                    private: bool = False) -> RepoInfo:
        """The repository `owner/name`, created (empty, branch main) when missing.

        An empty `owner` means the token's user.
        """
        owner = owner or self.current_user()
        existing = self.get_repo(owner, name)
        if existing is not None:
            return existing
        body = {"name": name, "description": description[:2048], "private": private,
                "auto_init": False, "default_branch": "main"}
        what = f"create the repository {owner}/{name}"
        if owner == self.current_user():
            response = self._request("POST", "/user/repos", json=body, what=what, ok={409})
        else:
            # An organisation first; a 404 there means no such organisation, so the owner
            # may be another user, which only a site admin may create repositories for.
            response = self._request("POST", f"/orgs/{owner}/repos", json=body, what=what,
                                     ok={404, 409})
            if response.status_code == 404:
                response = self._request("POST", f"/admin/users/{owner}/repos", json=body,
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

    def set_topics(self, owner: str, repo: str, topics: list[str]) -> None:
        """Replace the repository's topics."""
        self._request("PUT", f"/repos/{owner}/{repo}/topics", json={"topics": topics},
                      what=f"set the topics of {owner}/{repo}")

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
        self._request("POST", f"/repos/{owner}/{repo}/statuses/{sha}", json=body,
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
                response = self._http.request(method, path, json=json)
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


def _repo_info(response: httpx.Response) -> RepoInfo:
    return RepoInfo.model_validate(response.json(), strict=False)
