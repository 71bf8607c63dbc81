"""The verb contract over the real socket, with a stand-in machine (tests/support/vmd_fakes.py)."""

from __future__ import annotations

import base64
import subprocess
import threading
import time

import pytest

from vmagent.link import VmdError
from tests.support.vmd_wire import WireVmd
from vmd.contract.errors import INVALID_PARAMS, METHOD_NOT_FOUND, NO_SESSION, REFUSED
from vmd.contract.params import VERBS
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.projects.repository import repository_path
from vmd.server.rpc import VmdServer
from vmd.session.handlers.session_verbs import PEEK_MAX_AGE_S
from tests.support.vmd_fakes import LocalMachines, local_vmd, make_config


@pytest.fixture
def vmd(tmp_path):
    with local_vmd(tmp_path) as running:
        yield running


def client(config, **kw) -> WireVmd:
    return WireVmd(config.socket, timeout=60, **kw).connect()


def test_unknown_verb_is_named_with_the_list_of_verbs(vmd):
    _, _, config = vmd
    with client(config) as c:
        with pytest.raises(VmdError) as err:
            c.call("rm_rf", path="/")
    assert err.value.code == METHOD_NOT_FOUND
    assert "rm_rf" in err.value.message and "plan_tasks" in err.value.message and "finish" in err.value.message


def test_bad_params_name_the_field_and_the_expected_shape(vmd):
    _, _, config = vmd
    with client(config) as c:
        c.call("session_open", os="debian")
        with pytest.raises(VmdError) as err:
            c.call("update_task", id="three", status="finished")
        assert err.value.code == INVALID_PARAMS
        assert "id" in err.value.message and "status" in err.value.message
        assert '"pending"|"in_progress"|"done"|"blocked"' in err.value.message
        with pytest.raises(VmdError) as err:
            c.call("run", comand="ls")
        assert err.value.code == INVALID_PARAMS
        assert "comand: not a param of run" in err.value.message and "command: required" in err.value.message
        assert "command: str" in err.value.message


def test_params_that_are_not_an_object_are_refused(vmd):
    _, _, config = vmd
    import json
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(config.socket))
    s.sendall(b'{"id": 7, "method": "run", "params": ["ls"]}\nnot json\n')
    reader = s.makefile("rb")
    first, second = json.loads(reader.readline()), json.loads(reader.readline())
    s.close()
    assert first["id"] == 7 and first["error"]["code"] == INVALID_PARAMS
    assert second["error"]["code"] == -32700


def test_verbs_need_a_bound_session(vmd):
    _, _, config = vmd
    with client(config) as c:
        with pytest.raises(VmdError) as err:
            c.call("session_status")
    assert err.value.code == NO_SESSION and "session_open" in err.value.message


def test_machine_verbs_before_a_plan_are_refused_with_the_reason(vmd):
    _, _, config = vmd
    with client(config) as c:
        c.call("session_open", os="debian", project="demo", task="make a demo")
        with pytest.raises(VmdError) as err:
            c.call("run", command="true")
        assert err.value.code == REFUSED
        assert err.value.message.startswith("REFUSED:") and "plan_tasks" in err.value.message
        # planning verbs work while the machine boots
        assert c.call("plan_tasks", tasks=["write", "test"])["tasks"].startswith("[ ] 1. write")
        assert c.call("run", command="true")["exit_code"] == 0


def test_every_verb_over_the_socket(vmd):
    server, machines, config = vmd
    lines: list[tuple[str, str]] = []
    c = client(config, on_notify=lambda m, p: lines.append((p["stream"], p["line"])) if m == "output" else None)
    opened = c.call("session_open", os="debian", project="everything", owner="alice", task="exercise the verbs")
    assert opened["project_share"] is True and opened["session_id"] == c.session_id
    assert "storage" in opened and opened["storage"]
    status = c.call("session_status")
    for key in ("planned", "tasks", "status_line", "question", "unfreeze_request", "cancelled"):
        assert key in status
    assert status["planned"] is False
    assert c.call("note", turn=1, text="starting")["ok"] is True
    assert c.call("web_source", kind="search", target="frob docs", detail="3 results (searxng)")["ok"] is True
    c.call("plan_tasks", tasks=["files", "screen"])
    assert c.call("add_task", title="people")["id"] == 3
    c.call("update_task", id=1, status="in_progress")
    ready = c.call("session_ready", timeout=30)
    assert ready["ready"] is True and "facts" in ready and "seconds" in ready

    run = c.call("run", command="echo one; echo two >&2; exit 3")
    assert run["exit_code"] == 3 and run["stdout"] == "one\n" and "two" in run["stderr"]
    assert ("stdout", "one") in lines and ("stderr", "two") in lines
    assert c.call("write_file", path="a.txt", content="hello\nworld\n")["bytes"] == 12
    assert c.call("append_file", path="a.txt", content="more\n")["bytes"] == 5
    assert c.call("read_file", path="a.txt", offset=0, limit=5)["content"] == "hello"
    c.call("edit_file", path="a.txt", old="world", new="there")
    with pytest.raises(VmdError) as err:
        c.call("edit_file", path="a.txt", old="e", new="E")
    assert "matched" in err.value.message
    names = [e["name"] for e in c.call("list_dir", path=".")["entries"]]
    assert "a.txt" in names
    commit = c.call("git_commit", message="first files")["commit"]
    assert len(commit) == 40

    shot = c.call("screenshot")
    assert base64.b64decode(shot["png_base64"]).startswith(b"\x89PNG")
    steps = c.call("session_status")["steps"]
    peek = c.call("peek")  # the preview's look: a PNG, but not a step of the session
    assert peek["available"] and base64.b64decode(peek["png_base64"]).startswith(b"\x89PNG")
    assert c.call("session_status")["steps"] == steps
    # The agent's look is always of the screen now; the preview's may reuse one a moment old.
    assert machines.shots[-2:] == [0.0, PEEK_MAX_AGE_S] and 0 < PEEK_MAX_AGE_S <= 2
    c.call("click", x=1, y=2, button="right", double=True)
    c.call("move", x=3, y=4)
    c.call("type", text="hi")
    c.call("key", keys="ctrl+alt+t")
    c.call("scroll", x=5, y=6, amount=-2)
    with pytest.raises(VmdError) as err:
        c.call("key", keys="nonsense")
    assert "unknown key" in err.value.message
    assert machines.input[:5] == [("click", 1, 2, "right", True), ("move", 3, 4), ("type", "hi"),
                                  ("key", "ctrl+alt+t"), ("scroll", 5, 6, -2)]
    assert "started" in c.call("launch_app", path="xterm", args=["-e", "true"])["text"]
    assert c.call("wait", seconds=0.01)["seconds"] == 0.01
    assert c.call("check_internet")["online"] is False
    assert machines.probes == [config.internet_probe], "the probe goes to the configured host"
    assert "seconds" in c.call("reboot_vm")

    assert c.call("ask_user", question="which colour?")["state"] == "question"
    machine = machines.machines[f"vmagent-{c.session_id}"]
    assert machine.suspended
    assert c.call("session_status")["question"] == "which colour?"
    with pytest.raises(VmdError) as err:
        c.call("run", command="true")
    assert err.value.code == REFUSED
    assert "blue" in c.call("session_resume", answer="blue")["text"]
    assert not machine.suspended
    assert c.call("request_unfreeze", reason="pip install")["state"] == "unfreeze"
    assert c.call("session_status")["unfreeze_request"] == "pip install"
    assert "approved" in c.call("session_resume", approved=True)["text"]
    assert machine.egress is True

    for task in (1, 2, 3):
        c.call("update_task", id=task, status="done")
    finished = c.call("finish", summary="done", verification="grep -q there a.txt")
    assert finished["accepted"] is True and finished["outcome"]["exit_code"] == 0
    # The eval's check: its files in a folder of their own, the command in the project folder.
    # A pass is an exit as expected and vmd's nonce written back out of band.
    hidden = c.call("hidden_check", command='test -f a.txt && test "$(cat "$CHECK_DIR/want")" = there && '
                    'cat "$CHECK_DIR/.nonce" > "$CHECK_RESULT"', files={"want": "there"})
    assert hidden["passed"] is True and hidden["exit_code"] == 0 and hidden["where"] == "clean_room"
    assert hidden["candidate"] == c.call("session_status")["outcome"]["candidate"]  # nothing changed since
    assert c.call("hidden_check", command="exit 4")["passed"] is False
    bare = c.call("hidden_check", command="test -f a.txt")  # exit 0 alone
    assert bare["passed"] is False and bare["exited_as_expected"] is True and "wrote no result" in bare["text"]
    assert not (config.projects_dir / "alice" / "everything" / "want").exists(), "the check's files stay out"
    report = c.call("report")
    assert "# vmagent session" in report["markdown"] and report["outcome"]["status"] == "passed"
    closed = c.call("session_close")
    assert closed["closed"] is True and closed["pushed"] is True and len(closed["commit"]) == 40
    assert machine.destroyed
    again = c.call("session_close")
    assert again["commit"] == closed["commit"] and again["text"].startswith("already closed")
    bare = repository_path(config.state_dir, "alice", "everything")
    log = subprocess.run(["git", "--git-dir", str(bare), "log", "--format=%H", "main"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert log[0] == closed["commit"] and commit in log
    assert c.call("session_cancel")["cancelled"] is True
    with pytest.raises(VmdError) as err:
        c.call("run", command="true")
    assert "closed" in err.value.message
    c.close()
    verbs_seen = {line for line in (config.sessions_dir / closed_session(config) / "record.jsonl").read_text().split("\"verb\": \"")[1:]}
    served = {v.split('"')[0] for v in verbs_seen}
    assert set(VERBS) - {"session_open", "session_attach", "peek", "history", "host_info"} <= served
    assert "peek" not in served  # a watcher's look is not something the agent did


def closed_session(config) -> str:
    return next(p.name for p in config.sessions_dir.iterdir())


def test_two_sessions_at_once_on_separate_connections(vmd):
    _, _, config = vmd
    a, b = client(config), client(config)
    a.call("session_open", project="one")
    b.call("session_open", project="two")
    assert a.session_id != b.session_id
    a.call("plan_tasks", tasks=["only in a"])
    b.call("plan_tasks", tasks=["only in b", "second in b"])
    results = {}

    def work(name, c):
        results[name] = c.call("run", command=f"sleep 0.3; echo {name} > who.txt; cat who.txt")["stdout"]

    threads = [threading.Thread(target=work, args=(n, c)) for n, c in (("a", a), ("b", b))]
    started = time.monotonic()
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert time.monotonic() - started < 1.5  # served side by side, not one after the other
    assert results == {"a": "a\n", "b": "b\n"}
    assert "only in a" in a.call("session_status")["tasks"] and "only in b" not in a.call("session_status")["tasks"]
    assert (config.projects_dir / "local" / "one" / "who.txt").read_text() == "a\n"
    assert (config.projects_dir / "local" / "two" / "who.txt").read_text() == "b\n"
    a.close()
    b.close()


def test_attach_after_a_restart_of_the_server(tmp_path):
    machines = LocalMachines()
    config = make_config(tmp_path)
    first = VmdServer(config, machines).start()
    c = client(config)
    sid = c.call("session_open", project="kept", task="survive a restart")["session_id"]
    c.call("plan_tasks", tasks=["before", "after"])
    c.call("update_task", id=1, status="done")
    c.call("run", command="echo x > x.txt")
    c.call("ask_user", question="may I?")
    c.close()
    first.stop()

    second = VmdServer(config, machines).start()
    try:
        c = client(config)
        attached = c.call("session_attach", session_id=sid)
        assert attached["state"] == "question"
        status = c.call("session_status")
        assert status["question"] == "may I?" and "[x] 1. before" in status["tasks"]
        c.call("session_resume", answer="yes")  # waits for the re-attach, done in the background
        assert f"vmagent-{sid}" in machines.attached
        assert c.call("run", command="cat x.txt")["stdout"] == "x\n"
        c.call("update_task", id=2, status="done")
        assert c.call("finish", verification={"command": "test -f x.txt"})["accepted"] is True
        with pytest.raises(VmdError) as err:
            c.call("session_attach", session_id="s-19990101-000000-abcdef")
        assert "no session" in err.value.message
        c.close()
    finally:
        second.stop()


def test_a_missing_image_fails_the_boot_and_session_ready_says_so(tmp_path):
    config = make_config(tmp_path)
    server = VmdServer(config, LibvirtMachines(config)).start()
    try:
        with client(config) as c:
            c.call("session_open", os="debian", project="noimage")
            assert c.call("plan_tasks", tasks=["plan works"])["tasks"]
            with pytest.raises(VmdError) as err:
                c.call("session_ready", timeout=20)
            assert "vmd images build debian" in err.value.message
            assert c.call("session_status")["machine"].startswith("failed")
            with pytest.raises(VmdError) as err:
                c.call("run", command="true")
            assert "vmd images build" in err.value.message
            (config.projects_dir / "local" / "noimage" / "kept.txt").write_text("host side\n")
            closed = c.call("session_close")
            assert closed["commit"] and closed["pushed"]
            assert "Commit" in c.call("report")["markdown"]
    finally:
        server.stop()
