"""The install boot: what the host needs for it, running it under libvirt until the guest
says it is ready on COM1, and keeping its disk as a compressed base image."""

from __future__ import annotations

import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

from vmd.errors import WordedError
from vmd.host_env import clean_env
from vmd.guests import windows_contract as contract
from vmd.machines.domain_xml import OVMF_CODE, OVMF_VARS

# Setup takes 20-40 min under KVM on an SSD, plus the OpenSSH download at the first logon;
# past this the install is stuck (a prompt nobody answers, a driver missing), not slow.
INSTALL_TIMEOUT_S = 2 * 3600
# After the ready marker: Windows shuts down in well under a minute; past this it is forced off.
SHUTDOWN_TIMEOUT_S = 300
# UEFI boots from CD only after "Press any key to boot from CD or DVD" (the ISO's efisys.bin
# waits ~5 s): keys are sent this often for this long after the start, so nobody has to.
BOOT_KEY_EVERY_S = 1.0
BOOT_KEY_FOR_S = 20.0
POLL_S = 5.0
NOTE_EVERY_S = 300.0  # a line of progress this often, so a 30-minute wait does not look hung
KVM_REFUSAL = ("this host has no working KVM, and Windows Setup under TCG (QEMU's emulation) takes hours, so "
               "vmd refuses to start it: build the Windows image on a host where `vmd doctor` reports KVM "
               "(/dev/kvm usable by QEMU), then copy the image folder here if you like.")


def host_problems(kvm_usable: Callable[[], bool], tpm: bool = True) -> list[str]:
    """What this host lacks for a Windows install, each as a sentence saying what to do."""
    problems = []
    if not kvm_usable():
        problems.append(KVM_REFUSAL)
    if not (Path(OVMF_CODE).is_file() and Path(OVMF_VARS).is_file()):
        problems.append(f"the UEFI firmware is missing ({OVMF_CODE}, {OVMF_VARS}): install Debian's ovmf package.")
    if tpm and not shutil.which("swtpm"):
        problems.append("swtpm is not installed, and Windows 11 needs a TPM 2.0: install Debian's swtpm and "
                        "swtpm-tools packages.")
    if not shutil.which("qemu-img"):
        problems.append("qemu-img is not installed: install Debian's qemu-utils package.")
    return problems


def closed_folder(path: Path) -> Path | None:
    """The first folder above `path` that QEMU, running as libvirt's unprivileged user
    (libvirt-qemu on Debian), cannot pass through; libvirt hands QEMU the file itself
    (it relabels it), never the folders above it."""
    for folder in list(path.resolve().parents)[::-1]:
        if not folder.exists():  # the build makes it (0711 for the image's own folder)
            break
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


def unreachable(paths: list[Path]) -> list[str]:
    problems = []
    for path in paths:
        folder = closed_folder(path)
        if folder is not None:
            problems.append(f"QEMU runs as libvirt's unprivileged user and cannot pass through {folder} to reach "
                            f"{path}: move it to a folder others may pass (chmod o+x {folder} is another way).")
    return problems


def make_disk(path: Path, size_gb: int) -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), f"{size_gb}G"],
                   check=True, capture_output=True, env=clean_env())


def compress_base(disk: Path, out: Path) -> None:
    """The installed disk as a compressed qcow2 base, read-only like the Debian image's."""
    subprocess.run(["qemu-img", "convert", "-q", "-c", "-O", "qcow2", str(disk), str(out)],
                   check=True, capture_output=True, env=clean_env())
    out.chmod(0o444)


def serial_says(log: Path, marker: str) -> str | None:
    """The ready marker, or a failure line firstlogon.ps1 wrote, from the serial log."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.strip() == marker or "firstlogon failed" in line:
            return line.strip()
    return None


class InstallFailed(WordedError, RuntimeError):
    """The install cannot run here or did not finish; the message says why and what to do."""


def _active(dom, libvirt) -> bool:
    try:
        return bool(dom.isActive())
    except libvirt.libvirtError:  # a transient domain that powered off is gone altogether
        return False


def run_install(domain_xml: str, serial_log: Path, uri: str, out, timeout_s: float = INSTALL_TIMEOUT_S,
                poll_s: float = POLL_S, boot_key_for_s: float = BOOT_KEY_FOR_S) -> None:
    """Boot the install domain (transient: nothing is left defined in libvirt), press a key
    for the CD prompt, wait for the ready marker on COM1, then shut Windows down."""
    # Here, not above: `vmd images build` and `vmd doctor` start without libvirt-python.
    import libvirt

    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise InstallFailed(f"libvirtd does not answer at {uri} ({exc}); start it (`systemctl start libvirtd`) "
                            f"and build again.") from exc
    dom = None
    try:
        try:
            dom = conn.createXML(domain_xml, 0)
        except libvirt.libvirtError as exc:
            raise InstallFailed(f"libvirt could not start the install machine: {exc}") from exc
        started = time.monotonic()
        while time.monotonic() - started < boot_key_for_s:
            try:
                dom.sendKey(libvirt.VIR_KEYCODE_SET_LINUX, 0, [28], 1, 0)  # KEY_ENTER
            except libvirt.libvirtError:
                pass  # the firmware is not reading keys yet
            time.sleep(min(BOOT_KEY_EVERY_S, boot_key_for_s))
        last_note = started
        while True:
            said = serial_says(serial_log, contract.READY_MARKER)
            if said == contract.READY_MARKER:
                break
            if said:
                raise InstallFailed(f"the guest's first logon failed: {said} (the whole serial log: {serial_log}).")
            if not _active(dom, libvirt):
                raise InstallFailed(f"the install machine stopped before the guest said {contract.READY_MARKER} "
                                    f"(serial log: {serial_log}).")
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                raise InstallFailed(f"Windows was not ready after {timeout_s / 60:.0f} min; the serial log "
                                    f"{serial_log} shows how far it got.")
            if time.monotonic() - last_note > NOTE_EVERY_S:
                print(f"  still installing ({elapsed / 60:.0f} min)", file=out, flush=True)
                last_note = time.monotonic()
            time.sleep(poll_s)
        dom.shutdown()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while _active(dom, libvirt) and time.monotonic() < deadline:
            time.sleep(poll_s)
    finally:
        try:
            if dom is not None and _active(dom, libvirt):
                dom.destroy()
        except libvirt.libvirtError:
            pass  # it ended between the two calls
        conn.close()
