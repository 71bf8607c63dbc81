"""The agent's only door to vmd: line-delimited JSON-RPC over a Unix socket.

vmagent holds no privileges; everything it does to a machine goes through here.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any, Callable

DEFAULT_SOCKET = "/run/vmd/vmd.sock"


class VmdUnavailable(ConnectionError):
    """The vmd socket cannot be reached (not running, wrong path, or it went away)."""


class VmdError(RuntimeError):
    """vmd answered the call with an error."""

    def __init__(self, code: int, message: str, method: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.method = method


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

    def call(self, method: str, **params: Any) -> dict:
        if self._sock is None:
            self.connect()
        request_id = next(self._ids)
        line = json.dumps({"id": request_id, "method": method, "params": params}) + "\n"
        with self._lock:
            try:
                self._sock.sendall(line.encode())
                reply = self._read_reply(request_id, method)
            except OSError as exc:
                self._drop()
                raise VmdUnavailable(f"lost the connection to vmd during {method}: {exc}") from exc
        if "error" in reply and reply["error"] is not None:
            err = reply["error"]
            raise VmdError(int(err.get("code", -32000)), str(err.get("message", "")), method)
        result = reply.get("result")
        if method in ("session_open", "session_attach") and isinstance(result, dict):
            self.session_id = result.get("session_id", self.session_id)
        return result if isinstance(result, dict) else {"result": result}

    def _read_reply(self, request_id: int, method: str) -> dict:
        while True:
            raw = self._reader.readline()
            if not raw:
                self._drop()
                raise VmdUnavailable(f"vmd closed the connection during {method}")
            message = json.loads(raw)
            if message.get("id") == request_id:
                return message
            if "method" in message and "id" not in message:
                if self.on_notify is not None:
                    try:
                        self.on_notify(message["method"], message.get("params") or {})
                    except Exception:  # a view never breaks the work
                        pass

    def _drop(self) -> None:
        try:
            if self._sock:
                self._sock.close()
        finally:
            self._sock = None
            self._reader = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> "Vmd":
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()
