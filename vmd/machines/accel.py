"""Which accelerator a new guest gets: KVM where QEMU can really use it, else TCG (QEMU's
own emulation, libvirt's domain type "qemu"), unless the accel setting forces one.

Apart from vmd/machines/machine.py so that `vmd doctor` and the tests can ask without libvirt.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from vmd.config import VmdConfig
from vmd.host_env import clean_env
from vmd.machines.domain_xml import OVMF_CODE, OVMF_VARS

KVM_DEVICE = Path("/dev/kvm")
QEMU = "qemu-system-x86_64"


# A kernel that runs under KVM prints its banner within a second; one that has not after
# this long is not going to (under TCG the banner takes ~2 s).
KERNEL_PROBE_S = 6.0
BANNER = b"Linux version"


# Without a kernel, UEFI firmware (OVMF, X64: it runs in long mode too) is booted instead:
# its boot manager's first line on the serial console comes within a second or two under
# KVM (about 10 s under TCG); none in 10 s is a KVM that does not run guests.
FIRMWARE_PROBE_S = 10.0
FIRMWARE_LINE = b"BdsDxe"


def probe_kvm(device: Path = KVM_DEVICE, qemu: str = QEMU, kernel: Path | None = None,
              firmware: tuple[Path, Path] | None = None) -> bool:
    """True when QEMU can really run a KVM guest here.

    /dev/kvm can exist, open, and even create a VM while QEMU still aborts when it sets
    up a vCPU (seen on the CI hosts: "failed to set MSR 0x10a"), so ask QEMU itself: start
    a paused machine with `-accel kvm` and quit it (about 50 ms). And a KVM that starts a
    vCPU can still not run a kernel: on a nested host here SeaBIOS and the kernel's
    real-mode setup ran, then the guest hung for good at the switch to long mode (every
    guest timed out at boot). So when a `kernel` is at hand, boot it under KVM too and wait
    for its banner on the serial console; without one, boot `firmware` (OVMF's code and
    variables template: probe_firmware) and wait for its boot manager. With neither, QEMU's
    start is all that is asked."""
    if not os.access(device, os.R_OK | os.W_OK):
        return False
    try:
        probe = subprocess.run(
            [qemu, "-accel", "kvm", "-M", "q35", "-cpu", "host", "-nodefaults",
             "-display", "none", "-S", "-monitor", "stdio"],
            input="quit\n", capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    if probe.returncode != 0:
        return False
    if kernel is not None:
        return _kvm_guest_prints(qemu, ["-kernel", str(kernel), "-append",
                                        "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1"], BANNER, KERNEL_PROBE_S)
    if firmware is not None:
        code, template = firmware
        with tempfile.TemporaryDirectory(prefix="vmd-kvm-probe-") as scratch:
            variables = Path(scratch) / "vars.fd"  # the firmware writes its variables
            shutil.copyfile(template, variables)
            return _kvm_guest_prints(qemu, [
                "-drive", f"if=pflash,format=raw,readonly=on,file={code}",
                "-drive", f"if=pflash,format=raw,file={variables}"], FIRMWARE_LINE, FIRMWARE_PROBE_S)
    return True


def probe_firmware(code: Path = Path(OVMF_CODE), template: Path = Path(OVMF_VARS)) -> tuple[Path, Path] | None:
    """OVMF to try KVM with where no kernel is at hand (Debian's ovmf package), or None."""
    if os.access(code, os.R_OK) and os.access(template, os.R_OK):
        return code, template
    return None


def _kvm_guest_prints(qemu: str, boot: list[str], marker: bytes, seconds: float) -> bool:
    """Whether a KVM guest booted with `boot` writes `marker` to its serial console within `seconds`."""
    try:
        guest = subprocess.Popen(
            [qemu, "-accel", "kvm", "-M", "q35", "-cpu", "host", "-nodefaults", "-display", "none",
             "-m", "256", "-no-reboot", *boot, "-serial", "stdio"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=clean_env())
    except OSError:
        return False
    seen = b""
    deadline = time.monotonic() + seconds
    try:
        while marker not in seen and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([guest.stdout], [], [], left)
            if not ready:
                break
            chunk = os.read(guest.stdout.fileno(), 4096)
            if not chunk:
                break
            seen = seen[-64:] + chunk
    finally:
        guest.kill()
        guest.wait()
        guest.stdout.close()
    return marker in seen


def probe_kernel(images_dir: Path, boot_dir: Path = Path("/boot")) -> Path | None:
    """A kernel to try KVM with: a built image's (what guests boot), else the host's."""
    for found in (sorted(images_dir.glob("*/vmlinuz"), key=lambda p: p.stat().st_mtime, reverse=True)
                  + sorted(boot_dir.glob("vmlinuz-*"))):
        if os.access(found, os.R_OK):
            return found
    return None


@functools.lru_cache(maxsize=4)
def kvm_works(images_dir: Path) -> bool:
    """probe_kvm() of this host with a kernel of `images_dir` (VmdConfig.images_dir, the
    config vmd was given), asked once per process and folder: the answer does not change."""
    return probe_kvm(kernel=probe_kernel(images_dir), firmware=probe_firmware())


def choose_accel(setting: str, kvm_usable: Callable[[], bool]) -> str:
    """"kvm" or "qemu" (TCG) for `setting` (VmdConfig.accel): forced by "kvm", "qemu" or
    "tcg" without asking `kvm_usable`, else what it answers."""
    if setting in ("qemu", "tcg"):
        return "qemu"
    if setting == "kvm":
        return "kvm"
    return "kvm" if kvm_usable() else "qemu"


def config_accel(config: VmdConfig) -> str:
    """The accelerator of the next guest under `config`: its accel setting, and for "auto"
    the probe with a kernel of its images_dir (`vmd serve --config FILE` with images_dir in
    the file probes with that folder's kernel, not the environment's)."""
    return choose_accel(config.accel, lambda: kvm_works(Path(config.images_dir)))


def timeout_scale(acc: str) -> float:
    """How much longer everything takes without KVM. Under TCG a Debian guest boots in
    30-40 s against ~8 s with KVM; commands are 3-10x slower."""
    return 1.0 if acc == "kvm" else 4.0
