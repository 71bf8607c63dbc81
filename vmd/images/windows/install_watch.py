"""What the install machine's serial log (COM1) says, and where the install stands.

Two writers share COM1: OVMF's boot manager, which prints each boot option it loads,
starts and fails on its serial console (seen here: `BdsDxe: loading Boot0001 "EFI
Internal Shell" from ...`, `BdsDxe: starting Boot0001 ...`), and the first logon
(firstlogon.ps1: a `vmd: <step>` line per step, then the ready marker or `vmd: firstlogon
failed: ...`). The firmware's lines and what they mean are the ones dockur/windows reads
from the same console (src/power.sh: UEFI_DVD_BOOT_PATTERN, the DVD's `Time out`,
UEFI_NO_BOOT_MESSAGE, UEFI_SHELL_MESSAGE, UEFI_WINDOWS_BOOT_PATTERN).
"""

from __future__ import annotations

import re

from vmd.guests.windows import contract

_BOOT = r"Boot[0-9A-Fa-f]{4}"
_DVD = r'"UEFI QEMU [^"]*DVD-ROM[^"]*"'
CD_STARTING = re.compile(rf"BdsDxe: starting {_BOOT} {_DVD}")
# The loader's prompt went unanswered: it hands back EFI_TIMEOUT, which OVMF prints.
CD_TIMED_OUT = re.compile(rf"BdsDxe: failed to start {_BOOT} {_DVD}.*: Time out")
CD_FAILED = re.compile(rf"BdsDxe: failed to start {_BOOT} {_DVD}.*: (?P<why>[^\r\n]*)")
NOTHING_TO_BOOT = ("BdsDxe: No bootable option or device was found", "UEFI Interactive Shell")
WINDOWS_STARTING = re.compile(rf'BdsDxe: starting {_BOOT} "Windows Boot Manager"')
STEP = re.compile(r"^vmd: (?P<step>.+?)\s*$", re.M)
FAILED = contract.FAILED_MARKER


def firmware_problem(text: str) -> str | None:
    """`timeout` (the CD's loader waited for a key nobody pressed), `cd: <why>` (the
    firmware could not start the install CD), `nothing` (nothing left to boot: the
    firmware's shell or its message), or None."""
    if CD_TIMED_OUT.search(text):
        return "timeout"
    failed = CD_FAILED.search(text)
    if failed:
        return "cd: " + failed["why"].strip()
    if any(line in text for line in NOTHING_TO_BOOT):
        return "nothing"
    return None


def cd_started(text: str) -> bool:
    return CD_STARTING.search(text) is not None


def guest_steps(text: str) -> list[str]:
    """The first logon's `vmd:` lines, its failure line included."""
    return [m["step"] for m in STEP.finditer(text)]


def stopped_in(text: str) -> str:
    """The step of the install the serial log last shows, in words for the build's log."""
    steps = [step for step in guest_steps(text) if not step.startswith(FAILED)]
    if steps:
        return f"the first logon, step '{steps[-1]}' (firstlogon.ps1)"
    if WINDOWS_STARTING.search(text):
        return "Windows Setup after its first reboot (Windows booted from the disk; no first logon step yet)"
    if cd_started(text):
        return "Windows Setup from the install CD (the firmware started the CD; Setup writes nothing on COM1)"
    if "BdsDxe:" in text:
        return "the firmware (it has not started the install CD)"
    return "the firmware (nothing on COM1 yet)"
