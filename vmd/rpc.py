"""vmd's server: line-delimited JSON-RPC over a Unix socket, one thread per connection.

`{"id", "method", "params"}` -> `{"id", "result"}` or `{"id", "error": {"code", "message"}}`.
A connection binds to one session with session_open or session_attach; every other verb
acts on it. While `run` works, vmd sends notifications without an id:
`{"method": "output", "params": {"stream": "stdout", "line": "..."}}`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import typing
from pathlib import Path

from pydantic import ValidationError

from vmd import verbs as V
from vmd.config import VmdConfig
from vmd.session import NO_SESSION, MachineFactory, ProjectStore, Session, Sessions, VerbError

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# A request line longer than this is refused: write_file bodies are the largest thing
# sent, and 64 MiB is far past any source file an agent should write in one call.
MAX_LINE = 64 * 1024 * 1024


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return "|".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        args = typing.get_args(annotation)
        return f"list[{_type_name(args[0])}]" if args else "list"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, V.Params):
        return "{" + shape(annotation) + "}"
    return getattr(annotation, "__name__", str(annotation))


def shape(model: type[V.Params]) -> str:
    """`command: str, timeout: float = 300, cwd: str|null = null` for a verb's params."""
    parts = []
    for name, field in model.model_fields.items():
        part = f"{name}: {_type_name(field.annotation)}"
        if not field.is_required():
            default = field.get_default(call_default_factory=True)
            part += f" = {json.dumps(default, default=str)}"
        parts.append(part)
    return ", ".join(parts) or "no params"


def params_error(verb: str, exc: ValidationError, model: type[V.Params]) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "params"
        if err["type"] == "extra_forbidden":
            problems.append(f"{where}: not a param of {verb}")
        elif err["type"] == "missing":
            problems.append(f"{where}: required")
        else:
            problems.append(f"{where}: {err['msg']}")
    return f"bad params for {verb}: {'; '.join(problems)}. Expected {{{shape(model)}}}."


class Connection:
    """One client: reads requests, writes replies and notifications, holds the binding."""

    def __init__(self, server: "VmdServer", sock: socket.socket):
        self.server = server
        self.sock = sock
        self.session: Session | None = None
        self._write_lock = threading.Lock()

    def send(self, message: dict) -> None:
        data = (json.dumps(message, ensure_ascii=False, default=str) + "\n").encode()
        with self._write_lock:
            self.sock.sendall(data)

    def notify(self, method: str, params: dict) -> None:
        try:
            self.send({"method": method, "params": params})
        except OSError:
            pass  # the watcher went away; the command keeps running

    def serve(self) -> None:
        reader = self.sock.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE + 1)
                if not line:
                    break
                if not line.strip():
                    continue
                reply = self.handle_line(line)
                if reply is not None:
                    self.send(reply)
        except OSError:
            pass
        finally:
            try:
                reader.close()
                self.sock.close()
            except OSError:
                pass

    def handle_line(self, line: bytes) -> dict | None:
        if len(line) > MAX_LINE:
            return _error(None, INVALID_REQUEST, f"the request is over {MAX_LINE} bytes; send files in parts "
                                                 "with append_file.")
        try:
            request = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(None, PARSE_ERROR, f"the request is not valid JSON ({exc}); send one JSON object "
                                             'per line: {"id": 1, "method": "...", "params": {...}}.')
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return _error(request.get("id") if isinstance(request, dict) else None, INVALID_REQUEST,
                          'a request is an object with "id", "method" (a string) and "params" (an object).')
        request_id = request.get("id")
        try:
            result = self.dispatch(request["method"], request.get("params"))
        except VerbError as exc:
            return _error(request_id, exc.code, exc.message)
        except Exception as exc:  # a bug in vmd must not take the connection down
            return _error(request_id, INTERNAL_ERROR, f"vmd failed serving {request['method']}: "
                                                      f"{type(exc).__name__}: {exc}")
        return {"id": request_id, "result": result}

    def dispatch(self, verb: str, raw_params) -> dict:
        model = V.VERBS.get(verb)
        if model is None:
            raise VerbError(f"unknown verb {verb!r}; the verbs are: {', '.join(V.VERBS)}.", METHOD_NOT_FOUND)
        if raw_params is None:
            raw_params = {}
        if not isinstance(raw_params, dict):
            raise VerbError(f"params for {verb} must be an object, got {type(raw_params).__name__}. "
                            f"Expected {{{shape(model)}}}.", INVALID_PARAMS)
        try:
            params = model.model_validate(raw_params)
        except ValidationError as exc:
            message = params_error(verb, exc, model)
            if self.session is not None:
                self.session.record.verb(verb, raw_params, error=message, code=INVALID_PARAMS)
            raise VerbError(message, INVALID_PARAMS) from None
        if verb == "session_open":
            self.session = self.server.sessions.open(params)
            s = self.session.s
            share = bool(s.project_dir)
            return {"session_id": s.id, "os": s.os, "project": s.project, "project_share": share,
                    "storage": s.storage, "state": s.state,
                    "text": f"Session {s.id} is open; the {s.os} machine boots in the background. "
                            f"Storage: {s.storage}. Plan first with plan_tasks."}
        if verb == "session_attach":
            self.session = self.server.sessions.attach(params.session_id)
            s = self.session.s
            return {"session_id": s.id, "state": s.state,
                    "text": f"Attached to session {s.id} ({s.state}).\n{self.session.tasks.render()}"}
        if self.session is None:
            raise VerbError(f"no session on this connection: call session_open or session_attach before "
                            f"{verb}.", NO_SESSION)
        return self.session.call(verb, params, notify=self.notify)


def _error(request_id, code: int, message: str) -> dict:
    return {"id": request_id, "error": {"code": code, "message": message}}


class VmdServer:
    def __init__(self, config: VmdConfig, machines: MachineFactory | None = None,
                 store: ProjectStore | None = None):
        self.config = config
        self.sessions = Sessions(config, machines, store)
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

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
            client.settimeout(None)
            self._connections.add(client)
            threading.Thread(target=self._serve_client, args=(client,), daemon=True,
                             name="vmd-connection").start()

    def _serve_client(self, client: socket.socket) -> None:
        try:
            Connection(self, client).serve()
        finally:
            self._connections.discard(client)

    def start(self) -> "VmdServer":
        """Serve in a background thread (tests, embedding); returns once listening."""
        self.bind()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="vmd-server")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop connections; machines keep running (session_attach
        re-binds them in the next vmd)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for client in list(self._connections):
            try:
                client.shutdown(socket.SHUT_RDWR)
                client.close()
            except OSError:
                pass
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
