"""vmd restarting under a running job, and a person cancelling one: a real vmd on a
socket (stand-in machines), restarted as a new `VmdServer` on the same config and socket
(the state dir persists, so `session_attach` re-loads the session), and the scripted
Ollama server. Ctrl-C is sent to `vmagent run` as a subprocess, the way a person does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.loop_harness import agent_config, call, calls, running_vmd, tool_results
from tests.support.ollama_server import Turn, start_ollama
from tests.vmagent.test_cli import environment
from tests.vmagent.loop.test_loop import PLAN, assert_closed_with_report, finish_script, run
from tests.support.vmd_fakes import LocalGuest
from vmagent.link import SessionLink, Vmd, VmdGone
from vmd.server.rpc import VmdServer

ROOT = Path(__file__).resolve().parents[3]


class Restarts:
    """Stops the test's vmd and starts a new one on the same config, socket and machines."""

    def __init__(self, vmd):
        self.vmd = vmd
        self.servers: list[VmdServer] = []
        self.threads: list[threading.Thread] = []
        self.stopped_at: float | None = None

    def restart(self, after_s: float | None) -> None:
        """vmd goes away now; a new one listens `after_s` later (None: never)."""
        self.stopped_at = time.monotonic()
        self.vmd.server.stop()
        if after_s is None:
            return

        def later() -> None:
            time.sleep(after_s)
            server = VmdServer(self.vmd.config, self.vmd.machines).start()
            self.servers.append(server)
            self.vmd.server = server

        thread = threading.Thread(target=later, daemon=True)
        thread.start()
        self.threads.append(thread)

    def __enter__(self) -> "Restarts":
        return self

    def __exit__(self, *exc) -> None:
        for thread in self.threads:
            thread.join(10)
        for server in self.servers:
            server.stop()


def session_json(vmd, session_id: str) -> dict:
    return json.loads((vmd.config.sessions_dir / session_id / "session.json").read_text())


def statuses(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e.get("type") == "status"]


# --- a vmd restart under a job ---------------------------------------------------------------


def test_a_vmd_restart_between_turns_is_ridden_out_and_the_job_finishes_verified(tmp_path):
    script = finish_script()
    second = script[1]
    with running_vmd(tmp_path) as vmd, Restarts(vmd) as restarts:
        def restart_then_work(body):
            restarts.restart(after_s=1.0)  # vmd dies while the model thinks, back a second later
            return second

        script[1] = restart_then_work
        with start_ollama(script) as server:
            events: list[dict] = []
            outcome = run(tmp_path, vmd, server, events=events,
                          config=agent_config(server, vmd_reconnect_s=30))
        record = vmd.record(outcome.session_id)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert_closed_with_report(vmd, outcome)
    shown = statuses(events)
    assert any(t.startswith("vmd went away during") and "waiting up to 30 s" in t for t in shown), shown
    assert any(t.startswith(f"vmd is back: re-attached to session {outcome.session_id}") for t in shown), shown
    # nothing was lost: the calls after the restart had not been sent, so they were sent then
    assert not any("INTERRUPTED" in r for body in server.chat_requests for r in tool_results(body))
    assert (vmd.project("hello") / "hello.py").read_text() == "print('hello')\n"
    # the new vmd took the session up again (it adopts the state dir's sessions at its start)
    assert any(e["kind"] == "session" and e.get("event") in ("attach", "adopt") for e in record)
    assert "vmd went away once" in outcome.report and "re-attached to the session" in outcome.report


def test_a_run_in_flight_when_vmd_restarts_is_answered_as_interrupted_and_not_run_again(tmp_path, monkeypatch):
    long_step = "echo once >> long-step.txt; sleep 1"
    script = [
        PLAN,
        calls(("write_file", {"path": "hello.py", "content": "print('hello')\n"}),
              ("run", {"command": long_step})),
        # the model reads the interrupted result, looks at the effects, and goes on
        calls(("run", {"command": "cat long-step.txt; python3 hello.py"}),
              ("update_task", {"id": 1, "status": "done", "note": "written"}),
              ("update_task", {"id": 2, "status": "done", "note": "prints hello"})),
        call("finish", {"summary": "hello.py prints hello",
                        "verification": {"command": "python3 hello.py | grep -q hello"}}),
    ]
    executed: list[str] = []
    original = LocalGuest.run
    with running_vmd(tmp_path) as vmd, Restarts(vmd) as restarts:
        def run_in_guest(self, command, timeout, cwd, on_output):
            executed.append(command)
            if command == long_step:
                restarts.restart(after_s=2.0)  # vmd dies while the command runs
            return original(self, command, timeout, cwd, on_output)

        monkeypatch.setattr(LocalGuest, "run", run_in_guest)
        with start_ollama(script) as server:
            events: list[dict] = []
            outcome = run(tmp_path, vmd, server, events=events,
                          config=agent_config(server, vmd_reconnect_s=30))
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert_closed_with_report(vmd, outcome)
    # the model was told, in the request after the fault, that the result was lost
    after = tool_results(server.chat_requests[2])
    lost = [r for r in after if "the command's result was lost when vmd restarted" in r]
    assert len(lost) == 1 and "Check its effects before running it again" in lost[0], after
    assert after[-2].startswith("wrote 15 bytes"), "the call before it was answered as usual"
    # ...and the command was never run again: once in the stand-in machine, one line written
    assert executed.count(long_step) == 1, executed
    assert (vmd.project("hello") / "long-step.txt").read_text() == "once\n"
    assert "1 tool call in flight lost its result" in outcome.report


def test_vmd_staying_away_past_the_bound_ends_the_job_failed_with_a_report(tmp_path):
    with running_vmd(tmp_path) as vmd, Restarts(vmd) as restarts:
        def vmd_dies(body):
            restarts.restart(after_s=None)
            return call("run", {"command": "true"})

        with start_ollama([PLAN, vmd_dies]) as server:
            events: list[dict] = []
            started = time.monotonic()
            outcome = run(tmp_path, vmd, server, task="survive vmd going away", events=events,
                          config=agent_config(server, vmd_reconnect_s=1.5))
            took = time.monotonic() - started
    assert outcome.state == "failed" and outcome.session_id
    assert took < 15, f"the bound is 1.5 s, the job took {took:.0f} s"
    report = outcome.report
    assert report.startswith("# vmagent job: survive vmd going away")
    assert "vmd went away during run and did not come back within 2 s" in report, report
    assert "vmd closes the session itself" in report and "nothing here was verified" in report
    assert any("waiting up to 2 s" in t for t in statuses(events)), statuses(events)
    assert events[-2] == {"type": "state", "state": "failed"}


def test_a_fresh_connection_is_re_attached_before_any_session_verb(tmp_path):
    """The client never sends a session verb on a connection vmd does not know bound."""
    with running_vmd(tmp_path) as vmd:
        client = Vmd(vmd.socket, timeout=30)
        sid = client.call("session_open", project="p", task="t").session_id
        client.call("plan_tasks", tasks=["one"])
        vmd.server.stop()
        restarted = VmdServer(vmd.config, vmd.machines).start()
        try:
            # the old connection is dead: the call goes out on a fresh one, attached first
            assert client.call("session_status").session_id == sid
            status = [e for e in vmd.record(sid) if e["kind"] == "verb" and e.get("verb") == "session_status"]
            assert status and "error" not in status[-1], "answered on a bound connection, not NO_SESSION"
        finally:
            client.close()
            restarted.stop()


def test_a_link_gives_up_on_a_session_vmd_no_longer_has(tmp_path):
    with running_vmd(tmp_path) as vmd:
        client = Vmd(vmd.socket, timeout=30)
        client.call("session_open", project="p", task="t")
        client.session_id = "s-19990101-000000-abcdef"  # a session this vmd never had
        client.abort()
        link = SessionLink(client, wait_s=10)
        with pytest.raises(VmdGone) as gone:
            link.call("session_status")
        assert "could not re-attach session s-19990101-000000-abcdef" in str(gone.value)
        assert link.gave_up and gone.value.seconds < 5
        client.close()


# --- a cancel reaches what is in flight ------------------------------------------------------


def test_a_cancel_breaks_off_a_long_run_and_closes_the_session(tmp_path):
    cancel = threading.Event()
    with running_vmd(tmp_path) as vmd:
        def long_run(body):
            threading.Timer(1.0, cancel.set).start()
            return call("run", {"command": "sleep 20; echo late > late.txt"})

        with start_ollama([PLAN, long_run]) as server:
            started = time.monotonic()
            outcome = run(tmp_path, vmd, server, cancel=cancel,
                          config=agent_config(server, cancel_grace_s=0.5))
            took = time.monotonic() - started
    assert outcome.state == "cancelled", outcome.report
    assert took < 10, f"a cancel waited {took:.0f} s for the command"
    record = assert_closed_with_report(vmd, outcome)
    assert "Cancelled by the user" in outcome.report and "broken off after 0.5 s" in outcome.report
    assert any(e["kind"] == "verb" and e.get("verb") == "session_cancel" for e in record)
    assert session_json(vmd, outcome.session_id)["state"] == "closed"
    assert all(m.destroyed for m in vmd.machines.machines.values())


def test_a_cancel_does_not_wait_for_a_slow_model(tmp_path):
    cancel = threading.Event()
    slow = Turn(content="Thinking very slowly about the plan. " * 3, chunk_chars=2, chunk_delay_s=0.5,
                tool_calls=PLAN.tool_calls)
    with running_vmd(tmp_path) as vmd, start_ollama([slow]) as server:
        threading.Timer(1.0, cancel.set).start()
        started = time.monotonic()
        outcome = run(tmp_path, vmd, server, cancel=cancel, config=agent_config(server, cancel_grace_s=0.5))
        took = time.monotonic() - started
    assert outcome.state == "cancelled" and took < 8, (took, outcome.report)
    assert outcome.steps == 0, "the model's unfinished answer was not used"
    assert_closed_with_report(vmd, outcome)


# --- Ctrl-C on `vmagent run` -----------------------------------------------------------------


class Terminal:
    """`vmagent run` as a subprocess whose stderr is read as it comes."""

    def __init__(self, env: dict[str, str], *args: str):
        # Ctrl-C reaches it as at a terminal even where pytest itself was started in the
        # background (a shell's background job ignores SIGINT, and its children inherit that).
        self.proc = subprocess.Popen([sys.executable, "-m", "vmagent.cli", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.err: list[str] = []
        self.out: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stderr, self.err), (self.proc.stdout, self.out))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.err):
            if self.proc.poll() is not None:
                time.sleep(0.5)  # what it printed last
                raise AssertionError(f"vmagent run ended ({self.proc.returncode}) before {text!r}:\n"
                                     + "".join(self.err) + "".join(self.out))
            assert time.monotonic() < deadline, f"no {text!r} on stderr:\n" + "".join(self.err)
            time.sleep(0.05)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(5)
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


LONG_RUN = [PLAN, call("run", {"command": "sleep 25; echo late > late.txt"})]


def test_ctrl_c_once_closes_the_session_and_prints_the_report(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(list(LONG_RUN)) as server:
        env = environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url, VMAGENT_CANCEL_GRACE_S="1")
        term = Terminal(env, "run", "write hello.py", "--project", "hello",
                        "--transcript", str(tmp_path / "transcript.json"))
        try:
            term.wait_for("$ sleep 25")
            time.sleep(0.5)
            pressed = time.monotonic()
            term.proc.send_signal(signal.SIGINT)
            code, out, err = term.finish(timeout=30)
            took = time.monotonic() - pressed
        finally:
            term.kill()
        session_id = json.loads((tmp_path / "transcript.json").read_text())["session_id"]
        record = vmd.record(session_id)
    assert code == 1, err + out
    assert took < 15, f"Ctrl-C took {took:.0f} s to close the session"
    assert "Ctrl-C again leaves it for vmd to close" in err
    assert out.startswith(f"# vmagent session {session_id}") and "Cancelled by the user" in out, out
    assert session_json(vmd, session_id)["state"] == "closed"
    assert any(e["kind"] == "close" for e in record)
    # vmd heard of the cancel at once, on a connection of its own, before the loop's close
    cancels = [i for i, e in enumerate(record) if e["kind"] == "verb" and e.get("verb") == "session_cancel"]
    close = next(i for i, e in enumerate(record) if e["kind"] == "close")
    assert cancels and cancels[0] < close
    assert all(m.destroyed for m in vmd.machines.machines.values())


def test_ctrl_c_twice_exits_130_at_once_and_leaves_the_session_to_vmd(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(list(LONG_RUN)) as server:
        env = environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url, VMAGENT_CANCEL_GRACE_S="20")
        term = Terminal(env, "run", "write hello.py", "--project", "hello",
                        "--transcript", str(tmp_path / "transcript.json"))
        try:
            term.wait_for("$ sleep 25")
            term.proc.send_signal(signal.SIGINT)
            term.wait_for("Ctrl-C again", timeout=10)
            pressed = time.monotonic()
            term.proc.send_signal(signal.SIGINT)
            code, out, err = term.finish(timeout=10)
            took = time.monotonic() - pressed
        finally:
            term.kill()
        session_id = json.loads((tmp_path / "transcript.json").read_text())["session_id"]
    assert code == 130, err + out
    assert took < 3, f"the second Ctrl-C took {took:.1f} s"
    assert f"session {session_id} is left for vmd to close" in err
    assert out == "", "no report: the session was not closed here"
    assert session_json(vmd, session_id)["state"] != "closed"
