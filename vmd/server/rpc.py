"""vmd's server: line-delimited JSON-RPC over a Unix socket, one thread per connection.

`{"id", "method", "params"}` -> `{"id", "result"}` or `{"id", "error": {"code", "message"}}`
(with `"data"` in the error when the verb gives more than a sentence: a refused finish
gives its attempt). Every refusal is an error with code REFUSED.
Every verb is served by its handler (vmd/session/handlers/, three tables): a connection
binds to one session with session_open or session_attach (`BINDING`); every other verb acts
on that session (`HANDLERS`, through vmd/session/serving.py), but those vmd answers from its
own state without a session (POLICY `session` False: `SESSIONLESS`, `history` and
`host_info`). This module reads the line, validates the params against the contract, binds
the connection and writes the reply; it serves no verb itself. While `run` works, vmd sends
notifications without an id: `{"method": "output", "params": {"stream": "stdout", "line": "..."}}`.

No input loses a connection: every line gets one reply, under the request's id when it
can be read (else null), and the next line is served. Requests are cleaned at the edge
(nesting depth, lone surrogates) so that what reaches a session can always be stored as
JSON, and replies are always written as JSON any reader can parse (the wire itself:
vmd/server/wire.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
from pathlib import Path

from pydantic import ValidationError

from vmd.config import VmdConfig
from vmd.contract.errors import BUSY, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, NO_SESSION
from vmd.contract.params import VERBS
from vmd.contract.policy import POLICY
from vmd.contract.shown_text import one_line, printable
from vmd.errors import VerbError, checked_result
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.machines.port import MachineFactory
from vmd.projects.store import ProjectStore
from vmd.server.lifecycle import Lifecycle
from vmd.server.wire import (MAX_LINE, clean_request, encode, error_reply, id_of, leading_id, params_error, read_json,
                             shape)
from vmd.session.handlers import BINDING, SESSIONLESS
from vmd.session.registry import Sessions
from vmd.session.serving import serve
from vmd.session.session import Session


class Connection:
    """One client: reads requests, writes replies and notifications, holds the binding."""

    def __init__(self, server: "VmdServer", sock: socket.socket):
        self.server = server
        self.sock = sock
        self.session: Session | None = None
        self._write_lock = threading.Lock()

    def bind(self, session: Session) -> None:
        """This connection now acts on `session`; the session counts it among its clients
        (vmd/server/lifecycle.py closes a session whose clients all went and did not come back)."""
        if session is self.session:
            return
        if self.session is not None:
            self.session.client_left()
        self.session = session
        session.client_joined()

    def unbind(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            session.client_left()

    def send(self, message: dict) -> None:
        try:
            data = encode(message)
        except Exception as exc:  # a reply vmd cannot write as JSON still answers its request
            if "id" not in message:
                raise
            data = encode(error_reply(message["id"], INTERNAL_ERROR,
                                 f"vmd could not write its reply as JSON ({type(exc).__name__}: {exc}); "
                                 "this is a bug in vmd: report it with the request that caused it."))
        with self._write_lock:
            self.sock.sendall(data)

    def notify(self, method: str, params: dict) -> None:
        try:
            self.send({"method": method, "params": params})
        except Exception:
            pass  # the watcher went away, or the line could not be written; the command keeps running

    def serve(self) -> None:
        reader = self.sock.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE + 1)
                if not line:
                    break
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    self.send(error_reply(leading_id(line), INVALID_REQUEST,
                                     f"the request is over {MAX_LINE} bytes and was not read; send files "
                                     "in parts with append_file."))
                    while line and not line.endswith(b"\n"):  # the rest of the line is dropped
                        line = reader.readline(MAX_LINE + 1)
                    continue
                if not line.strip():
                    continue
                self.send(self.handle_line(line))
        except OSError:
            pass
        finally:
            try:
                reader.close()
                self.sock.close()
            except OSError:
                pass
            self.unbind()

    def handle_line(self, line: bytes) -> dict:
        """The reply to one request line; never raises."""
        request_id, method = leading_id(line), "the request"
        try:
            request = read_json(line)
            if isinstance(request, dict):
                request_id = id_of(request)
            request = clean_request(request)
            if not isinstance(request.get("method"), str):
                raise VerbError('a request is an object with "id", "method" (a string) and "params" '
                                "(an object).", INVALID_REQUEST)
            method = request["method"]
            result = self.dispatch(method, request.get("params"))
            if method == "session_close" and self.session is not None:
                # A closed session leaves vmd's memory; session_attach reads it from disk.
                self.server.sessions.release(self.session)
        except VerbError as exc:
            return error_reply(request_id, exc.code, exc.message, exc.data)
        except Exception as exc:  # a bug in vmd must not take the connection down
            return error_reply(request_id, INTERNAL_ERROR, f"vmd failed serving {method}: "
                                                      f"{type(exc).__name__}: {exc}")
        return {"id": request_id, "result": result}

    def dispatch(self, verb: str, raw_params) -> dict:
        model = VERBS.get(verb)
        if model is None:
            raise VerbError(f"unknown verb {verb!r}; the verbs are: {', '.join(VERBS)}.", METHOD_NOT_FOUND)
        if raw_params is None:
            raw_params = {}
        if not isinstance(raw_params, dict):
            raise VerbError(f"params for {verb} must be an object, got {type(raw_params).__name__}. "
                            f"Expected {{{shape(model)}}}.", INVALID_PARAMS)
        try:
            params = model.model_validate(raw_params)
        except ValidationError as exc:
            message = params_error(verb, exc, model)
            if self.session is not None and POLICY[verb].session:
                self.session.record.verb(verb, raw_params, error=message, code=INVALID_PARAMS)
            raise VerbError(message, INVALID_PARAMS) from None
        if verb in BINDING:
            session, result = BINDING[verb](self.server.sessions, params)
            self.bind(session)
            return checked_result(verb, result)
        if verb in SESSIONLESS:
            return checked_result(verb, SESSIONLESS[verb](self.server.sessions, params))
        if self.session is None:
            raise VerbError(f"no session on this connection: call session_open or session_attach before "
                            f"{verb}.", NO_SESSION)
        return serve(self.session, verb, params, notify=self.notify)


def _log_record_factory(base):
    """Records of vmd's loggers ("vmd", "vmd.*") with their message as one printable line
    and their traceback printable: the guest's text (a host name it reported, an error
    it caused) is in them, and vmd's log is read on a terminal."""

    def factory(*args, **kwargs):
        record = base(*args, **kwargs)
        if record.name == "vmd" or record.name.startswith("vmd."):
            try:
                record.msg, record.args = one_line(record.getMessage()), None
            except Exception:  # a message that does not format: logging reports it as ever
                pass
            if record.exc_info and record.exc_info[0] is not None:
                record.exc_text = printable("".join(traceback.format_exception(*record.exc_info))).rstrip("\n")
        return record

    factory.vmd_clean = True
    return factory


def install_log_cleaning() -> None:
    """Makes every record of vmd's loggers printable (once, whoever calls it)."""
    base = logging.getLogRecordFactory()
    if not getattr(base, "vmd_clean", False):
        logging.setLogRecordFactory(_log_record_factory(base))


install_log_cleaning()


class VmdServer:
    def __init__(self, config: VmdConfig, machines: MachineFactory | None = None,
                 store: ProjectStore | None = None):
        self.config = config
        # libvirt unless told otherwise (the tests hand in stand-ins, tests/support/vmd_fakes.py).
        self.sessions = Sessions(config, machines or LibvirtMachines(config), store)
        # Adoption at start, the reaper, the push retries: vmd owns every session's end.
        self.lifecycle = Lifecycle(self.sessions, config)
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    @property
    def socket_path(self) -> Path:
        return Path(self.config.socket)

    def bind(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
                raise RuntimeError(f"another vmd is already serving on {path}; stop it or use another --socket.")
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink()  # a stale socket left by a vmd that died
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        # The agent runs as another user; the socket's folder is what guards it.
        os.chmod(path, 0o660)
        sock.listen(64)
        self._sock = sock

    def serve_forever(self) -> None:
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        self.lifecycle.start()  # once: start() may have done it already
        self._sock.settimeout(0.5)
        while not self._stopping.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    break
                raise
            with self._connections_lock:
                full = len(self._connections) >= self.config.max_connections
                if not full:
                    self._connections.add(client)
            if full:
                self._refuse(client)
                continue
            client.settimeout(None)
            threading.Thread(target=self._serve_client, args=(client,), daemon=True,
                             name="vmd-connection").start()

    def _refuse(self, client: socket.socket) -> None:
        """One error line to a connection over the limit, then close it."""
        try:
            client.settimeout(1)  # the accept loop waits for no client
            client.sendall(encode(error_reply(None, BUSY, f"vmd is at its connection limit "
                                                     f"({self.config.max_connections} connections); "
                                                     "retry later.")))
        except OSError:
            pass
        finally:
            client.close()

    def _serve_client(self, client: socket.socket) -> None:
        try:
            Connection(self, client).serve()
        finally:
            with self._connections_lock:
                self._connections.discard(client)

    def start(self) -> "VmdServer":
        """Serve in a background thread (tests, embedding); returns once listening, with
        the state dir's sessions adopted."""
        self.bind()
        self.lifecycle.start()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="vmd-server")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop connections; machines keep running (session_attach
        re-binds them in the next vmd, which adopts them at its start)."""
        self._stopping.set()
        self.lifecycle.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with self._connections_lock:
            clients = list(self._connections)
        for client in clients:
            try:
                client.shutdown(socket.SHUT_RDWR)
                client.close()
            except OSError:
                pass
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
