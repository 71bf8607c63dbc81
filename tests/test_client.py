"""vmagent/client.py `Vmd` against a server on a real Unix socket that speaks vmd's wire
protocol and does what each test tells it: a result, an error with data, output lines
while a call runs, BUSY, or vanishing mid-call. Every wait is short: a client that
hangs fails the test instead of stalling the run."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from typing import Callable

import pytest

from tests.vmd_fakes import short_socket_dir
from vmagent import client
from vmagent.client import SessionLink, Vmd, VmdError, VmdUnavailable
from vmd.verbs import BUSY, FAILED, REFUSED

# A reply the client has not got by then is a hang.
WAIT_S = 5.0


class Wire:
    """One connection as the server sees it: requests in, lines out."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, message: dict) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def vanish(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# A handler answers one request on its connection; returning False ends the connection.
Handler = Callable[[Wire, dict], "bool | None"]


class ScriptedVmd:
    """A stand-in for vmd's socket: one thread per connection, a line in, the handler of
    its method out; records (connection number, method, params) for every request."""

    def __init__(self, handlers: dict[str, Handler]):
        self.handlers = handlers
        self.folder = short_socket_dir()
        self.path = self.folder / "vmd.sock"
        self.requests: list[tuple[int, str, dict]] = []
        self.connections = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(sock)
            threading.Thread(target=self._serve, args=(sock, self.connections), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        wire = Wire(sock)
        with sock.makefile("rb") as lines:
            for line in lines:
                try:
                    request = json.loads(line)
                except ValueError:
                    # A client cut off mid-line (a test's abort or shutdown): vmd would
                    # answer a parse error to nobody; this server just stops serving it.
                    return
                self.requests.append((number, request["method"], request.get("params") or {}))
                handler = self.handlers.get(request["method"], answer({"text": "ok"}))
                try:
                    if handler(wire, request) is False:
                        return
                except OSError:
                    return

    def methods(self) -> list[str]:
        return [method for _, method, _ in self.requests]

    def close_connections(self) -> None:
        """vmd drops every client (a restart), but keeps listening."""
        for sock in self._open:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._listener.close()
        self.close_connections()
        shutil.rmtree(self.folder, ignore_errors=True)


def answer(result) -> Handler:
    def handle(wire: Wire, request: dict) -> None:
        wire.send({"id": request["id"], "result": result(request["params"]) if callable(result) else result})
    return handle


def refuse(code: int, message: str, data: dict | None = None) -> Handler:
    def handle(wire: Wire, request: dict) -> None:
        error = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        wire.send({"id": request["id"], "error": error})
    return handle


def vanish(wire: Wire, request: dict) -> bool:
    wire.vanish()
    return False


OPENED = {"session_id": "s1", "text": "opened"}


@pytest.fixture
def serve():
    servers: list[ScriptedVmd] = []

    def start(**handlers: Handler) -> ScriptedVmd:
        handlers.setdefault("session_open", answer(OPENED))
        handlers.setdefault("session_attach", answer(lambda p: {"session_id": p["session_id"], "state": "ready"}))
        server = ScriptedVmd(handlers)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def within(seconds: float, fn: Callable, *args, **kwargs):
    """fn's result or exception, failing the test if it takes longer than `seconds`."""
    started = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        assert time.monotonic() - started < seconds, f"{fn} took longer than {seconds} s"


# --- results and errors ---------------------------------------------------------------------


def test_a_result_comes_back_as_sent(serve):
    server = serve(run=answer(lambda p: {"exit_code": 0, "text": f"ran {p['command']}"}))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        assert vmd.call("run", command="ls", timeout=5) == {"exit_code": 0, "text": "ran ls"}
    assert server.requests == [(1, "run", {"command": "ls", "timeout": 5})]


def test_a_result_that_is_not_an_object_is_wrapped(serve):
    server = serve(peek=answer([1, 2]))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        assert vmd.call("peek") == {"result": [1, 2]}


def test_opening_a_session_binds_the_connection_to_it(serve):
    server = serve()
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        vmd.call("session_open", os="debian")
        assert vmd.session_id == "s1"


def test_an_error_becomes_vmderror_with_code_message_and_data(serve):
    attempt = {"attempt": 1, "command": "pytest -q", "exit_code": 1}
    server = serve(finish=refuse(REFUSED, "REFUSED: your verification failed.", {"attempt": attempt}),
                   run=refuse(FAILED, "the guest is gone"))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        with pytest.raises(VmdError) as refused:
            vmd.call("finish", summary="s", verification={"command": "pytest -q"})
        assert (refused.value.code, refused.value.message, refused.value.method) == (
            REFUSED, "REFUSED: your verification failed.", "finish")
        assert refused.value.data == {"attempt": attempt}
        with pytest.raises(VmdError) as failed:
            vmd.call("run", command="ls")
        assert failed.value.code == FAILED and failed.value.data is None
        # an error leaves the connection usable
        assert vmd.call("session_status") == {"text": "ok"}
    assert server.connections == 1


# --- output while a call runs ----------------------------------------------------------------


def streams(*lines: tuple[str, str]) -> Handler:
    def handle(wire: Wire, request: dict) -> None:
        for stream, line in lines:
            wire.send({"method": "output", "params": {"stream": stream, "line": line}})
        wire.send({"id": request["id"], "result": {"exit_code": 0}})
    return handle


LINES = [("stdout", "building"), ("stderr", "warning: x"), ("stdout", "done")]


def test_output_lines_reach_the_callback_in_order_before_the_result(serve):
    server = serve(run=streams(*LINES))
    seen: list[tuple[str, dict]] = []
    with Vmd(server.path, timeout=WAIT_S, on_notify=lambda method, params: seen.append((method, params))) as vmd:
        assert vmd.call("run", command="make") == {"exit_code": 0}
    assert seen == [("output", {"stream": s, "line": line}) for s, line in LINES]


def test_a_callback_that_raises_never_breaks_the_call(serve):
    server = serve(run=streams(*LINES))
    seen = []

    def broken(method, params):
        seen.append(params["line"])
        raise RuntimeError("the terminal went away")

    with Vmd(server.path, timeout=WAIT_S, on_notify=broken) as vmd:
        assert vmd.call("run", command="make") == {"exit_code": 0}
    assert seen == ["building", "warning: x", "done"]


# --- BUSY --------------------------------------------------------------------------------------


def test_busy_is_an_error_the_caller_sees(serve):
    # A plain connection does not retry: BUSY is vmd at its connection limit, for the caller to judge.
    server = serve(session_status=refuse(BUSY, "vmd serves its connection limit already; retry later"))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        with pytest.raises(VmdError) as busy:
            vmd.call("session_status")
    assert busy.value.code == BUSY and server.methods() == ["session_status"]


def test_a_link_waits_through_busy_until_it_can_re_attach(serve, monkeypatch):
    monkeypatch.setattr(client, "RECONNECT_FIRST_S", 0.01)
    monkeypatch.setattr(client, "RECONNECT_MAX_S", 0.05)
    busy_left = [2]

    def attach(wire: Wire, request: dict) -> None:
        if busy_left[0]:
            busy_left[0] -= 1
            refuse(BUSY, "retry later")(wire, request)
        else:
            answer({"session_id": "s1", "state": "ready"})(wire, request)

    server = serve(session_attach=attach, session_status=answer({"state": "ready"}))
    vmd = Vmd(server.path, timeout=WAIT_S)
    vmd.call("session_open")
    link = SessionLink(vmd, wait_s=WAIT_S)
    server.close_connections()  # vmd restarted: the idle connection is gone
    time.sleep(0.05)
    assert within(WAIT_S, link.call, "session_status") == {"state": "ready"}
    assert server.methods().count("session_attach") == 3 and server.methods()[-1] == "session_status"
    link.close()


# --- a server that goes away ---------------------------------------------------------------------


def test_a_server_that_vanishes_mid_call_gives_in_flight_unavailable(serve):
    server = serve(run=vanish)
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        with pytest.raises(VmdUnavailable) as lost:
            within(WAIT_S, vmd.call, "run", command="make")
    assert lost.value.in_flight


def test_a_line_cut_short_gives_in_flight_unavailable(serve):
    def cut(wire: Wire, request: dict) -> bool:
        wire.raw(b'{"id": 1, "result": {"exit_')
        wire.vanish()
        return False

    server = serve(run=cut)
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        with pytest.raises(VmdUnavailable) as lost:
            within(WAIT_S, vmd.call, "run", command="make")
    assert lost.value.in_flight


def test_a_server_that_never_answers_ends_at_the_timeout(serve):
    server = serve(run=lambda wire, request: None)
    with Vmd(server.path, timeout=0.3) as vmd:
        with pytest.raises(VmdUnavailable) as lost:
            within(WAIT_S, vmd.call, "run", command="sleep 99")
    assert lost.value.in_flight


def test_abort_breaks_off_a_call_in_flight(serve):
    server = serve(run=lambda wire, request: None)
    vmd = Vmd(server.path)  # no timeout: only the abort can end the wait
    threading.Timer(0.2, vmd.abort).start()
    with pytest.raises(VmdUnavailable):
        within(WAIT_S, vmd.call, "run", command="sleep 99")
    vmd.close()


def test_no_server_is_unavailable_and_nothing_was_sent(tmp_path):
    with pytest.raises(VmdUnavailable) as missing:
        Vmd(tmp_path / "nothing.sock", timeout=WAIT_S).call("session_status")
    assert not missing.value.in_flight and "vmd serve" in str(missing.value)


def test_after_a_lost_connection_the_next_call_re_attaches_first(serve):
    server = serve(run=vanish, session_status=answer({"state": "ready"}))
    vmd = Vmd(server.path, timeout=WAIT_S)
    vmd.call("session_open")
    with pytest.raises(VmdUnavailable):
        vmd.call("run", command="make")
    assert vmd.call("session_status") == {"state": "ready"}
    assert server.requests[-2:] == [(2, "session_attach", {"session_id": "s1"}), (2, "session_status", {})]
    vmd.close()


def test_an_idle_connection_vmd_closed_is_replaced_before_the_verb_goes_out(serve):
    server = serve(session_status=answer({"state": "ready"}))
    vmd = Vmd(server.path, timeout=WAIT_S)
    vmd.call("session_open")
    server.close_connections()
    time.sleep(0.05)
    assert vmd.call("session_status") == {"state": "ready"}
    assert [(n, m) for n, m, _ in server.requests] == [(1, "session_open"), (2, "session_attach"),
                                                       (2, "session_status")]
    vmd.close()

