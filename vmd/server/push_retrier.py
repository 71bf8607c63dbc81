"""The push retrier: one daemon thread beside the sessions that tries every pending push
again when it is due (vmd/projects/push_state.py says how a push stands and when the next
try is), and records the end once it lands or vmd gives up."""

from __future__ import annotations

import logging
import threading
import time

from vmd.config import VmdConfig
from vmd.errors import sentence
from vmd.projects.push_state import PushState, after_close, iso
from vmd.session.registry import Sessions
from vmd.session.session import Session

log = logging.getLogger("vmd.server.push_retrier")


class PushRetrier:
    """One daemon thread that retries every pending push of the live sessions when due."""

    def __init__(self, sessions: Sessions, config: VmdConfig):
        self.sessions = sessions
        self.config = config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="vmd-push-retry")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """A new pending push: look again now rather than at the next due time."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = 5.0  # nothing pending: look again soon enough to pick up a new one
            for session in self.sessions.pending_pushes():
                if self._stop.is_set():
                    return
                push = session.s.push
                if push is None or push.state != "pending":
                    continue
                due = (push.next_at or 0) - time.time()
                if due <= 0:
                    try:
                        self.attempt(session)
                    except Exception:  # a bug here must not stop the retries of other sessions
                        log.exception("retrying the push of session %s failed", session.s.id)
                        due = self.config.push_retry_backoff_s
                    else:
                        continue
                wait = min(wait, max(due, 0.05))
            self._wake.wait(wait)
            self._wake.clear()

    def attempt(self, session: Session) -> PushState:
        """One try now; updates and saves the session's push state, records the end."""
        s = session.s
        try:
            result = session.publication().push(s.branch, s.outcome)
        except Exception as exc:
            result = {"pushed": False, "retry": True, "error": sentence(exc, "the push failed")}
        now = time.time()
        with session.lock:
            push = s.push.model_copy() if s.push else after_close(result, self.config, True, now)
            push.attempts += 1
            if result.get("pushed"):
                push.state, push.pushed_at, push.next_at, push.error = "pushed", now, None, None
                push.sha, push.web_url = result.get("sha"), result.get("web_url")
                push.branch, push.remote = result.get("branch"), result.get("remote_display")
                if s.close is not None:
                    where = push.web_url or push.remote
                    s.close = {**s.close, "pushed": True, "web_url": push.web_url, "branch": push.branch,
                               "remote": push.remote, "push_error": None,
                               "warnings": result.get("warnings") or [],
                               "text": s.close["text"] + f" Pushed later, at {iso(now)}, to {where}."}
            elif not result.get("retry") or now >= (push.until or now):
                push.state, push.next_at = "failed", None
                push.error = result.get("error")
            else:
                push.error = result.get("error")
                step = self.config.push_retry_backoff_s * 2 ** max(0, push.attempts - 1)
                push.next_at = now + min(step, self.config.push_retry_backoff_max_s)
            s.push = push
            if push.state == "failed" and s.close is not None:
                s.close = {**s.close, "push_error": push.error,
                           "text": s.close["text"] + f" vmd gave up pushing after {push.attempts} tries: "
                                                     f"{push.error}"}
            session.save()
        if push.state != "pending":
            session.record.append("push", state=push.state, attempts=push.attempts, sha=push.sha,
                                  web_url=push.web_url, branch=push.branch, remote=push.remote,
                                  error=push.error, warnings=result.get("warnings") or [])
            self.sessions.release(session)
        return push
