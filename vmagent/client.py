"""The agent's only door to vmd: line-delimited JSON-RPC over a Unix socket.

vmagent holds no privileges; everything it does to a machine goes through here.

`Vmd` is one connection. Once it is bound to a session (session_open, session_attach),
a fresh connection is re-attached to that session before any other verb goes out on it:
vmd would answer a session verb on an unbound connection with NO_SESSION at best.

`Vmd.call` answers the verb's result model (vmd/verb_results.py `RESULTS`): vmagent reads
attributes, and an answer that does not fit its model is refused here as `ResultUnfit`,
naming the fields, instead of failing later as a missing key somewhere in the loop.

`SessionLink` is what the turn loop talks through: it rides out a vmd restart (waits
for vmd, bounded, with backoff, and re-attaches), asks again the calls that are safe to
repeat, and says which call's result was lost, so that no verb is ever run twice
without the model deciding to.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from vmd.verbs import BUSY, FAILED, INTERNAL_ERROR, RESULTS, Result, bounded_json, result_problem

DEFAULT_SOCKET = "/run/vmd/vmd.sock"
# The verbs that bind a connection to a session; every other verb needs a bound one.
BINDING_VERBS = ("session_open", "session_attach")
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


class VmdUnavailable(ConnectionError):
    """The vmd socket cannot be reached (not running, wrong path, or it went away).

    in_flight: the request had been sent when the connection was lost, so whether vmd
    ran it, and what it answered, is unknown.
    """

    def __init__(self, message: str, *, in_flight: bool = False):
        super().__init__(message)
        self.in_flight = in_flight


class VmdGone(VmdUnavailable):
    """vmd stayed away past the bound (or came back without the session): the loop stops."""

    def __init__(self, message: str, *, method: str, seconds: float):
        super().__init__(message, in_flight=False)
        self.method = method
        self.seconds = seconds


class ResultLost(VmdUnavailable):
    """vmd went away while `method` was in flight and came back; the connection is
    re-attached to the session, but the call's result is lost (it may or may not have run)."""

    def __init__(self, method: str, seconds: float):
        super().__init__(f"vmd went away while {method} was in flight and came back after {seconds:.0f} s; "
                         "the call's result was lost.", in_flight=True)
        self.method = method
        self.seconds = seconds


class VmdError(RuntimeError):
    """vmd answered the call with an error: `code` one of vmd/verbs.py's (REFUSED: a rule
    of the session says no, and `message` starts with "REFUSED:"), `data` what vmd added
    (a refused finish's check: {"attempt": {...}}), else None."""

    def __init__(self, code: int, message: str, method: str = "", data: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.method = method
        self.data = data


class ResultUnfit(VmdError):
    """vmd answered, but not in the shape of the verb's result model: a vmd of another
    version than this vmagent, or a bug in vmd. The message names the fields."""


def typed_result(method: str, result: Any) -> Result:
    """`result` as `method`'s result model (RESULTS), or ResultUnfit saying which field."""
    model = RESULTS.get(method)
    if model is not None and isinstance(result, dict):
        try:
            return model.model_validate(result)
        except ValidationError:
            pass
    problem = result_problem(method, result) or f"vmd's answer to {method} does not fit its contract"
    raise ResultUnfit(INTERNAL_ERROR, f"{problem}. vmd and vmagent must come from one version: update the "
                                      "older of the two.", method)


def default_socket() -> str:
    return os.environ.get("VMD_SOCKET") or DEFAULT_SOCKET


class Vmd:
    """A connection to vmd. A connection binds to one session (session_open/attach)."""

    def __init__(
        self,
        socket_path: str | os.PathLike | None = None,
        timeout: float | None = None,
        on_notify: Callable[[str, dict], None] | None = None,
    ):
        self.socket_path = str(socket_path or default_socket())
        # vmd may send notifications (no "id") before a result, e.g. output lines of a
        # running command for the live terminal; they go here and never break the call.
        self.on_notify = on_notify
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._reader = None
        self._ids = itertools.count(1)
        # Held for the whole of a call, so `abort` can tell whether one is in flight.
        self._lock = threading.Lock()
        self.session_id: str | None = None

    def connect(self) -> "Vmd":
        if not Path(self.socket_path).exists():
            raise VmdUnavailable(
                f"vmd is not listening at {self.socket_path}: start it with `vmd serve` "
                "or point VMD_SOCKET at its socket."
            )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise VmdUnavailable(
                f"could not connect to vmd at {self.socket_path} ({exc}); is `vmd serve` running?"
            ) from exc
        self._sock = sock
        self._reader = sock.makefile("rb")
        return self

    def call(self, method: str, **params: Any) -> Result:
        """vmd's answer to `method`, as its result model (RESULTS[method]). Raises VmdError
        (vmd said no; ResultUnfit: its answer does not fit the model) or VmdUnavailable."""
        with self._lock:
            self._ensure_connection(method)
            return typed_result(method, self._request(method, params))

    def reattach(self) -> Result:
        """A fresh connection, bound to this connection's session (after vmd went away)."""
        if not self.session_id:
            raise VmdUnavailable("there is no session to re-attach: this connection never opened or attached one.")
        with self._lock:
            self._drop()
            self.connect()
            return typed_result("session_attach", self._attach())

    def abort(self) -> None:
        """Break off the call in flight, from another thread (a cancelled job): its read
        ends at once with VmdUnavailable. The next call opens a fresh connection."""
        sock = self._sock
        if self._lock.acquire(blocking=False):  # nothing in flight: just drop the connection
            try:
                self._drop()
            finally:
                self._lock.release()
            return
        if sock is not None:
            try:
                # shutdown, not close: a read blocked in another thread wakes only on shutdown.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # --- one request on the wire ---------------------------------------------------------

    def _ensure_connection(self, method: str) -> None:
        if self._sock is not None and not _still_open(self._sock):
            # vmd closed it while it was idle (it stopped or restarted): found before the
            # verb goes out, so that the verb is not lost on a dead connection.
            self._drop()
        if self._sock is not None:
            return
        self.connect()
        if self.session_id and method not in BINDING_VERBS:
            self._attach()

    def _attach(self) -> Any:
        try:
            return self._request("session_attach", {"session_id": self.session_id})
        except BaseException:
            self._drop()  # never leave a connection that is not bound to the session
            raise

    def _request(self, method: str, params: dict) -> Any:
        sock, reader = self._sock, self._reader
        assert sock is not None and reader is not None
        request_id = next(self._ids)
        line = json.dumps({"id": request_id, "method": method, "params": params}) + "\n"
        try:
            sock.sendall(line.encode())
        except OSError as exc:
            # vmd may have refused the connection (its one line, then closed) before the
            # request was written: that line is still there to read, and says why.
            try:
                sock.settimeout(1)
                self._read_reply(reader, request_id, method)
            except VmdError:
                self._drop()
                raise
            except Exception:
                pass
            self._drop()
            raise VmdUnavailable(f"lost the connection to vmd before {method} was sent: {exc}") from exc
        try:
            reply = self._read_reply(reader, request_id, method)
        except VmdUnavailable:
            self._drop()
            raise
        except (OSError, ValueError) as exc:
            self._drop()
            raise VmdUnavailable(f"lost the connection to vmd during {method}: {exc}", in_flight=True) from exc
        if "error" in reply and reply["error"] is not None:
            err = reply["error"]
            data = err.get("data")
            raise VmdError(int(err.get("code", FAILED)), str(err.get("message", "")), method,
                           data if isinstance(data, dict) else None)
        result = reply.get("result")
        if method in BINDING_VERBS and isinstance(result, dict):
            self.session_id = result.get("session_id", self.session_id)
        return result  # checked against the verb's model by the caller (typed_result)

    def _read_reply(self, reader, request_id: int, method: str) -> dict:
        while True:
            raw = reader.readline()
            if not raw or not raw.endswith(b"\n"):  # a line cut short: vmd died writing it
                raise VmdUnavailable(f"vmd closed the connection during {method}", in_flight=True)
            message = bounded_json(raw)
            if message.get("id") == request_id:
                return message
            if message.get("id") is None and "id" in message and isinstance(message.get("error"), dict):
                # An error for no request (JSON-RPC's null id): vmd refused the connection
                # before reading any (its connection limit), so the call never ran.
                error = message["error"]
                raise VmdError(int(error.get("code") or BUSY), str(error.get("message") or "vmd refused"),
                               method, data=error.get("data") if isinstance(error.get("data"), dict) else None)
            if "method" in message and "id" not in message:
                if self.on_notify is not None:
                    try:
                        self.on_notify(message["method"], message.get("params") or {})
                    except Exception:  # a view never breaks the work
                        pass

    def _drop(self) -> None:
        sock, reader = self._sock, self._reader
        self._sock = None
        self._reader = None
        for thing in (reader, sock):
            try:
                if thing is not None:
                    thing.close()
            except OSError:
                pass

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> "Vmd":
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()


def _still_open(sock: socket.socket) -> bool:
    """False when the peer has closed an idle connection (or it broke)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except (OSError, ValueError):
        return False


# --- riding out a vmd restart -------------------------------------------------------------


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
