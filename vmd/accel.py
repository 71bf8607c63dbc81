"""Which accelerator a new guest gets: KVM where QEMU can really use it, else TCG (QEMU's
own emulation, libvirt's domain type "qemu"), unless the accel setting forces one.

Apart from vmd/machine.py so that `vmd doctor` and the tests can ask without libvirt.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Callable

from vmd.host_env import clean_env

KVM_DEVICE = Path("/dev/kvm")
QEMU = "qemu-system-x86_64"


def probe_kvm(device: Path = KVM_DEVICE, qemu: str = QEMU) -> bool:
    """True when QEMU can really start a KVM guest here.

    /dev/kvm can exist, open, and even create a VM while QEMU still aborts when it sets
    up a vCPU (seen on the CI hosts: "failed to set MSR 0x10a"), so ask QEMU itself: start
    a paused machine with `-accel kvm` and quit it (about 50 ms)."""
    if not os.access(device, os.R_OK | os.W_OK):
        return False
    try:
        probe = subprocess.run(
            [qemu, "-accel", "kvm", "-M", "q35", "-cpu", "host", "-nodefaults",
             "-display", "none", "-S", "-monitor", "stdio"],
            input="quit\n", capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@functools.lru_cache(maxsize=1)
def kvm_works() -> bool:
    """probe_kvm() of this host, asked once per process: the answer does not change."""
    return probe_kvm()


def choose_accel(setting: str, kvm_usable: Callable[[], bool] | None = None) -> str:
    """"kvm" or "qemu" (TCG) for `setting` (VmdConfig.accel): forced by "kvm", "qemu" or
    "tcg" without asking `kvm_usable` (kvm_works by default), else what it answers."""
    if setting in ("qemu", "tcg"):
        return "qemu"
    if setting == "kvm":
        return "kvm"
    return "kvm" if (kvm_usable or kvm_works)() else "qemu"


def timeout_scale(acc: str) -> float:
    """How much longer everything takes without KVM. Under TCG a Debian guest boots in
    30-40 s against ~8 s with KVM; commands are 3-10x slower."""
    return 1.0 if acc == "kvm" else 4.0
