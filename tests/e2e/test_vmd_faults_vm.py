"""Faults on real guests, with `vmd serve` as its own process (so that killing it is a real
restart): every fault ends in a committed report, and no guest outlives its session.

(a) a close within the first second of a boot, twenty times: no domain is left;
(b) the client SIGKILLed mid-session: vmd closes the session after the grace period,
    with the client's file committed in vmd's repository;
(c) vmd SIGKILLed while a session runs: the restarted vmd adopts the session (the same
    guest: same boot id), and closes it when no client comes back;
(d) Gitea down at close: "not yet pushed", then pushed later, the same commit.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.guests import clean_up_domains, domains_of, wait_for
from tests.vmd.server.test_session_lifecycle import TOKEN, free_port, gitea_head, gitea_on
from tests.support.host_dirs import passable_folder
from tests.support.vmd_process import VmdProcess
from tests.support.vmd_wire import WireVmd

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


@pytest.fixture
def libvirt_conn(debian_image):
    import libvirt

    conn = libvirt.open("qemu:///system")
    yield conn
    conn.close()


@pytest.fixture
def work():
    """vmd's folder for one test, outside pytest's temp root: QEMU (an unprivileged user)
    must pass through every folder above it, and other pytest runs on this host reset
    /tmp/pytest-of-<user> to 0700 whenever they start."""
    with passable_folder("vmd-faults-") as folder:
        yield folder


@contextlib.contextmanager
def vmd_process(work: Path, debian_image, libvirt_conn, **env):
    vmd = VmdProcess(work, debian_image.dir.parent, **env)
    try:
        yield vmd.start()
    finally:
        vmd.stop()
        clean_up_domains(libvirt_conn, str(work))


# --- (a) ---------------------------------------------------------------------------------------

def test_a_close_in_the_first_second_of_a_boot_leaves_no_guest(work, debian_image, libvirt_conn):
    with vmd_process(work, debian_image, libvirt_conn) as vmd:
        closes = []
        for attempt in range(20):
            started = time.monotonic()
            with WireVmd(vmd.socket, timeout=300) as c:
                sid = c.call("session_open", os="debian", task=f"closed early, {attempt}")["session_id"]
                time.sleep(attempt * 0.05)  # 0 to 0.95 s into the boot
                closed = c.call("session_close")
            closes.append((sid, closed, time.monotonic() - started))
            assert domains_of(libvirt_conn, str(work)) == [], (
                f"a guest outlived its session closed {attempt * 0.05:.2f} s into the boot: {closed}")
        for sid, closed, _ in closes:
            assert closed["machine"] in ("destroyed before it was ready", "never started"), closed
            assert closed["machine_destroyed"] is (closed["machine"] != "never started")
            machine = [e for e in vmd.record(sid) if e["kind"] == "machine"]
            assert [e["event"] for e in machine] in (["stopped"], []), machine
            assert not any(e.get("event") == "failed" for e in machine)
        # Fast: no close waited for a whole boot (30-40 s under TCG).
        assert max(seconds for _, _, seconds in closes) < 30, [round(s, 1) for *_, s in closes]


# --- (b) ---------------------------------------------------------------------------------------

CLIENT = textwrap.dedent("""
    import sys, time
    from vmagent.link import Vmd
    c = Vmd(sys.argv[1], timeout=1200).connect()
    sid = c.call("session_open", os="debian", project="killed", task="a client that dies").session_id
    print(sid, flush=True)
    c.call("plan_tasks", tasks=["write the file"])
    c.call("session_ready", timeout=1200)
    c.call("write_file", path="from-the-client.txt", content="written before the client died\\n")
    print("written", flush=True)
    time.sleep(3600)
""")


def test_a_client_killed_mid_session_is_closed_by_vmd(work, debian_image, libvirt_conn):
    with vmd_process(work, debian_image, libvirt_conn, VMD_ORPHAN_GRACE_S="5") as vmd:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(vmd.socket)], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True)
        try:
            sid = client.stdout.readline().strip()
            assert sid.startswith("s-"), sid
            assert client.stdout.readline().strip() == "written"
            assert domains_of(libvirt_conn, str(work)) == [f"vmagent-{sid}"]
            client.kill()  # SIGKILL: the worker dies without a word
            killed = time.monotonic()
        finally:
            if client.poll() is None:
                client.kill()
            client.wait()
        wait_for(lambda: vmd.session(sid)["state"] == "closed", 120, "vmd's close of the orphan")
        took = time.monotonic() - killed
        assert took >= 4.5, f"closed {took:.1f} s after the client died, before the grace period"
        assert domains_of(libvirt_conn, str(work)) == []
        close = vmd.session(sid)["close"]
        assert close["machine_destroyed"] is True and close["ended_by"] == "vmd"
        assert "its client went away" in close["reason"] and "did not come back" in close["reason"]
        assert "from-the-client.txt" in vmd.repo_files("killed")
        with WireVmd(vmd.socket, timeout=60) as c:
            c.call("session_attach", session_id=sid)
            report = c.call("report")["markdown"]
        assert "vmd closed the session: its client went away" in report
        assert close["commit"][:12] in report


# --- (c) ---------------------------------------------------------------------------------------

def test_a_killed_vmd_adopts_its_session_on_restart_and_closes_it_when_nobody_returns(
        work, debian_image, libvirt_conn):
    with vmd_process(work, debian_image, libvirt_conn, VMD_ORPHAN_GRACE_S="15") as vmd:
        with WireVmd(vmd.socket, timeout=1200) as c:
            sid = c.call("session_open", os="debian", project="survives", task="outlive vmd")["session_id"]
            c.call("plan_tasks", tasks=["check the guest stays the same"])
            c.call("session_ready", timeout=1200)
            boot_before = c.call("run", command=BOOT_ID)["stdout"].strip()
            c.call("run", command="echo before > /mnt/project/before.txt")
            vmd.kill()
        assert domains_of(libvirt_conn, str(work)) == [f"vmagent-{sid}"], "the guest outlives vmd"

        vmd.start()  # the same state dir and socket
        with WireVmd(vmd.socket, timeout=600) as c:
            assert c.call("session_attach", session_id=sid)["state"] == "ready"
            assert c.call("run", command=BOOT_ID)["stdout"].strip() == boot_before  # the same guest
            assert c.call("run", command="cat /mnt/project/before.txt")["stdout"] == "before\n"
            c.call("run", command="echo after > /mnt/project/after.txt")
        assert any(e["kind"] == "session" and e.get("event") == "adopt" for e in vmd.record(sid))
        # Nobody comes back now: the reaper closes it after the grace period.
        wait_for(lambda: vmd.session(sid)["state"] == "closed", 180, "the reaper's close")
        assert domains_of(libvirt_conn, str(work)) == []
        close = vmd.session(sid)["close"]
        assert "its client went away" in close["reason"] and close["machine_destroyed"] is True
        files = vmd.repo_files("survives")
        assert "before.txt" in files and "after.txt" in files


# --- (d) ---------------------------------------------------------------------------------------

def test_gitea_down_at_close_is_pushed_later_with_the_same_commit(work, tmp_path, debian_image, libvirt_conn):
    port = free_port()
    env = dict(GITEA_URL=f"http://127.0.0.1:{port}", GITEA_TOKEN=TOKEN, GITEA_OWNER_MODE="user",
               VMD_PUSH_RETRY_BACKOFF_S="1", VMD_PUSH_RETRY_BACKOFF_MAX_S="3")
    with vmd_process(work, debian_image, libvirt_conn, **env) as vmd:
        with WireVmd(vmd.socket, timeout=1200) as c:
            sid = c.call("session_open", os="debian", project="later", owner="alice",
                         task="pushed when Gitea is back")["session_id"]
            c.call("plan_tasks", tasks=["write it"])
            c.call("session_ready", timeout=1200)
            c.call("write_file", path="later.txt", content="pushed later\n")
            closed = c.call("session_close")
            assert closed["pushed"] is False and closed["commit"] and "not yet pushed" in closed["text"]
            assert closed["machine_destroyed"] is True
            assert domains_of(libvirt_conn, str(work)) == []
            assert "**not yet pushed**" in c.call("report")["markdown"]
            assert c.call("session_status")["push"]["state"] == "pending"
            with gitea_on(tmp_path, port) as gitea:
                wait_for(lambda: c.call("session_status")["push"]["state"] == "pushed", 120,
                         "the push once Gitea is back")
                assert gitea_head(gitea, "alice", "later") == closed["commit"]
            report = c.call("report")["markdown"]
        assert "pushed later, at " in report and closed["commit"][:12] in report
        assert vmd.session(sid)["push"]["state"] == "pushed"
