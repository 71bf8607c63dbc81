"""Warm machines on real guests (vmd/machines/warm_pool.py, parked_slot.py), with `vmd serve` as its
own process and a pool of one slot, parked (restored, woken and paused ahead): what a person
relies on when a session comes warm.

- it comes warm, in a fraction of a cold boot, and session_status says so;
- the project share is the session's own: the project's files (vmd's checkout of its history,
  moved into the parked guest's share at the hand-out) are there at the first command, a file
  written in the guest after the hand-out is on the host, and owners look as the guest's user's;
- two sessions handed out in a row are two machines: their own SSH host keys and
  machine-ids (the image bakes one of each), their own SSH NIC address, nothing of the first
  guest's own files in the second, and their clocks are the host's (a parked guest's stood
  still while it waited);
- a parked guest that is gone when a session asks is not handed out: the session comes up
  cold with a note saying why.

The saved slot's restore (the hand-out when nothing is parked) runs on real guests in
tests/vmd/machines/test_smb_share_vm.py and, as room templates do it, tests/vmd/machines/test_room_templates_vm.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.guests import wait_for
from tests.e2e.test_vmd_faults_vm import libvirt_conn, vmd_process, work  # noqa: F401 (fixtures)
from tests.support.vmd_wire import WireVmd

pytestmark = pytest.mark.vm

IDENTITY = ("cat /etc/machine-id; cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; date +%s; "
            "findmnt -n -o SOURCE /mnt/project; cat /sys/bus/pci/devices/0000:00:1e.0/virtio*/net/*/address")


def parked(state: Path) -> list[Path]:
    """Parked slots: paused, with parked.json (vmd/machines/parked_slot.py)."""
    warm = state / "warm"
    if not warm.is_dir():
        return []
    return [p for image in warm.iterdir() for p in image.iterdir()
            if p.name.endswith(".parked") and (p / "parked.json").is_file()]


def a_parked_slot(state: Path) -> Path:
    wait_for(lambda: len(parked(state)) == 1, 600, "a parked warm slot")
    return parked(state)[0]


def open_session(c: WireVmd, project: str) -> tuple[str, dict, dict]:
    """Open, plan, ready, and the first command: (session, ready, status with `took` from the
    open to the first command answered)."""
    started = time.monotonic()
    sid = c.call("session_open", os="debian", project=project, task="warm")["session_id"]
    c.call("plan_tasks", tasks=["look"])
    ready = c.call("session_ready", timeout=900)
    assert c.call("run", command="true", timeout=60)["exit_code"] == 0
    took = time.monotonic() - started
    status = c.call("session_status")
    status["took"] = took
    return sid, ready, status


def identity(c: WireVmd) -> list[str]:
    out = c.call("run", command=IDENTITY, timeout=60)["stdout"].split()
    assert len(out) == 5, out
    return out


def test_parked_hand_outs_are_fast_separate_machines_with_the_project_and_a_gone_one_boots_cold(
        work, debian_image, libvirt_conn):  # noqa: F811
    with vmd_process(work, debian_image, libvirt_conn, VMD_WARM_POOL_SIZE="1", VMD_WARM_PARKED="1") as vmd:
        state = vmd.state
        with WireVmd(vmd.socket, timeout=1200) as a:
            a_parked_slot(state)
            sid_a, ready_a, status_a = open_session(a, "warm-a")
            assert status_a["machine_came"] == "warm", status_a
            assert ready_a["came"] == "warm" and "warm machine handed out" in ready_a["text"], ready_a
            assert ready_a["facts"]["desktop"] and ready_a["facts"]["project_mounted"], ready_a
            assert "(warm, " in status_a["status_line"], status_a["status_line"]
            assert status_a["took"] < 20, f"a warm hand-out took {status_a['took']:.1f} s"
            machine_id_a, host_key_a, clock_a, share_a, mac_a = identity(a)
            assert abs(int(clock_a) - time.time()) < 30, "the parked guest's clock was not set"
            assert share_a == "project", share_a
            a.call("run", command="echo from-a > /mnt/project/a.txt; echo mine > ~/a-home.txt", timeout=60)
            project = state / "projects" / "local" / "warm-a"
            assert (project / "a.txt").read_text() == "from-a\n", "the share written after the hand-out is not on the host"
            a.call("session_close")  # a.txt is committed to the project's history

        with WireVmd(vmd.socket, timeout=1200) as b:
            a_parked_slot(state)  # the refill: booted, saved, parked
            sid_b, _, status_b = open_session(b, "warm-a")  # the same project, checked out anew
            assert status_b["machine_came"] == "warm", status_b
            machine_id_b, host_key_b, clock_b, _, mac_b = identity(b)
            assert machine_id_b != machine_id_a and host_key_b != host_key_a and mac_b != mac_a, (
                "two warm machines share an identity")
            assert abs(int(clock_b) - time.time()) < 30
            seen = b.call("run", command="cat /mnt/project/a.txt; stat -c %U /mnt/project /mnt/project/a.txt; "
                                         "ls ~/a-home.txt 2>&1; echo from-b > /mnt/project/b.txt", timeout=60)
            lines = seen["stdout"].splitlines()
            assert lines[:3] == ["from-a", "agent", "agent"], seen
            assert "No such file" in lines[3], "the second guest has the first one's files"
            assert (project / "b.txt").read_text() == "from-b\n"
            b.call("session_close")

        # A parked guest gone when a session asks (its QEMU died): not handed out, the session boots cold.
        gone = a_parked_slot(state)
        libvirt_conn.lookupByName("vmagent-w-" + gone.name.removesuffix(".parked")).destroy()
        with WireVmd(vmd.socket, timeout=1200) as c:
            sid_c, ready_c, status_c = open_session(c, "warm-c")
            assert status_c["machine_came"] == "cold", status_c
            assert "could not be handed out" in (status_c["came_note"] or ""), status_c
            assert not gone.exists(), "the gone parked slot's folder was kept"
            assert c.call("run", command="echo ok", timeout=60)["stdout"] == "ok\n"
            report = c.call("report")["markdown"]
            assert "booted cold" in report and "could not be handed out" in report, report
            c.call("session_close")
        print(f"parked hand-outs, open to first command: {status_a['took']:.1f} s and {status_b['took']:.1f} s; "
              f"cold after a gone parked guest: {status_c['took']:.1f} s")
