"""Warm machines on real guests (vmd/machines/warm_pool.py), with `vmd serve` as its own process and
a pool of one slot: what a person relies on when a session comes warm.

- it comes warm, in a fraction of a cold boot, and session_status says so;
- the project share is the session's own: a file written in the guest after the hand-out
  is on the host, and nothing of another session's folder shows;
- two sessions handed out in a row are two machines: their own SSH host keys and
  machine-ids (the image bakes one of each), their own SSH NIC address, and their clocks
  are the host's;
- a slot whose saved file is corrupt is discarded, and the session comes up cold with a
  note saying why.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.guests import wait_for
from tests.test_vmd_faults_vm import libvirt_conn, vmd_process, work  # noqa: F401 (fixtures)
from tests.vmd_wire import WireVmd

pytestmark = pytest.mark.vm

IDENTITY = ("cat /etc/machine-id; cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; date +%s; "
            "findmnt -n -o SOURCE /mnt/project; cat /sys/bus/pci/devices/0000:00:1e.0/virtio*/net/*/address")


def slots(state: Path) -> list[Path]:
    warm = state / "warm"
    if not warm.is_dir():
        return []
    return [p for image in warm.iterdir() for p in image.iterdir()
            if p.is_dir() and (p / "slot.json").is_file() and not p.name.startswith(".")
            and not p.name.endswith(".taken")]


def a_slot(state: Path) -> Path:
    wait_for(lambda: len(slots(state)) == 1, 600, "a warm slot")
    return slots(state)[0]


def open_session(c: WireVmd, project: str) -> tuple[str, dict, dict]:
    started = time.monotonic()
    sid = c.call("session_open", os="debian", project=project, task="warm")["session_id"]
    c.call("plan_tasks", tasks=["look"])
    ready = c.call("session_ready", timeout=900)
    took = time.monotonic() - started
    status = c.call("session_status")
    status["took"] = took
    return sid, ready, status


def identity(c: WireVmd) -> list[str]:
    out = c.call("run", command=IDENTITY, timeout=60)["stdout"].split()
    assert len(out) == 5, out
    return out


def test_warm_hand_outs_are_fast_separate_machines_and_a_corrupt_slot_boots_cold(work, debian_image,  # noqa: F811
                                                                                  libvirt_conn):  # noqa: F811
    with vmd_process(work, debian_image, libvirt_conn, VMD_WARM_POOL_SIZE="1") as vmd:
        state = vmd.state
        with WireVmd(vmd.socket, timeout=1200) as a:
            a_slot(state)
            sid_a, ready_a, status_a = open_session(a, "warm-a")
            assert status_a["machine_came"] == "warm", status_a
            assert ready_a["came"] == "warm" and "warm machine handed out" in ready_a["text"], ready_a
            assert "(warm, " in status_a["status_line"], status_a["status_line"]
            assert status_a["took"] < 20, f"a warm hand-out took {status_a['took']:.1f} s"
            machine_id_a, host_key_a, clock_a, share_a, mac_a = identity(a)
            assert abs(int(clock_a) - time.time()) < 30, "the restored guest's clock was not set"
            assert share_a == "project", share_a
            a.call("run", command="echo from-a > /mnt/project/a.txt", timeout=60)
            on_host = state / "projects" / "local" / "warm-a" / "a.txt"
            assert on_host.read_text() == "from-a\n", "the share written after the hand-out is not on the host"

            with WireVmd(vmd.socket, timeout=1200) as b:
                a_slot(state)  # the refill
                sid_b, _, status_b = open_session(b, "warm-b")
                assert status_b["machine_came"] == "warm", status_b
                machine_id_b, host_key_b, clock_b, _, mac_b = identity(b)
                assert machine_id_b != machine_id_a and host_key_b != host_key_a and mac_b != mac_a, (
                    "two warm machines share an identity")
                assert abs(int(clock_b) - time.time()) < 30
                listing = b.call("run", command="ls -A /mnt/project", timeout=60)["stdout"].split()
                assert "a.txt" not in listing, listing
                b.call("session_close")
            a.call("session_close")

        # A slot whose saved memory image is corrupt: discarded, and the session boots cold.
        broken = a_slot(state)
        saved = broken / "saved.img"
        with open(saved, "r+b") as fh:
            fh.seek(0)
            fh.write(b"\0" * 4096)
        with WireVmd(vmd.socket, timeout=1200) as c:
            sid_c, ready_c, status_c = open_session(c, "warm-c")
            assert status_c["machine_came"] == "cold", status_c
            assert "could not be handed out" in (status_c["came_note"] or ""), status_c
            assert not broken.exists(), "the corrupt slot was kept"
            assert c.call("run", command="echo ok", timeout=60)["stdout"] == "ok\n"
            report = c.call("report")["markdown"]
            assert "booted cold" in report and "could not be handed out" in report, report
            c.call("session_close")
        print(f"warm hand-outs: {status_a['took']:.1f} s and {status_b['took']:.1f} s; "
              f"cold after a corrupt slot: {status_c['took']:.1f} s")
