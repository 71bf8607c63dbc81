"""Benchmark of the machine layer, measured side by side in one run.

    .venv/bin/python bench/machine.py [--runs 30]

Prints: cold boot to ready (s); `run("true")` on the persistent SSH transport against
a fresh `ssh` process per command (ms each, and the ratio); screenshot capture to a
scaled PNG (ms and bytes). Both command paths alternate within one loop so that the
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

from vmd.images import find_image
from vmd.machine import Machine


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    image = find_image("debian")
    with tempfile.TemporaryDirectory(prefix="vmd-bench-") as tmp:
        started = time.monotonic()
        machine = Machine.create(image, name=f"bench-{uuid.uuid4().hex[:8]}",
                                 workdir=Path(tmp) / "work", project_dir=None)
        try:
            facts = machine.ready(timeout=600, desktop=True)
            boot_s = time.monotonic() - started
            ssh_cmd = ["ssh", "-q", "-i", str(image.path("ssh_key")), "-p", str(machine.ssh_port),
                       "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                       "-o", "BatchMode=yes", f"{image.user}@127.0.0.1", "true"]
            persistent, fresh, shots, sizes = [], [], [], []
            machine.guest.run("true")  # the transport is open before timing starts
            for _ in range(args.runs):
                t = time.perf_counter()
                assert machine.guest.run("true").exit_code == 0
                persistent.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(ssh_cmd, check=True)
                fresh.append(time.perf_counter() - t)
                t = time.perf_counter()
                shot = machine.screen.screenshot()
                shots.append(time.perf_counter() - t)
                sizes.append(len(shot.png))
        finally:
            machine.destroy()

    p, f = median_ms(persistent), median_ms(fresh)
    print(f"accelerator                        {facts.accel}")
    print(f"cold boot to ready (desktop up)    {boot_s:8.1f} s")
    print(f"run('true'), persistent transport  {p:8.1f} ms  (median of {args.runs})")
    print(f"run('true'), fresh ssh process     {f:8.1f} ms  (median of {args.runs})")
    print(f"fresh / persistent                 {f / p:8.1f} x")
    print(f"screenshot to scaled PNG           {median_ms(shots):8.1f} ms, "
          f"{statistics.median(sizes) / 1024:.0f} KiB ({shot.width}x{shot.height})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
