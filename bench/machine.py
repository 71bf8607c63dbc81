"""Benchmark of the machine layer, measured side by side in one run.

    .venv/bin/python bench/machine.py [--runs 30]

Prints: cold boot to ready (s); a warm hand-out from vmd's pool, the request to the first
command answered, both ways side by side: a saved slot restored (restore, SSH handshake, the
waking command that mounts the share and sets the clock, a runner's start:
vmd/machines/warm_pool.py) and a parked one resumed (the checks and renames that give it the
session's project, the resume, the clock set through the runner it kept:
vmd/machines/parked_slot.py), each part of each; a question's resume to the first command
answered; with their ratios to the cold boot; `run("true")` through vmd's runner in the guest
(vmd/guests/linux/in_guest/runner.py), through one exec channel per command on the persistent SSH
transport (the runner's fallback), and through a fresh `ssh` process per command (ms
each, and the ratios); screenshot capture to a
scaled PNG, every time (ms and bytes), and of an unchanged desktop, where the frame is
compared and not encoded again (ms). Both command paths alternate within one loop so that the
machine's noise hits them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from vmd.config import VmdConfig
from vmd.guests.linux.guest import LinuxGuest
from vmd.machines.host import local_host
from vmd.machines.images import find_image
from vmd.machines.machine import Machine
from vmd.machines.warm_pool import WarmPool
from vmd.private_fs import state_root
from vmd.projects.tree import present_to_guest, share_owner


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    image = find_image("debian")
    with tempfile.TemporaryDirectory(prefix="vmd-bench-") as tmp:
        os.chmod(tmp, 0o711)  # QEMU runs as its own user and must reach the guest's disk
        project = Path(tmp) / "project"
        project.mkdir()
        os.chmod(project, 0o777)  # QEMU's user writes here through the share
        started = time.monotonic()
        machine = Machine.create(image, name=f"bench-{uuid.uuid4().hex[:8]}",
                                 workdir=Path(tmp) / "work", project_dir=project)
        try:
            facts = machine.ready(timeout=600, desktop=True)
            boot_s = time.monotonic() - started
            ssh_cmd = ["ssh", "-q", "-i", str(image.path("ssh_key")), "-p", str(machine.ssh_port),
                       "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                       "-o", "BatchMode=yes", f"{image.user}@127.0.0.1", "true"]
            runner, persistent, fresh, shots, sizes, unchanged = [], [], [], [], [], []
            exec_guest = LinuxGuest(machine.guest.ssh, machine.guest.project_path, use_runner=False)
            machine.guest.run("true")  # the transport and the runner are up before timing starts
            exec_guest.run("true")
            for _ in range(args.runs):
                t = time.perf_counter()
                assert machine.guest.run("true").exit_code == 0
                runner.append(time.perf_counter() - t)
                t = time.perf_counter()
                assert exec_guest.run("true").exit_code == 0
                persistent.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(ssh_cmd, check=True)
                fresh.append(time.perf_counter() - t)
                t = time.perf_counter()
                shot = machine.screen._encode(machine.screen.grab_raw())  # the full path
                shots.append(time.perf_counter() - t)
                sizes.append(len(shot.png))
                machine.screen.screenshot()  # this frame is now the last one
                t = time.perf_counter()
                machine.screen.screenshot()  # nothing moved on the desktop in between
                unchanged.append(time.perf_counter() - t)
            # A question: vmd suspends the guest while it waits, and resumes it with the answer.
            machine.suspend()
            time.sleep(1)
            t = time.monotonic()
            machine.resume()
            assert machine.guest.run("true").exit_code == 0
            resume_s = time.monotonic() - t
        finally:
            machine.destroy()
        # A warm slot made as vmd's pool makes them, then handed out to a session's folder.
        # The state dir as vmd makes it (0711): QEMU's user passes through it to the slot's
        # folder; a plain 0700 temp folder stopped the slot at create.
        # vmd's settings in effect (VMD_ACCEL, …) over this run's state dir, on the local host.
        settings = VmdConfig.load(state_dir=str(state_root(Path(tmp) / "state")), warm_parked=1)
        pool = WarmPool(settings, local_host(settings.libvirt_uri), size=2)
        slot_boot = time.monotonic()
        pool.make_slot(image)
        slot_s = time.monotonic() - slot_boot
        pool.make_slot(image)  # the one parked below
        claimed = pool.take(image)
        assert claimed is not None
        # Where a hand-out's time goes, from the request to the first command answered:
        # the restore (libvirt reads the saved memory), the SSH handshake with the woken
        # guest, the one waking command (clock, share, facts: LinuxGuest.restored), the
        # first `run` a session makes.
        t = time.monotonic()
        warm = pool.hand_out(claimed, image, workdir=Path(tmp) / "warm", project_dir=project)
        try:
            restore_s = time.monotonic() - t
            warm.ssh.transport()
            ssh_s = time.monotonic() - t - restore_s
            warm_facts = warm.ready(timeout=600, desktop=True)
            handout_s = time.monotonic() - t
            wake_s = handout_s - restore_s - ssh_s
            assert warm_facts.project_mounted and warm_facts.desktop, warm_facts
            assert warm.guest.run("true").exit_code == 0
            first_run_s = time.monotonic() - t
        finally:
            warm.destroy()

        # The other slot parked (restored, woken, paused) as the pool's refill parks one, then
        # handed to a session whose project folder vmd has just checked out (a file in it).
        checkout = Path(tmp) / "checkout"
        checkout.mkdir()
        (checkout / "hello.txt").write_text("from the project\n")
        present_to_guest(checkout, share_owner(settings.share_user))
        t = time.monotonic()
        parked = pool.park_one(image)
        park_s = time.monotonic() - t
        assert parked is not None
        time.sleep(2)  # paused, as it waits for a session
        t = time.monotonic()
        warm, note = pool.machine_for(image, workdir=Path(tmp) / "parked", project_dir=checkout)
        try:
            assert warm is not None, note
            parked_handout_s = time.monotonic() - t
            parked_facts = warm.ready(timeout=600, desktop=True)
            parked_ready_s = time.monotonic() - t
            assert parked_facts.project_mounted and parked_facts.desktop, parked_facts
            first = warm.guest.run("cat hello.txt")
            assert first.stdout == "from the project\n", first
            parked_first_s = time.monotonic() - t
        finally:
            warm.destroy()

    r, p, f = median_ms(runner), median_ms(persistent), median_ms(fresh)
    print(f"accelerator                        {facts.accel}")
    print(f"cold boot to ready (desktop up)    {boot_s:8.1f} s")
    print(f"warm, restored: hand-out to ready  {handout_s:8.2f} s  (restore + share + clock + ready; "
          f"the slot took {slot_s:.1f} s to make)")
    print(f"  of it: restore {restore_s:.2f} s, SSH handshake {ssh_s:.2f} s, waking command {wake_s:.2f} s")
    print(f"warm, restored: request to first run answered {first_run_s:8.2f} s  "
          f"(first run {first_run_s - handout_s:.2f} s: the runner's start)")
    print(f"warm, parked: request to first run answered   {parked_first_s:8.2f} s  (parking it took {park_s:.1f} s "
          f"ahead of the request)")
    print(f"  of it: hand-out (checks, renames, resume) {parked_handout_s:.3f} s, clock + share "
          f"{parked_ready_s - parked_handout_s:.3f} s, first run {parked_first_s - parked_ready_s:.3f} s")
    print(f"restored / parked, to first run    {first_run_s / parked_first_s:8.1f} x")
    print(f"cold boot / warm hand-out (parked) {boot_s / parked_first_s:8.1f} x")
    print(f"resumed question to first command  {resume_s:8.1f} s")
    print(f"cold boot / resumed question       {boot_s / resume_s:8.1f} x")
    print(f"run('true'), runner in the guest   {r:8.1f} ms  (median of {args.runs}; "
          f"{machine.guest.runner_runs} through the runner, off: {machine.guest.runner_off or 'no'})")
    print(f"run('true'), exec channel          {p:8.1f} ms  (median of {args.runs})")
    print(f"run('true'), fresh ssh process     {f:8.1f} ms  (median of {args.runs})")
    print(f"fresh / persistent                 {f / r:8.1f} x")
    print(f"fresh / exec channel               {f / p:8.1f} x")
    print(f"screenshot to scaled PNG           {median_ms(shots):8.1f} ms, "
          f"{statistics.median(sizes) / 1024:.0f} KiB ({shot.width}x{shot.height})")
    print(f"screenshot, unchanged desktop      {median_ms(unchanged):8.1f} ms")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
