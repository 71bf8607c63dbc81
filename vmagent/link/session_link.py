"""The turn loop's link to its session: the same session across a vmd restart.

`SessionLink` rides out a vmd restart (waits for vmd, bounded, with backoff, and
re-attaches), asks again the calls that are safe to repeat, and says which call's result
was lost, so that no verb is ever run twice without the model deciding to.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from vmagent.link.errors import ResultLost, VmdError, VmdGone, VmdUnavailable
from vmagent.link.unix_socket import Vmd
from vmd.contract.errors import BUSY
from vmd.contract.results import Result

# The calls asked again on the re-attached connection after vmd came back: what the loop
# asks vmd itself, each safe to repeat (reads, a wait, a note -- at worst one line twice in
# the record -- and the end: cancel and close are idempotent in vmd). A tool call in
# flight is never among them: whether it ran is unknown, and the model decides.
REPEATABLE_VERBS = frozenset({"session_attach", "session_status", "session_ready", "report", "note",
                              "session_cancel", "session_close", "peek"})
# The wait between tries to reach vmd again: from the first, doubling, up to the most. A
# supervisor restarted by systemd is back in a second or two; one that takes longer is
# not hammered.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0


@dataclass
class Outage:
    """One stretch of vmd being away, for the report's notes."""

    method: str  # the call that found it gone
    seconds: float
    back: bool  # vmd came back and the session was re-attached
    lost: bool  # a call in flight whose result was lost (answered to the model as interrupted)


class SessionLink:
    """The loop's connection to its session, riding out a vmd restart.

    A call that finds vmd gone waits for it (up to `wait_s` from the loss, backoff between
    tries, `on_status` told when the wait starts and ends), re-attaches the session, and
    then: a repeatable call (REPEATABLE_VERBS) is asked again; one that had not been sent
    is sent; one that was in flight raises ResultLost. Past the bound it raises VmdGone,
    and from then on nothing waits again. While `stop` is set (a cancelled job) nothing
    waits either: the loss is raised as it is.
    """

    def __init__(self, vmd: Vmd, *, wait_s: float = 0.0, on_status: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None):
        self.vmd = vmd
        self.wait_s = wait_s
        self.on_status = on_status
        self.stop = stop or threading.Event()
        self.outages: list[Outage] = []
        self.gave_up = False

    @property
    def session_id(self) -> str | None:
        return self.vmd.session_id

    @property
    def socket_path(self) -> str:
        return self.vmd.socket_path

    def call(self, method: str, **params: Any) -> Result:
        lost_at: float | None = None
        while True:
            try:
                return self.vmd.call(method, **params)
            except VmdUnavailable as exc:
                lost = exc
            except VmdError as exc:
                if exc.method != "session_attach" or method == "session_attach":
                    raise
                if exc.code == BUSY:
                    # vmd is there but at its connection limit (clients coming back after a
                    # restart): `method` was not sent; wait for room as for vmd itself.
                    lost = VmdUnavailable(f"vmd had no room to re-attach the session: {exc.message}")
                else:
                    # A fresh connection could not be bound: this vmd no longer has the session.
                    self.gave_up = True
                    raise VmdGone(f"vmd could not re-attach session {self.vmd.session_id} for {method}: "
                                  f"{exc.message}", method=method, seconds=0.0) from exc
            if self.stop.is_set() or self.gave_up or self.wait_s <= 0 or not self.vmd.session_id:
                raise lost
            lost_at = time.monotonic() if lost_at is None else lost_at
            in_flight_lost = lost.in_flight and method not in REPEATABLE_VERBS
            seconds = self._wait_for_vmd(method, lost, lost_at, in_flight_lost)
            if in_flight_lost:
                raise ResultLost(method, seconds) from lost
            # not sent, or safe to repeat: ask again on the re-attached connection

    def _wait_for_vmd(self, method: str, lost: VmdUnavailable, since: float, in_flight_lost: bool) -> float:
        session = self.vmd.session_id
        self._say(f"vmd went away during {method}; waiting up to {self.wait_s:.0f} s for it to come back")
        delay = RECONNECT_FIRST_S
        while True:
            left = self.wait_s - (time.monotonic() - since)
            if left <= 0:
                break
            if self.stop.wait(min(delay, left)):
                raise lost  # cancelled while waiting: the loop ends the job now
            delay = min(delay * 2, RECONNECT_MAX_S)
            try:
                self.vmd.reattach()
            except VmdUnavailable:
                continue
            except VmdError as exc:
                if exc.code == BUSY:
                    continue
                seconds = time.monotonic() - since
                self.gave_up = True
                self.outages.append(Outage(method, seconds, back=False, lost=in_flight_lost))
                raise VmdGone(f"vmd went away during {method} and came back after {seconds:.0f} s, but "
                              f"could not re-attach session {session}: {exc.message}",
                              method=method, seconds=seconds) from exc
            seconds = time.monotonic() - since
            self.outages.append(Outage(method, seconds, back=True, lost=in_flight_lost))
            self._say(f"vmd is back: re-attached to session {session} after {seconds:.0f} s")
            return seconds
        seconds = time.monotonic() - since
        self.gave_up = True
        self.outages.append(Outage(method, seconds, back=False, lost=in_flight_lost))
        raise VmdGone(f"vmd went away during {method} and did not come back within {self.wait_s:.0f} s "
                      f"(vmd_reconnect_s; {lost})", method=method, seconds=seconds)

    def _say(self, text: str) -> None:
        if self.on_status is not None:
            try:
                self.on_status(text)
            except Exception:  # a view never breaks the work
                pass

    def abort(self) -> None:
        self.vmd.abort()

    def close(self) -> None:
        self.vmd.close()
