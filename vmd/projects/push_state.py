"""A push that failed at close, retried in the background until it lands.

When Gitea is down at close, the commit is safe in vmd's repository; what is missing is
only the push. The session's `push` (a `PushState` in session.json, so that a restarted
vmd carries on) says where it stands: `pending` while vmd retries (with a backoff doubled
after each try, capped at a few minutes), `pushed` once it landed (and when), `failed`
when it cannot pass by waiting (refused, a bad token) or vmd gave up after
`push_retry_s`. `session_status` of the closed session shows it; the record gets a
`push` event when it lands or gives up, so the report says "pushed later" or why not.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict

from vmd.config import VmdConfig


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


class PushState(BaseModel):
    """Where a closed session's push stands."""

    model_config = ConfigDict(extra="ignore")

    state: Literal["pending", "pushed", "failed"]
    attempts: int = 0
    sha: str | None = None
    branch: str | None = None
    web_url: str | None = None
    remote: str | None = None
    error: str | None = None  # the last failure, a sentence
    since: float  # when the first try was made (epoch seconds)
    until: float | None = None  # when vmd stops retrying
    next_at: float | None = None  # the next try, while pending
    pushed_at: float | None = None

    def view(self) -> dict:
        """What session_status shows: times as ISO strings."""
        return {"state": self.state, "attempts": self.attempts, "sha": self.sha, "web_url": self.web_url,
                "error": self.error, "pushed_at": iso(self.pushed_at), "next_try": iso(self.next_at),
                "retry_until": iso(self.until)}


def after_close(result: dict, config: VmdConfig, gitea: bool, now: float | None = None) -> PushState:
    """The push state after the first try at close. Only a failure that may pass by itself
    (Gitea unreachable, a 5xx, a network error) is retried, and only towards Gitea."""
    now = time.time() if now is None else now
    common = dict(attempts=1, sha=result.get("sha"), branch=result.get("branch"),
                  web_url=result.get("web_url"), remote=result.get("remote_display"), since=now)
    if result.get("pushed"):
        return PushState(state="pushed", pushed_at=now, **common)
    if gitea and result.get("retry"):
        return PushState(state="pending", error=result.get("error"), until=now + config.push_retry_s,
                         next_at=now + config.push_retry_backoff_s, **common)
    return PushState(state="failed", error=result.get("error"), **common)


def pending_text(push: PushState) -> str:
    return (f"vmd retries the push in the background until {iso(push.until)}; the commit is kept in "
            "vmd's repository meanwhile.")
