"""vmd owns the end of every session: no guest outlives its owner.

A client (the agent's worker, the service) ends a session with session_close. When it
cannot (killed, its host gone, vmd restarted under it), vmd ends it itself, the same
way (commit, push, destroy), with the reason in the record and the report:

- at vmd's start (`adopt`), every session of the state dir that is not closed is loaded
  and its machine re-bound; it waits for its client again. One whose machine is gone
  is closed with a note saying so.
- the reaper (one daemon thread, every `reaper_interval_s`) closes a session that has
  had no client for `orphan_grace_s` (unless it waits for a person), and one that has
  waited for a person longer than `question_keep_s`; it ends a session whose files a
  full disk could not take, saves what a full disk held back once there is room, and
  destroys guests of this state dir that no session owns (`sweep`).
- pushes that failed at close are retried by vmd/server/push_retrier.py.
- while a guest has egress, the egress guard is watched (vmd/server/guard_watch.py): gone,
  and every such guest's egress is cut until it is back.
"""

from __future__ import annotations

import logging
import threading
import time

from vmd.config import VmdConfig
from vmd.contract.policy import WAITING_STATES
from vmd.server.guard_watch import GuardWatch, Target
from vmd.server.push_retrier import PushRetrier
from vmd.session.handlers.end_verbs import close
from vmd.session.registry import Sessions
from vmd.session.session import Session
from vmd.session.state import SessionState

log = logging.getLogger("vmd.server.lifecycle")

# How much longer than a boot an adopted session's re-binding may take before vmd
# decides about it anyway: libvirt lookups and an SSH handshake with a running guest.
SETTLE_SLACK_S = 60.0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds // 60} m {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class Lifecycle:
    """Adoption at start, the reaper and the push retries of one vmd's sessions."""

    def __init__(self, sessions: Sessions, config: VmdConfig):
        self.sessions = sessions
        self.config = config
        self.pushes = PushRetrier(sessions, config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._lock = threading.Lock()
        self.guard_watch: GuardWatch | None = None

    def start(self) -> None:
        """Adopts the state dir's sessions, then starts the reaper and the push retries (once)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self.sessions.machines.install_guard()  # before adoption: an adopted guest may have egress open
        self.adopt()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="vmd-reaper")
        self._thread.start()
        machines = self.sessions.machines
        self.guard_watch = GuardWatch(self._egress_targets, machines.guard_problem, machines.install_guard,
                                      self.config.guard_watch_s).start()
        self.pushes.start()
        self.sessions.machines.start_pool()  # warm machines (vmd/machines/warm_pool.py), when configured

    def stop(self) -> None:
        """Stops the threads; sessions and machines stay as they are for the next vmd."""
        self._stop.set()
        if self.guard_watch is not None:
            self.guard_watch.stop()
        self.pushes.stop()
        self.sessions.machines.stop_pool()

    def _egress_targets(self) -> list[Target]:
        """The live sessions whose guest has egress open, for the guard watch."""
        def note(session: Session):
            return lambda event, **fields: session.record.append("egress", event=event, **fields)
        return [Target(s.s.id, s.machine, note(s)) for s in self.sessions.live()
                if s.s.egress and s.machine is not None and s.s.state != "closed"]

    # --- adoption ------------------------------------------------------------------------

    def adopt(self) -> list[Session]:
        adopted = self.sessions.adopt()
        for session in adopted:
            if session.s.state != "closed":
                threading.Thread(target=self._settle, args=(session,), daemon=True,
                                 name=f"adopt-{session.s.id}").start()
        if any(s.s.push is not None and s.s.push.state == "pending" for s in adopted):
            self.pushes.wake()
        return adopted

    def _settle(self, session: Session) -> None:
        """Once an adopted session's machine is re-bound or found gone: a session whose
        machine is gone cannot go on, so it is closed (its folder committed and pushed)."""
        session.boot_done.wait(session.boot_timeout + SETTLE_SLACK_S)
        if self._stop.is_set() or session.s.state == "closed" or not session.boot_done.is_set():
            return
        if session.boot_error and (session.machine is None or not session.machine_alive()):
            self.end(session, f"vmd restarted and found the session's machine gone ({session.boot_error})")

    # --- the reaper ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.config.reaper_interval_s):
            try:
                self.tick()
            except Exception:  # the reaper must outlive any one bad session
                log.exception("the reaper's round failed")

    def tick(self) -> None:
        """One round over the live sessions, then the sweep of unowned guests."""
        for session in self.sessions.live():
            if self._stop.is_set():
                return
            try:
                self._check(session)
            except Exception:
                log.exception("the reaper could not check session %s", session.s.id)
        self._sweep()

    def _check(self, session: Session) -> None:
        if session.held():
            session.flush()  # what a full disk held back, once there is room again
        if session.s.state == "closed":
            self.sessions.release(session)
            return
        if session.closing.locked():
            return  # a close is under way
        if session.disk_full:
            self.end(session, session.disk_full)
            return
        stall = session.machine_stalled()
        if stall is not None:
            # QEMU paused the guest on a failed write: it answers nothing (a verb waiting
            # on it stays bounded, but the next would wait too). A full host disk ends the
            # session as one found by vmd's own writes does; another I/O error ends it too.
            if stall.no_space:
                session.note_full(stall.sentence())
            self.end(session, session.disk_full or stall.sentence())
            return
        if session.s.state in WAITING_STATES:
            since = session.s.waiting_since
            if since is None:  # a session.json of an older vmd: the wait counts from now
                with session.lock:
                    session.s.waiting_since = time.time()
                    session.save()
                return
            waited = time.time() - since
            if waited >= self.config.question_keep_s:
                self.end(session, f"it waited {_duration(waited)} for a person's answer, longer than vmd "
                                  f"keeps a waiting machine ({_duration(self.config.question_keep_s)})")
            return
        gone = session.detached_for()
        if gone is not None and gone >= self.config.orphan_grace_s:
            self.end(session, f"its client went away {gone:.0f} s ago and did not come back")

    def end(self, session: Session, reason: str) -> dict:
        """Closes `session` on vmd's own account: commit, push, destroy, `reason` in the
        record and the report."""
        closed = close(session, reason=reason)
        self.sessions.release(session)
        if session.s.push is not None and session.s.push.state == "pending":
            self.pushes.wake()
        return closed

    # --- guests no session owns --------------------------------------------------------

    def _sweep(self) -> None:
        live = {s.s.machine_name for s in self.sessions.live() if s.s.state != "closed"}
        for name in self.sessions.machines.sweep(lambda name, session: name in live or self._owned(session)):
            log.warning("destroyed the guest %s: no session of this vmd owns it any more", name)

    def _owned(self, session_id: str) -> bool:
        """Whether session `session_id` (the owner a guest's <metadata> names) is still open
        on disk: a session being opened right now is, before it is among the live ones. By
        the session's id, not the guest's name: a warm machine keeps its slot's name."""
        path = self.config.sessions_dir / session_id / "session.json"
        try:
            return SessionState.model_validate_json(path.read_text()).state != "closed"
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            return True  # unreadable: when in doubt, a guest is kept
