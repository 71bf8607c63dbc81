"""A cancel's reach into what is in flight: once the job is cancelled, the vmd call and
the model's answer get a grace period to end by themselves, then they are broken off so
that the loop reaches its end and the session closes promptly (vmagent/loop/turns.py)."""

from __future__ import annotations

import threading

from vmagent.link import SessionLink
from vmagent.models import Model

# How often the cancel watcher looks whether the job was cancelled.
CANCEL_POLL_S = 0.2


class BreakOff:
    """Once the job is cancelled, what is in flight gets `grace` seconds to end by itself;
    then the vmd call is broken off (the link's connection shut down) and the model's
    answer abandoned, so the loop reaches `end_job` and the session closes promptly. Stopped
    before `end_job` (vmagent/loop/job_end.py), whose calls are never broken off."""

    def __init__(self, cancel: threading.Event, grace: float, link: SessionLink, llm: Model):
        self.cancel, self.grace, self.link, self.llm = cancel, grace, link, llm
        self.finished = threading.Event()
        self.fired = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="cancel-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self.cancel.wait(CANCEL_POLL_S):
            if self.finished.is_set():
                return
        if self.finished.wait(self.grace):
            return
        with self._lock:
            if self.finished.is_set():
                return
            self.fired = True
            self.llm.abandon()
            self.link.abort()

    def stop(self) -> bool:
        """The loop is done: nothing is broken off from now on. Whether something was."""
        with self._lock:
            self.finished.set()
            return self.fired
