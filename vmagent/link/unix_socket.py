"""The socket transport to vmd: line-delimited JSON-RPC over a Unix socket of this machine.

vmagent holds no privileges; everything it does to a machine goes through vmd.

`Vmd` is one connection. Once it is bound to a session (session_open, session_attach),
a fresh connection is re-attached to that session before any other verb goes out on it:
vmd would answer a session verb on an unbound connection with NO_SESSION at best.

`Vmd.call` answers the verb's result model (vmd/contract/results.py `RESULTS`): vmagent reads
attributes, and an answer that does not fit its model is refused here as `ResultUnfit`,
naming the fields, instead of failing later as a missing key somewhere in the loop.

`SocketCalls` is this transport behind the small interface of vmagent/link/calls.py (a
short list of calls on one vmd), as the Ray transport (vmagent/fleet/on_host.py) is.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import threading
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from vmagent.link.calls import CallAnswer, VmdCall
from vmagent.link.errors import ResultUnfit, VmdError, VmdUnavailable
from vmd.contract.errors import BUSY, FAILED, INTERNAL_ERROR
from vmd.contract.json_depth import loads as bounded_json
from vmd.contract.results import RESULTS, Result, result_problem

DEFAULT_SOCKET = "/run/vmd/vmd.sock"
# The verbs that bind a connection to a session; every other verb needs a bound one.
BINDING_VERBS = ("session_open", "session_attach")


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


class SocketCalls:
    """The calls on the vmd at `vmd_socket`, a socket of this machine (None: VMD_SOCKET, else
    vmd's default): the local executor's way to a job's vmd, and a Ray host's own."""

    def __init__(self, vmd_socket: str | None):
        self.vmd_socket = vmd_socket

    def __call__(self, calls: list[VmdCall], timeout: float, stop_at_error: bool = False) -> list[CallAnswer]:
        """`calls` in order on one connection. A refusal is that call's error (and, with
        stop_at_error, the last call made); vmd away raises VmdUnavailable."""
        answers: list[CallAnswer] = []
        with Vmd(self.vmd_socket, timeout=timeout) as vmd:
            for call in calls:
                try:
                    result = vmd.call(call.verb, **call.params)
                except VmdError as exc:
                    answers.append(CallAnswer(error=str(exc)))
                    if stop_at_error:
                        break
                    continue
                answers.append(CallAnswer(result=result.model_dump() if isinstance(result, BaseModel) else
                                          {"value": result}))
        return answers
