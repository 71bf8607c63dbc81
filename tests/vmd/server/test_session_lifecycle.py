"""vmd owns the end of every session (vmd/server/lifecycle.py), with the stand-in machines of
tests/support/vmd_fakes.py and a real VmdServer on a socket: adoption at start, the reaper, a
close during boot, a push retried until Gitea is back, a full disk."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support import guests
from tests.support.gitea_server import FakeGitea, _Handler
from tests.support.vmd_fakes import LocalMachines, make_config
from tests.support.http_stand_in import StandInHTTPServer
from vmagent.link import VmdError
from tests.support.vmd_wire import WireVmd
from vmd.projects.store import Publication
from vmd.server.rpc import VmdServer
from vmd.session import disk
from vmd.session import boot as session_boot
from vmd.session.record import read_record
from vmd.session.registry import Sessions

TOKEN = "lifecycle-token-0123456789abcdef"
FAST = dict(reaper_interval_s=0.1)


# The stand-in machines answer at once: look often.
wait_for = functools.partial(guests.wait_for, poll=0.05)


def state_of(config, sid: str) -> dict:
    return json.loads((config.sessions_dir / sid / "session.json").read_text())


def events(config, sid: str) -> list[dict]:
    return read_record(config.sessions_dir / sid / "record.jsonl")


def repo_files(config, project: str, owner: str = "local", ref: str = "main") -> str:
    git_dir = config.state_dir / "repos" / owner / f"{project}.git"
    return subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", "--name-only", ref],
                          capture_output=True, text=True, check=True).stdout


def repo_head(config, project: str, owner: str = "local") -> str:
    git_dir = config.state_dir / "repos" / owner / f"{project}.git"
    return subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "main"],
                          capture_output=True, text=True, check=True).stdout.strip()


def report_of(config, sid: str) -> str:
    from vmd.session.report import build_report
    return build_report(config.sessions_dir / sid / "record.jsonl").markdown


def running(machines: LocalMachines) -> list[str]:
    """The stand-in guests made and not destroyed."""
    return [name for name in machines.machines if name not in machines.destroyed]


@contextlib.contextmanager
def vmd(config, machines):
    server = VmdServer(config, machines).start()
    try:
        yield server
    finally:
        server.stop()


def client(config) -> WireVmd:
    """A client of vmd; it connects on its first call (or `with`)."""
    return WireVmd(config.socket, timeout=60)


def open_with_work(config, project: str = "kept", **open_args) -> tuple[WireVmd, str]:
    c = client(config)
    sid = c.call("session_open", project=project, task="keep this work", wait=True, **open_args)["session_id"]
    c.call("plan_tasks", tasks=["write it"])
    c.call("write_file", path="work.txt", content="written before the end\n")
    return c, sid


# --- clients are counted ----------------------------------------------------------------------

def test_each_bound_connection_counts_and_its_end_uncounts(tmp_path):
    config = make_config(tmp_path)
    with vmd(config, LocalMachines()) as server:
        a = client(config)
        sid = a.call("session_open", task="counted")["session_id"]
        assert a.call("session_status")["clients"] == 1
        b = client(config)
        b.call("session_attach", session_id=sid)
        b.call("session_attach", session_id=sid)  # the same session again: still one
        assert a.call("session_status")["clients"] == 2
        b.close()
        wait_for(lambda: a.call("session_status")["clients"] == 1, what="the count going down")
        a.close()
        [session] = server.sessions.live()
        wait_for(lambda: session.clients == 0 and session.detached_for() is not None)
        # The count drops in memory first and reaches session.json with the save just after
        # (a loaded host showed the file a moment behind): wait for the file, too.
        wait_for(lambda: state_of(config, sid)["clients"] == 0 and state_of(config, sid)["detached_at"],
                 what="session.json saying no client is attached")


# --- adoption at start ------------------------------------------------------------------------

def test_a_restarted_vmd_adopts_a_session_whose_machine_runs(tmp_path):
    machines = LocalMachines()  # the stand-in hypervisor outlives vmd, as libvirt's guests do
    config = make_config(tmp_path)
    with vmd(config, machines):
        c, sid = open_with_work(config)
        c.close()
    with vmd(config, machines) as server:
        # Re-bound at start, before any client asks.
        wait_for(lambda: machines.attached == [f"vmagent-{sid}"], what="the re-attach at start")
        [session] = server.sessions.live()
        assert session.adopted and session.s.id == sid
        wait_for(lambda: session.boot_done.is_set())
        assert session.boot_error is None and session.s.state == "ready"
        with client(config) as c:
            assert c.call("session_attach", session_id=sid)["state"] == "ready"
            assert c.call("run", command="cat work.txt")["stdout"] == "written before the end\n"
            assert c.call("session_status")["clients"] == 1
        assert machines.attached == [f"vmagent-{sid}"], "the client got the adopted session, not a second one"
    assert any(e["kind"] == "session" and e.get("event") == "adopt" for e in events(config, sid))
    assert running(machines) == [f"vmagent-{sid}"]  # not closed: it waits for its client


def test_a_restarted_vmd_closes_a_session_whose_machine_vanished(tmp_path):
    config = make_config(tmp_path)
    with vmd(config, LocalMachines()):
        c, sid = open_with_work(config)
        c.close()
    # Another hypervisor: the guest is gone (the host rebooted, someone undefined it).
    with vmd(config, LocalMachines()):
        wait_for(lambda: state_of(config, sid)["state"] == "closed", what="the close of the orphan")
        with client(config) as c:
            c.call("session_attach", session_id=sid)
            status = c.call("session_status")
            report = c.call("report")["markdown"]
    close = state_of(config, sid)["close"]
    assert close["ended_by"] == "vmd" and "machine gone" in close["reason"]
    assert close["text"].startswith("vmd closed the session: vmd restarted and found the session's machine gone")
    assert "work.txt" in repo_files(config, "kept")  # the folder was committed
    assert status["state"] == "closed" and status["push"]["state"] == "pushed"
    assert "vmd closed the session: vmd restarted and found the session's machine gone" in report
    assert "The machine was gone when vmd took the session up again" in report
    assert "The machine failed" not in report


# --- the reaper -------------------------------------------------------------------------------

def test_the_reaper_closes_a_session_whose_client_went_away(tmp_path):
    machines = LocalMachines()
    config = make_config(tmp_path, orphan_grace_s=1.0, **FAST)
    with vmd(config, machines):
        held, held_sid = open_with_work(config, project="held")
        gone, sid = open_with_work(config, project="gone")
        gone.close()  # its client died: the connection ends, nobody comes back
        started = time.monotonic()
        wait_for(lambda: state_of(config, sid)["state"] == "closed", what="the reaper's close")
        assert time.monotonic() - started >= 0.9, "closed before the grace period was over"
        assert f"vmagent-{sid}" in machines.destroyed
        # The session whose client stays is left alone, however long it is quiet.
        time.sleep(1.5)
        assert state_of(config, held_sid)["state"] == "ready" and running(machines) == [f"vmagent-{held_sid}"]
        held.call("session_close")
        held.close()
    close = state_of(config, sid)["close"]
    assert close["machine_destroyed"] is True and close["ended_by"] == "vmd"
    assert close["reason"].startswith("its client went away ") and "did not come back" in close["reason"]
    assert "work.txt" in repo_files(config, "gone")
    md = report_of(config, sid)
    assert "vmd closed the session: its client went away" in md and "did not come back" in md
    assert running(machines) == []


def test_a_session_waiting_for_a_person_keeps_its_machine_until_question_keep_s(tmp_path):
    machines = LocalMachines()
    config = make_config(tmp_path, orphan_grace_s=0.3, question_keep_s=2.0, **FAST)
    with vmd(config, machines):
        c, sid = open_with_work(config)
        c.call("run", command="true")
        c.call("ask_user", question="which colour?")
        c.close()  # the worker ends while the question waits: that is no orphan
        time.sleep(1.0)
        assert state_of(config, sid)["state"] == "question", "closed although it waits for a person"
        assert running(machines) == [f"vmagent-{sid}"] and machines.machines[f"vmagent-{sid}"].suspended
        wait_for(lambda: state_of(config, sid)["state"] == "closed", what="the close after question_keep_s")
    close = state_of(config, sid)["close"]
    assert "for a person's answer" in close["reason"] and close["machine_destroyed"] is True
    assert running(machines) == []
    assert "work.txt" in repo_files(config, "kept")


def test_an_adopted_session_nobody_comes_back_to_is_closed_by_the_reaper(tmp_path):
    machines = LocalMachines()
    config = make_config(tmp_path)
    with vmd(config, machines):
        c, sid = open_with_work(config)
        c.close()
    config = make_config(tmp_path, socket=config.socket, orphan_grace_s=0.5, **FAST)
    with vmd(config, machines):
        wait_for(lambda: state_of(config, sid)["state"] == "closed", what="the reaper's close")
    assert "its client went away" in state_of(config, sid)["close"]["reason"]
    assert running(machines) == []


# --- a close during boot ----------------------------------------------------------------------

class SlowCreate(LocalMachines):
    """libvirt taking its time to define and start a domain."""

    def __init__(self, create_seconds: float, **kwargs):
        super().__init__(**kwargs)
        self.create_seconds = create_seconds

    def create(self, spec):
        time.sleep(self.create_seconds)
        return super().create(spec)


def _report(config, sid: str) -> str:
    with client(config) as c:
        c.call("session_attach", session_id=sid)
        return c.call("report")["markdown"]


def test_a_close_while_the_machine_is_being_created_destroys_it(tmp_path):
    machines = SlowCreate(create_seconds=1.0)
    config = make_config(tmp_path)
    with vmd(config, machines):
        with client(config) as c:
            sid = c.call("session_open", project="early", task="closed at once")["session_id"]
            time.sleep(0.1)
            closed = c.call("session_close")
        assert closed["machine_destroyed"] is True, closed
        assert closed["machine"] == "destroyed before it was ready"
        assert "The session ended before the machine was ready; vmd destroyed what it had started." in closed["text"]
        assert machines.destroyed == [f"vmagent-{sid}"] and running(machines) == []
        md = _report(config, sid)
    assert "The session ended before the machine was ready; vmd destroyed what it had started." in md
    assert "The machine failed" not in md and "EOFError" not in md
    machine_events = [e["event"] for e in events(config, sid) if e["kind"] == "machine"]
    assert machine_events == ["stopped"]


def test_a_close_while_the_machine_boots_destroys_it_and_blames_no_machine(tmp_path):
    machines = LocalMachines(boot_seconds=1.5)  # created at once, answers after 1.5 s
    config = make_config(tmp_path)
    with vmd(config, machines):
        with client(config) as c:
            sid = c.call("session_open", task="closed while booting")["session_id"]
            time.sleep(0.3)
            closed = c.call("session_close")
            status = c.call("session_status")
        assert closed["machine_destroyed"] is True and running(machines) == []
        assert status["machine"] == "destroyed"
        md = _report(config, sid)
    assert "ended before the machine was ready" in closed["text"]
    assert "The session ended before the machine was ready" in md and "The machine failed" not in md
    assert state_of(config, sid)["state"] == "closed" and state_of(config, sid)["facts"] == {}


def test_a_close_before_the_boot_began_says_no_machine_was_started(tmp_path, monkeypatch):
    from vmd.contract.params import SessionOpen
    from vmd.session.handlers.end_verbs import close

    machines = LocalMachines()
    sessions = Sessions(make_config(tmp_path), machines)
    with monkeypatch.context() as patched:
        patched.setattr(session_boot, "start_machine", lambda session, attach: None)  # starts late
        session = sessions.open(SessionOpen(task="never booted"))
    session.ending.set()
    session_boot.start_machine(session, attach=False)  # sees the end before it creates anything
    closed = close(session)
    assert closed["machine_destroyed"] is False and closed["machine"] == "never started"
    assert machines.machines == {}
    assert "no machine had been started yet" in closed["text"]


def test_a_create_that_returns_after_the_close_gave_up_waiting_is_destroyed_then(tmp_path, monkeypatch):
    monkeypatch.setattr(session_boot, "BOOT_STOP_WAIT_S", 0.2)
    machines = SlowCreate(create_seconds=1.5)
    config = make_config(tmp_path)
    with vmd(config, machines):
        with client(config) as c:
            sid = c.call("session_open", task="libvirt is slow")["session_id"]
            closed = c.call("session_close")
        # The close says the truth: the machine was not there to destroy yet.
        assert closed["machine_destroyed"] is False and closed["machine"].startswith("still being created")
        wait_for(lambda: machines.destroyed == [f"vmagent-{sid}"], what="the late destroy")
        wait_for(lambda: state_of(config, sid)["close"]["machine_destroyed"] is True)
    assert running(machines) == []
    assert state_of(config, sid)["close"]["machine"].startswith("destroyed after the close")


def test_closes_at_every_moment_of_the_boot_leave_no_machine(tmp_path):
    machines = SlowCreate(create_seconds=0.3, boot_seconds=0.3)
    config = make_config(tmp_path)
    with vmd(config, machines):
        for delay in (0, 0.05, 0.2, 0.35, 0.5, 0.7, 1.0):
            with client(config) as c:
                c.call("session_open", task=f"close after {delay}")
                time.sleep(delay)
                closed = c.call("session_close")
                assert "failed" not in closed["machine"], closed
            assert running(machines) == [], f"a guest outlived its session closed after {delay} s"


# --- a push retried until Gitea is back -------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gitea_on(tmp_path: Path, port: int):
    """The Gitea stand-in of tests/support/gitea_server.py, on a port chosen beforehand (so that
    vmd's configured URL reaches it once it is up)."""
    root = tmp_path / "gitea-repos"
    root.mkdir(parents=True, exist_ok=True)
    gitea = FakeGitea(root=root, token=TOKEN)
    server = StandInHTTPServer(("127.0.0.1", port), type("Handler", (_Handler,), {"gitea": gitea}))
    gitea.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield gitea
    finally:
        server.shutdown()
        server.server_close()


def gitea_head(gitea: FakeGitea, owner: str, project: str) -> str:
    return subprocess.run(["git", "--git-dir", str(gitea.repo_path(owner, project)), "rev-parse", "main"],
                          capture_output=True, text=True, check=True).stdout.strip()


def gitea_config(tmp_path, port: int, **overrides):
    values = dict(gitea_url=f"http://127.0.0.1:{port}", gitea_token=TOKEN, gitea_owner_mode="user",
                  push_retry_backoff_s=0.2, push_retry_backoff_max_s=0.5)
    return make_config(tmp_path, **{**values, **overrides})


def test_a_push_that_failed_at_close_is_retried_until_gitea_is_back(tmp_path):
    port = free_port()
    config = gitea_config(tmp_path, port)
    with vmd(config, LocalMachines()):
        c, sid = open_with_work(config, project="later", owner="alice")  # Gitea is down
        closed = c.call("session_close")
        assert closed["pushed"] is False and closed["commit"]
        assert "not yet pushed" in closed["text"] and "retries the push in the background" in closed["text"]
        assert closed["push"]["state"] == "pending"
        assert "**not yet pushed**" in c.call("report")["markdown"]
        wait_for(lambda: c.call("session_status")["push"]["attempts"] >= 2, timeout=30,
                 what="a retry while Gitea is down")
        with gitea_on(tmp_path, port) as gitea:
            wait_for(lambda: c.call("session_status")["push"]["state"] == "pushed", timeout=30,
                     what="the push once Gitea is back")
            status = c.call("session_status")
            report = c.call("report")["markdown"]
            assert gitea_head(gitea, "alice", "later") == closed["commit"]
        c.close()
    assert status["push"]["pushed_at"] and status["push"]["attempts"] >= 3
    assert "pushed later, at " in report and closed["commit"][:12] in report
    saved = state_of(config, sid)
    assert saved["push"]["state"] == "pushed" and saved["close"]["pushed"] is True
    assert "Pushed later, at " in saved["close"]["text"]


def test_a_close_resolves_the_project_once_then_commits_and_pushes_that_commit(tmp_path, monkeypatch):
    # The close asked the project store four times, and each time the store built the
    # project's remote from vmd's configuration anew: one publication per close now.
    from vmd.projects import store

    made, real = [], store.remote_for
    monkeypatch.setattr(store, "remote_for", lambda config, owner, project, *rest: (
        made.append((owner, project)) or real(config, owner, project, *rest)))
    port = free_port()
    with gitea_on(tmp_path, port) as gitea:
        config = gitea_config(tmp_path, port)
        with vmd(config, LocalMachines()):
            c, sid = open_with_work(config, project="once", owner="alice")
            made.clear()  # the open's own (the history restored from Gitea)
            closed = c.call("session_close")
            c.close()
        assert made == [("alice", "once")]
        assert closed["pushed"] is True and closed["files"] == ["A work.txt"]
        assert gitea_head(gitea, "alice", "once") == closed["commit"] == repo_head(config, "once", owner="alice")


def test_a_pending_push_is_resumed_by_a_restarted_vmd(tmp_path):
    port = free_port()
    config = gitea_config(tmp_path, port, push_retry_backoff_s=60)  # no retry before the restart
    with vmd(config, LocalMachines()):
        c, sid = open_with_work(config, project="resumed", owner="alice")
        closed = c.call("session_close")
        c.close()
    assert state_of(config, sid)["push"]["state"] == "pending"
    with gitea_on(tmp_path, port) as gitea:
        config = gitea_config(tmp_path, port, socket=config.socket)
        # The retry is due in a minute: a restart that finds it does not wait past that,
        # so make it due now, as it would be after the wait.
        saved = state_of(config, sid)
        saved["push"]["next_at"] = time.time()
        (config.sessions_dir / sid / "session.json").write_text(json.dumps(saved))
        with vmd(config, LocalMachines()):
            wait_for(lambda: state_of(config, sid)["push"]["state"] == "pushed", timeout=30,
                     what="the resumed push")
        assert gitea_head(gitea, "alice", "resumed") == closed["commit"]
    assert any(e["kind"] == "push" and e["state"] == "pushed" for e in events(config, sid))


def test_a_push_refused_for_good_is_not_retried(tmp_path):
    port = free_port()
    with gitea_on(tmp_path, port) as gitea:
        gitea.reject_git = True  # a revoked token: waiting does not help
        config = gitea_config(tmp_path, port)
        with vmd(config, LocalMachines()):
            c, sid = open_with_work(config, project="refused", owner="alice")
            closed = c.call("session_close")
            c.close()
    assert closed["push"]["state"] == "failed" and "NOT pushed" in closed["text"]
    assert "refused the token" in closed["push_error"]


# --- a full disk ------------------------------------------------------------------------------

class Full:
    """Makes vmd's own writes of some files fail with ENOSPC while `on`."""

    def __init__(self, monkeypatch, *names: str):
        self.names = names
        self.on = False
        real = disk._write

        def write(path, fd, data):
            name = Path(path).name
            # "x.tmp" stands for the temporary copies of x, named ".x.<pid>.<random>.tmp"
            if self.on and any(name == n or (n.endswith(".tmp") and name.startswith(f".{n[:-4]}.")
                                             and name.endswith(".tmp")) for n in self.names):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, fd, data)

        monkeypatch.setattr(disk, "_write", write)


def test_a_full_disk_under_the_record_ends_the_session_with_a_report_that_says_so(tmp_path, monkeypatch):
    full = Full(monkeypatch, "record.jsonl")
    machines = LocalMachines()
    config = make_config(tmp_path, **FAST)
    with vmd(config, machines):
        c, sid = open_with_work(config)
        full.on = True
        with pytest.raises(VmdError) as err:
            c.call("run", command="cat work.txt")
        assert err.value.message.startswith("the host's disk is full: vmd could not write the session's record")
        assert "vmd ended the session" in err.value.message and "What was committed stays committed" in err.value.message
        assert running(machines) == []
        with pytest.raises(VmdError) as refused:
            c.call("run", command="true")
        assert "is closed" in refused.value.message
        report = c.call("report")["markdown"]  # from the record, with what the disk held back
        assert "vmd closed the session: the host's disk is full" in report
        full.on = False
        wait_for(lambda: any(e["kind"] == "close" for e in events(config, sid)), what="the record written later")
        c.close()
    assert "work.txt" in repo_files(config, "kept")
    for line in (config.sessions_dir / sid / "record.jsonl").read_text().splitlines():
        json.loads(line)  # no torn line


def test_a_guest_qemu_paused_on_a_full_host_disk_ends_the_session_and_the_waiting_verb_says_why(tmp_path):
    """The guest's overlay could not grow (the host's disk is full) and QEMU paused the
    guest, which answers nothing from then on: the reaper sees it, ends the session, and
    the verb that was waiting on the guest answers with the full disk, not a lost link."""
    from vmd.machines.port import Stall
    machines = LocalMachines()
    config = make_config(tmp_path, **FAST)
    with vmd(config, machines):
        c, sid = open_with_work(config)
        machines.machines[f"vmagent-{sid}"].stall = Stall(no_space=True, disks=["vda"])
        started = time.monotonic()
        with pytest.raises(VmdError) as err:
            c.call("run", command="echo still here")
        took = time.monotonic() - started
        message = err.value.message
        assert message.startswith("the host's disk is full: the guest's disk (vda) could not grow"), message
        assert "vmd ended the session" in message and "Free space on the host" in message, message
        assert took < 10, f"the waiting verb answered after {took:.1f} s"
        assert running(machines) == []
        status = c.call("session_status")
        assert status["state"] == "closed" and "QEMU paused the guest" in status["reason"], status
        assert "vmd closed the session: the host's disk is full" in c.call("report")["markdown"]
        c.close()
    assert "work.txt" in repo_files(config, "kept")


def test_a_full_disk_under_session_json_leaves_it_whole(tmp_path, monkeypatch):
    full = Full(monkeypatch, "session.json.tmp")
    config = make_config(tmp_path, **FAST)
    with vmd(config, LocalMachines()):
        c, sid = open_with_work(config)
        before = state_of(config, sid)
        full.on = True
        with pytest.raises(VmdError) as err:
            c.call("add_task", title="one more")
        assert err.value.message.startswith("the host's disk is full: vmd could not save")
        assert state_of(config, sid) == before  # the old file, whole
        assert not list((config.sessions_dir / sid).glob(".session.json.*.tmp"))  # the copy went
        full.on = False
        wait_for(lambda: state_of(config, sid)["state"] == "closed", what="session.json saved later")
        c.close()
    assert "the host's disk is full" in state_of(config, sid)["close"]["reason"]


def test_a_full_disk_at_a_checkpoint_ends_the_session_and_keeps_the_commits(tmp_path, monkeypatch):
    real = Publication.commit
    full = {"on": False}

    def commit(self, *args, **kwargs):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Publication, "commit", commit)
    config = make_config(tmp_path)
    with vmd(config, LocalMachines()):
        c, sid = open_with_work(config)
        kept = c.call("git_commit", message="the work so far")["commit"]
        full["on"] = True
        with pytest.raises(VmdError) as err:
            c.call("update_task", id=1, status="done")
        assert err.value.message.startswith("the host's disk is full: a commit into vmd's repository failed")
        report = c.call("report")["markdown"]
        c.close()
    assert repo_head(config, "kept") == kept  # what was committed stays committed
    close = state_of(config, sid)["close"]
    assert close["commit"] is None and "the host's disk is full" in close["push_error"]
    assert "vmd closed the session: the host's disk is full" in report


def test_an_append_cut_short_by_a_full_disk_leaves_no_half_line(tmp_path, monkeypatch):
    path = tmp_path / "record.jsonl"
    path.write_bytes(b'{"kept": 1}\n')

    def half(p, fd, data):
        import os
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk, "_write", half)
    with pytest.raises(OSError):
        disk.append(path, b'{"lost": 2}\n')
    assert path.read_bytes() == b'{"kept": 1}\n'


# --- vmd sessions -----------------------------------------------------------------------------

def test_vmd_sessions_lists_state_age_clients_and_machine(tmp_path, capsys):
    from vmd.server.cli import main

    config = make_config(tmp_path)
    with vmd(config, LocalMachines()):
        c, sid = open_with_work(config)
        done, closed_sid = open_with_work(config, project="done")
        done.call("session_close")
        done.close()
        assert main(["sessions", "--state-dir", str(config.state_dir), "--socket", str(config.socket),
                     "--no-libvirt", "--json"]) == 0
        rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows[sid]["state"] == "ready" and rows[sid]["clients"] == 1
        assert rows[sid]["machine_name"] == f"vmagent-{sid}" and rows[sid]["age_s"] >= 0
        assert rows[closed_sid]["state"] == "closed" and rows[closed_sid]["push"] == "pushed"
        assert main(["sessions", "--state-dir", str(config.state_dir), "--socket", str(config.socket),
                     "--no-libvirt"]) == 0
        text = capsys.readouterr().out
        assert "vmd answers on" in text and sid in text and "ready" in text
        c.close()
