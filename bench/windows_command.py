"""Benchmark of one command on a Windows guest: two PowerShell starts against three, side by side.

    .venv/bin/python bench/windows_command.py [--runs 20]

Needs a built Windows image (`vmd images build windows --iso ...`) and KVM; without them it
says so and exits 2. It boots one machine with a project share (Z: mapped with the share's
login) and alternates, in one loop so the guest's noise hits both alike, `exit 0` sent as vmd
sends it now (the wrapper run in sshd's own PowerShell: vmd/guests/windows/powershell.py
in_shell_command; two powershell.exe starts) and as it was sent before (sshd's PowerShell
starting `powershell -EncodedCommand <the same wrapper>`: three starts). Prints the median
milliseconds of each and their ratio. Not run on this project's machines: none boots Windows.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from vmd.guests.ssh import drain
from vmd.guests.windows.guest import RUN_FOLDER
from vmd.guests.windows.powershell import decode_in_shell
from vmd.guests.windows.scripts import EXIT_TAIL
from vmd.machines.accel import kvm_works
from vmd.machines.images import ImageMissing, find_image, images_dir
from vmd.machines.machine import Machine

THREE_STARTS = "powershell -NoProfile -NonInteractive -EncodedCommand "


def timed(guest, three_starts: bool) -> float:
    """Seconds for `exit 0` through vmd's exec line (or the three-start line it replaced)."""
    command_file = f"{RUN_FOLDER}\\{secrets.token_hex(8)}.ps1"
    guest.write_file(command_file, "exit 0\n" + EXIT_TAIL)
    line = guest.command_line(command_file, guest.project_path, 60)
    if three_starts:
        line = THREE_STARTS + base64.b64encode(decode_in_shell(line).encode("utf-16-le")).decode("ascii")
    started = time.monotonic()
    channel = guest.ssh.open_channel(command=line)
    channel.shutdown_write()
    code, _ = drain(channel, lambda stream, data: None, started + 120)
    if code != 0:
        raise SystemExit(f"the guest answered exit {code} to `exit 0` ({'three' if three_starts else 'two'} starts)")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    try:
        image = find_image("windows")
    except ImageMissing as exc:
        print(f"{exc} (the build needs your own install ISO: docs/windows.md)")
        sys.exit(2)
    if not kvm_works(images_dir()):
        print("no working KVM here: a Windows guest under TCG would measure QEMU, not PowerShell")
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="vmd-bench-") as tmp:
        os.chmod(tmp, 0o711)
        project = Path(tmp) / "project"
        project.mkdir()
        machine = Machine.create(image, name=f"bench-{uuid.uuid4().hex[:8]}", workdir=Path(tmp) / "work",
                                 project_dir=project)
        try:
            machine.ready(timeout=1800)
            timed(machine.guest, False), timed(machine.guest, True)  # the first compile of the job type
            two, three = [], []
            for _ in range(args.runs):
                two.append(timed(machine.guest, False))
                three.append(timed(machine.guest, True))
        finally:
            machine.destroy()
    two_ms, three_ms = statistics.median(two) * 1000, statistics.median(three) * 1000
    print(f"exit 0, two PowerShell starts (now):    {two_ms:8.1f} ms median of {args.runs}")
    print(f"exit 0, three PowerShell starts (before): {three_ms:8.1f} ms median of {args.runs}")
    print(f"ratio now/before: {two_ms / three_ms:.2f}")


if __name__ == "__main__":
    main()
