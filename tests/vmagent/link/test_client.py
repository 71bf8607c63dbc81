"""vmagent/link/unix_socket.py `Vmd` against a server on a real Unix socket that speaks vmd's wire
protocol and does what each test tells it: a result (answered as the verb's result model,
or refused when it does not fit it), an error with data, output lines while a call runs,
BUSY, or vanishing mid-call. Every wait is short: a client that
hangs fails the test instead of stalling the run."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from typing import Callable

import pytest

from tests.support.vmd_fakes import short_socket_dir
from vmagent.link import ResultUnfit, SessionLink, Vmd, VmdError, VmdUnavailable
from vmagent.link import session_link as client
from vmd.contract.errors import BUSY, FAILED, INTERNAL_ERROR, REFUSED
from vmd.contract.results import PeekResult, RunResult, SessionStatusResult

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


# Whole answers, as vmd gives them (vmd/contract/results.py): the client checks each against its model.
OPENED = {"session_id": "s1", "text": "opened", "os": "debian", "os_family": "linux", "project": None,
          "project_share": False, "storage": "nothing is kept", "state": "booting"}
STATUS = {"session_id": "s1", "state": "ready", "planned": True, "tasks": "1. [ ] it", "status_line": "ready",
          "text": "ready", "question": "", "unfreeze_request": "", "cancelled": False, "steps": 2, "machine": "ready",
          "outcome": None, "push": None, "clients": 1, "detached_s": None, "ended_by": None, "reason": None}


def ran(text: str = "ran", **fields) -> dict:
    return {"text": text, "exit_code": 0, "stdout": "", "stderr": "", "duration": 0.1, "truncated": False,
            "timed_out": False, **fields}


@pytest.fixture
def serve():
    servers: list[ScriptedVmd] = []

    def start(**handlers: Handler) -> ScriptedVmd:
        handlers.setdefault("session_open", answer(OPENED))
        handlers.setdefault("session_status", answer(STATUS))
        handlers.setdefault("session_attach", answer(lambda p: {"session_id": p["session_id"], "state": "ready",
                                                                "text": "attached"}))
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


def test_a_result_comes_back_as_its_verbs_model(serve):
    server = serve(run=answer(lambda p: ran(f"ran {p['command']}", stdout="a\n", later_key="kept")))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        result = vmd.call("run", command="ls", timeout=5)
    assert isinstance(result, RunResult) and (result.exit_code, result.text, result.stdout) == (0, "ran ls", "a\n")
    # A key a newer vmd adds is kept, not a reason to refuse the answer.
    assert result.model_dump(exclude_unset=True) == ran("ran ls", stdout="a\n", later_key="kept")
    assert server.requests == [(1, "run", {"command": "ls", "timeout": 5})]


def test_a_result_missing_a_field_is_refused_with_a_sentence_naming_it(serve):
    cut = ran("ran ls")
    del cut["stdout"]
    server = serve(run=answer(cut), peek=answer({"available": "maybe", "text": "no screen"}),
                   session_status=answer(STATUS))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        with pytest.raises(ResultUnfit) as unfit:
            vmd.call("run", command="ls")
        assert isinstance(unfit.value, VmdError) and unfit.value.code == INTERNAL_ERROR
        assert unfit.value.method == "run"
        assert "vmd's answer to run does not fit its contract (RunResult): stdout: Field required" in unfit.value.message
        assert "update the older of the two" in unfit.value.message
        with pytest.raises(ResultUnfit, match=r"\(PeekResult\): available: Input should be a valid boolean"):
            vmd.call("peek")
        # the connection stays usable
        assert isinstance(vmd.call("session_status"), SessionStatusResult)
    assert server.connections == 1


def test_a_result_that_is_not_an_object_is_refused(serve):
    server = serve(peek=answer([1, 2]))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        with pytest.raises(ResultUnfit, match=r"vmd's answer to peek is a list, not an object \(PeekResult\)"):
            vmd.call("peek")


def test_nested_answers_are_models_too(serve):
    outcome = {"command": "pytest -q", "cwd": None, "expect_exit": 0, "exit_code": 0, "passed": True,
               "proven": True, "timed_out": False, "duration": 1.0, "output_tail": "ok",
               "baseline": {"exit_code": 1, "passed": False}, "attempts": 1}
    push = {"state": "pending", "attempts": 2, "sha": "abc", "web_url": None, "error": "Gitea is down",
            "pushed_at": None, "next_try": "2026-01-01T00:00:10+00:00", "retry_until": "2026-01-01T01:00:00+00:00"}
    server = serve(session_status=answer({**STATUS, "state": "closed", "outcome": outcome, "push": push}),
                   peek=answer({"available": False, "text": "no screen"}))
    with Vmd(server.path, timeout=WAIT_S) as vmd:
        status = vmd.call("session_status")
        seen = vmd.call("peek")
    assert status.outcome.baseline.exit_code == 1 and status.outcome.proven is True
    assert status.push.state == "pending" and status.push.error == "Gitea is down"
    assert isinstance(seen, PeekResult) and seen.available is False and seen.png_base64 is None


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
        assert vmd.call("session_status").status_line == "ready"
    assert server.connections == 1


# --- output while a call runs ----------------------------------------------------------------


def streams(*lines: tuple[str, str]) -> Handler:
    def handle(wire: Wire, request: dict) -> None:
        for stream, line in lines:
            wire.send({"method": "output", "params": {"stream": stream, "line": line}})
        wire.send({"id": request["id"], "result": ran()})
    return handle


LINES = [("stdout", "building"), ("stderr", "warning: x"), ("stdout", "done")]


def test_output_lines_reach_the_callback_in_order_before_the_result(serve):
    server = serve(run=streams(*LINES))
    seen: list[tuple[str, dict]] = []
    with Vmd(server.path, timeout=WAIT_S, on_notify=lambda method, params: seen.append((method, params))) as vmd:
        assert vmd.call("run", command="make").exit_code == 0
    assert seen == [("output", {"stream": s, "line": line}) for s, line in LINES]


def test_a_callback_that_raises_never_breaks_the_call(serve):
    server = serve(run=streams(*LINES))
    seen = []

    def broken(method, params):
        seen.append(params["line"])
        raise RuntimeError("the terminal went away")

    with Vmd(server.path, timeout=WAIT_S, on_notify=broken) as vmd:
        assert vmd.call("run", command="make").exit_code == 0
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
            answer({"session_id": "s1", "state": "ready", "text": "attached"})(wire, request)

    server = serve(session_attach=attach, session_status=answer(STATUS))
    vmd = Vmd(server.path, timeout=WAIT_S)
    vmd.call("session_open")
    link = SessionLink(vmd, wait_s=WAIT_S)
    server.close_connections()  # vmd restarted: the idle connection is gone
    time.sleep(0.05)
    assert within(WAIT_S, link.call, "session_status").state == "ready"
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
    server = serve(run=vanish, session_status=answer(STATUS))
    vmd = Vmd(server.path, timeout=WAIT_S)
    vmd.call("session_open")
    with pytest.raises(VmdUnavailable):
        vmd.call("run", command="make")
    assert vmd.call("session_status").state == "ready"
    assert server.requests[-2:] == [(2, "session_attach", {"session_id": "s1"}), (2, "session_status", {})]
    vmd.close()


def test_an_idle_connection_vmd_closed_is_replaced_before_the_verb_goes_out(serve):
    server = serve(session_status=answer(STATUS))
    vmd = Vmd(server.path, timeout=WAIT_S)
    vmd.call("session_open")
    server.close_connections()
    time.sleep(0.05)
    assert vmd.call("session_status").state == "ready"
    assert [(n, m) for n, m, _ in server.requests] == [(1, "session_open"), (2, "session_attach"),
                                                       (2, "session_status")]
    vmd.close()

