"""Benchmark of the machine layer, measured side by side in one run.

    .venv/bin/python bench/machine.py [--runs 30]

Prints: cold boot to ready (s), a warm hand-out from vmd's pool to ready (restore, share
mounted, clock set, desktop checked: vmd/machines/warm_pool.py) and a question's resume to the
first command answered, with their ratios to the cold boot; `run("true")` through vmd's runner in the guest
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
        settings = VmdConfig.load(state_dir=str(state_root(Path(tmp) / "state")))
        pool = WarmPool(settings, local_host(settings.libvirt_uri), size=1)
        slot_boot = time.monotonic()
        pool.make_slot(image)
        slot_s = time.monotonic() - slot_boot
        claimed = pool.take(image)
        assert claimed is not None
        t = time.monotonic()
        warm = pool.hand_out(claimed, image, workdir=Path(tmp) / "warm", project_dir=project)
        try:
            warm_facts = warm.ready(timeout=600, desktop=True)
            handout_s = time.monotonic() - t
            assert warm_facts.project_mounted and warm_facts.desktop, warm_facts
        finally:
            warm.destroy()

    r, p, f = median_ms(runner), median_ms(persistent), median_ms(fresh)
    print(f"accelerator                        {facts.accel}")
    print(f"cold boot to ready (desktop up)    {boot_s:8.1f} s")
    print(f"warm hand-out to ready             {handout_s:8.1f} s  (restore + share + clock + ready; "
          f"the slot took {slot_s:.1f} s to make)")
    print(f"cold boot / warm hand-out          {boot_s / handout_s:8.1f} x")
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
