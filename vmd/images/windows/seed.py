"""The seed medium: a second CD for Windows Setup, written with pycdlib (no root, no mount).

Its Joliet tree is what Windows reads (Windows never reads Rock Ridge, and prefers Joliet to
the 8.3 ISO 9660 names, which are numbered placeholders here):

    Autounattend.xml             Setup looks for it at the root of every removable medium
    $WinPEDriver$/<driver>/...   Setup loads these drivers in WinPE and into the installed
                                 system (the edition's folder of the virtio-win ISO)
    $OEM$/$1/vmd/                firstlogon.ps1, vmd_key.pub, OpenSSH-Win64.msi (if given):
                                 the first logon command copies this folder to C:\\vmd (the
                                 $OEM$\\$1 layout is where configuration sets keep such files)

The volume label (SEED_LABEL) is how that command finds the medium.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import pycdlib
from pycdlib.pycdlibexception import PyCdlibException

from vmd.guests.windows import contract
from vmd.images.windows.editions import Edition, MediaError

FIRSTLOGON = Path(__file__).with_name("firstlogon.ps1")
OEM_VMD = "$OEM$/$1/vmd"
# virtio-win's drivers for a q35 guest: the disk (viostor; vioscsi for virtio-scsi), the NIC
# (NetKVM), memory balloon, serial, RNG, input and display. viostor is the one Setup cannot
# do without when the disk is virtio; the others are skipped when the ISO lacks them.
VIRTIO_DRIVERS = ("viostor", "vioscsi", "NetKVM", "Balloon", "vioserial", "viorng", "vioinput", "qxldod")
REQUIRED_DRIVER = "viostor"
# virtio-win's architecture folder for an edition's <ARCH>.
VIRTIO_ARCH = {"x64": "amd64"}


@dataclass
class SeedFiles:
    """Joliet path (posix, no leading slash) -> bytes, or the host file to copy."""
    entries: dict[str, bytes | Path] = field(default_factory=dict)

    def add(self, path: str, data: bytes | Path) -> None:
        self.entries[path] = data


def _reader(iso: pycdlib.PyCdlib) -> str:
    """The pycdlib path keyword of the richest tree the ISO has (names as the user sees them)."""
    if iso.has_joliet():
        return "joliet_path"
    if iso.has_rock_ridge():
        return "rr_path"
    return "iso_path"


def virtio_drivers(virtio_iso: Path, edition: Edition) -> dict[str, bytes]:
    """`$WinPEDriver$/<driver>/<file>` -> bytes: `<driver>/<family>/<arch>/*` of the virtio-win ISO."""
    if not virtio_iso.is_file():
        raise MediaError(f"there is no virtio-win ISO at {virtio_iso}: pass the virtio-win ISO you downloaded "
                         f"(the Fedora project's virtio-win-*.iso) with --virtio-win, or leave the option out.")
    arch = VIRTIO_ARCH.get(edition.arch, edition.arch)
    iso = pycdlib.PyCdlib()
    try:
        iso.open(str(virtio_iso))
    except (PyCdlibException, OSError) as exc:
        raise MediaError(f"{virtio_iso} is not a readable ISO image ({exc}); pass the virtio-win ISO with --virtio-win.") from exc
    kind = _reader(iso)
    found: dict[str, bytes] = {}
    try:
        top = {name.lower(): name for name in _listing(iso, kind, "/")[0]}
        for driver in VIRTIO_DRIVERS:
            folder = _child_path(iso, kind, top.get(driver.lower()), "/", edition.family, arch)
            if folder is None:
                continue
            for name in _listing(iso, kind, folder)[1]:
                out = io.BytesIO()
                iso.get_file_from_iso_fp(out, **{kind: f"{folder}/{name}"})
                found[f"$WinPEDriver$/{driver}/{_plain(name)}"] = out.getvalue()
    finally:
        iso.close()
    if not any(path.startswith(f"$WinPEDriver$/{REQUIRED_DRIVER}/") for path in found):
        raise MediaError(f"{virtio_iso} has no {REQUIRED_DRIVER}/{edition.family}/{arch} folder, so Setup would not "
                         f"see a virtio disk: pass a virtio-win ISO with drivers for {edition.name} ({arch}).")
    return found


def _plain(name: str) -> str:
    return name.split(";")[0]  # an ISO 9660 version suffix (";1") is not part of the name


def _listing(iso: pycdlib.PyCdlib, kind: str, path: str) -> tuple[list[str], list[str]]:
    """(folders, files) directly in `path`."""
    for _root, dirs, files in iso.walk(**{kind: path}):
        return list(dirs), list(files)
    return [], []


def _child_path(iso, kind: str, driver: str | None, *_parts) -> str | None:
    """`/<driver>/<family>/<arch>`, each level matched case-insensitively, or None."""
    if driver is None:
        return None
    path = f"/{driver}"
    for want in _parts[1:]:
        names = {n.lower(): n for n in _listing(iso, kind, path)[0]}
        if want.lower() not in names:
            return None
        path = f"{path}/{names[want.lower()]}"
    return path


def seed_files(answer_xml: str, public_key: str, edition: Edition, virtio_win: Path | None = None,
               openssh_msi: Path | None = None) -> SeedFiles:
    files = SeedFiles()
    files.add("Autounattend.xml", answer_xml.encode())
    if virtio_win is not None:
        for path, data in virtio_drivers(virtio_win, edition).items():
            files.add(path, data)
    files.add(f"{OEM_VMD}/firstlogon.ps1", FIRSTLOGON.read_bytes())
    files.add(f"{OEM_VMD}/vmd_key.pub", public_key.strip().encode() + b"\n")
    if openssh_msi is not None:
        if not openssh_msi.is_file():
            raise MediaError(f"there is no OpenSSH MSI at {openssh_msi}: pass the OpenSSH-Win64.msi you downloaded "
                             f"from the PowerShell/Win32-OpenSSH releases with --openssh-msi, or leave it out "
                             f"(editions with the built-in OpenSSH capability need none).")
        files.add(f"{OEM_VMD}/OpenSSH-Win64.msi", openssh_msi)
    return files


def write_seed(files: SeedFiles, out: Path) -> Path:
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, vol_ident=contract.SEED_LABEL)
    folders: dict[str, str] = {"": ""}
    counter = 0
    for path in sorted(files.entries):
        parts = path.split("/")
        for depth in range(1, len(parts)):
            joliet = "/".join(parts[:depth])
            if joliet not in folders:
                counter += 1
                folders[joliet] = f"{folders['/'.join(parts[:depth - 1])]}/D{counter:04d}"
                iso.add_directory(iso_path=folders[joliet], joliet_path="/" + joliet)
        counter += 1
        iso_path = f"{folders['/'.join(parts[:-1])]}/F{counter:04d}.;1"
        data = files.entries[path]
        if isinstance(data, Path):
            iso.add_file(str(data), iso_path=iso_path, joliet_path="/" + path)
        else:
            iso.add_fp(io.BytesIO(data), len(data), iso_path=iso_path, joliet_path="/" + path)
    out.parent.mkdir(parents=True, exist_ok=True)
    iso.write(str(out))
    iso.close()
    return out
