"""Real Windows-shaped media for the tests: a WIM made by wimlib's own wimcapture, with the
<WINDOWS> fields real install.wim metadata has (ARCH 9 = x64, EDITIONID, INSTALLATIONTYPE,
VERSION/BUILD, LANGUAGES), put in an ISO the way Microsoft's ISOs carry it (UDF, with the
ISO 9660 tree beside it), and a virtio-win ISO in the virtio-win layout
(<driver>/<w10|w11|2k22...>/<amd64|x86|ARM64>/*.inf|sys|cat)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pycdlib
import pytest

# (name, description, EDITIONID, ARCH, INSTALLATIONTYPE, BUILD)
WIN11_EDITIONS = (
    ("Windows 11 Home", "Windows 11 Home", "Core", "9", "Client", "22631"),
    ("Windows 11 Pro", "Windows 11 Pro", "Professional", "9", "Client", "22631"),
)


def need_wimlib() -> None:
    if not shutil.which("wimcapture"):
        pytest.skip("wimtools is not installed (setup.sh installs it)")


def make_wim(work: Path, editions=WIN11_EDITIONS, esd: bool = False) -> Path:
    """A real WIM (or solid ESD) with one small captured folder per edition."""
    need_wimlib()
    wim = work / ("install.esd" if esd else "install.wim")
    for i, (name, desc, edition_id, arch, kind, build) in enumerate(editions, 1):
        tree = work / f"image{i}"
        (tree / "Windows" / "System32").mkdir(parents=True, exist_ok=True)
        (tree / "Windows" / "System32" / "notepad.exe").write_bytes(b"MZ" + bytes([i]) * 64)
        props = [f"WINDOWS/ARCH={arch}", f"WINDOWS/EDITIONID={edition_id}", f"WINDOWS/INSTALLATIONTYPE={kind}",
                 "WINDOWS/PRODUCTTYPE=" + ("ServerNT" if kind.startswith("Server") else "WinNT"),
                 "WINDOWS/VERSION/MAJOR=10", "WINDOWS/VERSION/MINOR=0", f"WINDOWS/VERSION/BUILD={build}",
                 "WINDOWS/LANGUAGES/LANGUAGE=en-US", f"FLAGS={edition_id}", f"DISPLAYNAME={name}"]
        cmd = ["wimcapture" if i == 1 else "wimappend", str(tree), str(wim), name, desc]
        cmd += [arg for p in props for arg in ("--image-property", p)]
        if esd:
            cmd += ["--solid"]
        subprocess.run(cmd, check=True, capture_output=True)
    return wim


def _add_dirs(iso: pycdlib.PyCdlib, parts: list[str], made: set, udf: bool, joliet: bool) -> None:
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        if rel in made:
            continue
        made.add(rel)
        kw = {"iso_path": "/" + "/".join(p.upper().replace("-", "_").replace("$", "_")[:8] for p in parts[:depth])}
        if udf:
            kw["udf_path"] = "/" + rel
        if joliet:
            kw["joliet_path"] = "/" + rel
        iso.add_directory(**kw)


def make_iso(path: Path, files: dict[str, bytes], udf: bool = True, joliet: bool = False, label: str = "CCCOMA_X64") -> Path:
    """An ISO holding `files` ({"sources/install.wim": bytes}) in UDF (as Microsoft's media
    do) and/or Joliet, with mangled 8.3 ISO 9660 names beside them."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=label, udf="2.60" if udf else None, joliet=3 if joliet else None)
    made: set = set()
    for n, (rel, data) in enumerate(sorted(files.items())):
        parts = rel.split("/")
        _add_dirs(iso, parts[:-1], made, udf, joliet)
        stem = parts[-1].upper().replace("-", "_").replace("$", "_")
        base, _, ext = stem.partition(".")
        iso_name = f"{base[:8]}.{ext[:3]};1" if ext else f"{base[:8]};1"
        dirs = "/".join(p.upper().replace("-", "_").replace("$", "_")[:8] for p in parts[:-1])
        kw = {"iso_path": ("/" + dirs if dirs else "") + "/" + iso_name}
        if udf:
            kw["udf_path"] = "/" + rel
        if joliet:
            kw["joliet_path"] = "/" + rel
        iso.add_fp(io.BytesIO(data), len(data), **kw)
    iso.write(str(path))
    iso.close()
    return path


def make_windows_iso(work: Path, editions=WIN11_EDITIONS, esd: bool = False, bootable: bool = False) -> Path:
    """`bootable`: with El Torito entries and the no-prompt loader beside efisys.bin, as
    Microsoft's x64 media have them (make_bootable_windows_iso)."""
    wim = make_wim(work, editions, esd)
    files = {f"sources/{wim.name}": wim.read_bytes(), "setup.exe": b"MZ setup", "boot/bcd": b"bcd"}
    if bootable:
        return make_bootable_windows_iso(work / "win.iso", b"efisys" * 512, b"noprompt" * 512, files)
    return make_iso(work / "win.iso", files)


# Microsoft's boot files, where its x64 ISOs keep them (their El Torito entries: BIOS
# boot/etfsboot.com, then one section for EFI, efi/microsoft/boot/efisys.bin; the no-prompt
# FAT image beside it, which no entry names).
ETFSBOOT = "boot/etfsboot.com"
EFISYS = "efi/microsoft/boot/efisys.bin"
EFISYS_NOPROMPT = "efi/microsoft/boot/efisys_noprompt.bin"


def make_bootable_windows_iso(path: Path, efisys: bytes, efisys_noprompt: bytes | None,
                              extra: dict[str, bytes] | None = None) -> Path:
    """An ISO laid out for booting as Microsoft's are: UDF (and mangled ISO 9660 names), an
    El Torito default entry for BIOS and a section for EFI naming efisys.bin."""
    files = {ETFSBOOT: b"\xfa" + b"etfsboot" * 256, EFISYS: efisys, **(extra or {})}
    if efisys_noprompt is not None:
        files[EFISYS_NOPROMPT] = efisys_noprompt
    make_iso(path, files)
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    iso.add_eltorito("/BOOT/ETFSBOOT.COM;1", bootcatfile="/BOOT.CAT;1", boot_load_size=8)
    iso.add_eltorito("/EFI/MICROSOF/BOOT/EFISYS.BIN;1", bootcatfile="/BOOT.CAT;1", efi=True, platform_id=0xEF)
    out = path.with_suffix(".boot.iso")
    iso.write(str(out))
    iso.close()
    out.replace(path)
    return path


VIRTIO_DRIVERS = ("viostor", "vioscsi", "NetKVM", "Balloon", "vioserial", "viorng", "qxldod")


def make_virtio_win_iso(work: Path) -> Path:
    files = {}
    for driver in VIRTIO_DRIVERS:
        for family in ("w10", "w11", "2k22"):
            for arch in ("amd64", "x86", "ARM64"):
                if family == "w11" and arch == "x86":
                    continue  # there is no 32-bit Windows 11, and virtio-win has no such folder
                stem = driver.lower()
                for ext in ("inf", "sys", "cat"):
                    files[f"{driver}/{family}/{arch}/{stem}.{ext}"] = f"{driver} {family} {arch} {ext}".encode()
    files["guest-agent/qemu-ga-x86_64.msi"] = b"msi"
    files["virtio-win-guest-tools.exe"] = b"MZ tools"
    return make_iso(work / "virtio-win.iso", files, udf=False, joliet=True, label="virtio-win-0.1")
