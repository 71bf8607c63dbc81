"""One whole session on a real guest, through the socket: open, plan, ready, run, write
a file to the project, update tasks, finish with verification, close, report."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.vmd_wire import WireVmd
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.server.rpc import VmdServer
from tests.support.gitea_server import start_gitea
from tests.vmd.server.test_private_state import entries, loose, readable_as
from tests.support.vmd_fakes import make_config

TOKEN = "gitea-token-the-guest-must-never-see"

pytestmark = pytest.mark.vm


@pytest.fixture
def gitea(tmp_path):
    with start_gitea(tmp_path, token=TOKEN) as server:
        yield server


def test_one_whole_session_on_a_real_guest(tmp_path, debian_image, gitea):
    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=900, verify_timeout_s=300,
                         gitea_owner_mode="user",
                         gitea_url=gitea.url, gitea_token=TOKEN)
    server = VmdServer(config, LibvirtMachines(config)).start()
    lines: list[str] = []
    c = WireVmd(config.socket, timeout=1200, on_notify=lambda m, p: lines.append(p.get("line", ""))).connect()
    try:
        opened = c.call("session_open", os="debian", project="whole", owner="alice",
                        task="Add greet.py that prints hello")
        assert opened["project_share"] is True
        c.call("plan_tasks", tasks=["write greet.py", "check it runs"])  # while the guest boots
        ready = c.call("session_ready", timeout=900)
        assert ready["facts"]["project_path"] and ready["seconds"] > 0
        assert ready["facts"]["desktop"] is True  # handed over with its desktop up
        c.call("update_task", id=1, status="in_progress")
        c.call("write_file", path="greet.py", content="print('hello from the guest')\n")
        c.call("update_task", id=1, status="done")
        run = c.call("run", command="python3 greet.py && uname -s")
        assert run["exit_code"] == 0 and "hello from the guest" in run["stdout"]
        assert "hello from the guest" in lines  # live output came as notifications
        env = c.call("run", command="env; cat /mnt/project/.git/config 2>/dev/null; true")
        assert TOKEN not in env["stdout"]
        c.call("update_task", id=2, status="done")
        finished = c.call("finish", summary="greet.py prints hello",
                          verification={"command": "python3 greet.py | grep -q hello", "expect_exit": 0})
        assert finished["accepted"] and finished["outcome"]["passed"]
        closed = c.call("session_close")
        assert closed["pushed"] and closed["machine_destroyed"]
        report = c.call("report")
    finally:
        try:
            c.call("session_close")
        finally:
            c.close()
            server.stop()
    project = config.projects_dir / "alice" / "whole"
    assert (project / "greet.py").read_text() == "print('hello from the guest')\n"
    head = subprocess.run(["git", "--git-dir", str(gitea.repo_path("alice", "whole")), "rev-parse", "main"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert head == closed["commit"]  # the commit is in the Gitea repository
    assert any(s["state"] == "success" for s in gitea.statuses[f"alice/whole@{head}"])
    md = report["markdown"]
    assert report["outcome"]["status"] == "passed"
    assert closed["web_url"] in md and "`A greet.py`" in md
    # The project folder is all the guest ever shared with the host: no token in it,
    # nor in the record or the report.
    for path in project.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    record = next(config.sessions_dir.glob("*/record.jsonl")).read_text()
    assert TOKEN not in record and TOKEN not in md
    # vmd's state after a whole session on a real guest (QEMU, libvirt's relabelling, the
    # share) is its own: another uid opens nothing in it, and no mode lets it.
    assert loose(config) == []
    assert readable_as(65534, 65534, entries(config.state_dir)) == []
