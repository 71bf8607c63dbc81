"""Whether this host can run Windows guests, in one sentence for `vmd doctor`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from vmd.images.windows.install import host_problems
from vmd.machines.accel import kvm_works
from vmd.machines.smbd_jail import missing_tools


def windows_images(images_dir: Path) -> list[Path]:
    """Built Windows image folders, newest first."""
    found = []
    for manifest in images_dir.glob("windows-*/manifest.json") if images_dir.is_dir() else ():
        try:
            if json.loads(manifest.read_text()).get("os_family") == "windows":
                found.append(manifest.parent)
        except (OSError, ValueError):
            continue  # a folder being written or damaged is not an image
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def share_problems() -> list[str]:
    """What this host lacks to serve a Windows guest its project share (vmd/machines/smbd_jail.py)."""
    missing = missing_tools()
    if not missing:
        return []
    return [f"the project share's smbd cannot run ({', '.join(missing)} missing): install Debian's bubblewrap "
            "and samba packages."]


def windows_readiness(images_dir: Path, kvm_usable: Callable[[], bool] | None = None) -> tuple[str, str]:
    """(status, sentence): "ok" when Windows guests can run or an image can be built here;
    "warn" when the host lacks KVM, OVMF, swtpm or the SMB share's sandbox (Windows is optional: Linux guests still
    work). KVM is asked of QEMU itself (accel.kvm_works, as for vmd's guests) unless
    `kvm_usable` answers."""
    problems = host_problems(kvm_usable or (lambda: kvm_works(images_dir))) + share_problems()
    built = windows_images(images_dir)
    if problems:
        have = f" (a Windows image is built: {built[0].name})" if built else ""
        return "warn", "Windows guests cannot run here" + have + ": " + " ".join(problems)
    if built:
        return "ok", f"Windows guests can run: KVM, OVMF and swtpm are here and {built[0].name} is built."
    return "ok", ("KVM, OVMF and swtpm are here, but no Windows image is built: run `vmd images build windows "
                  "--iso YOUR.iso` with your own install ISO (docs/windows.md).")
