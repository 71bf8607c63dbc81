"""The install CD that boots Setup without "Press any key to boot from CD or DVD".

Under UEFI a Microsoft ISO boots through its El Torito entry for EFI: a FAT image
(efi/microsoft/boot/efisys.bin) whose loader asks for a key for a few seconds and, with
none, hands back to the firmware, which then has nothing to boot (a missed key hung the
build for its 2-hour bound). The same ISOs carry efisys_noprompt.bin, the loader that
does not ask; dockur/windows rebuilds the ISO around it (src/install.sh prepareImage,
src/image.sh buildImage: genisoimage ... -eltorito-boot efi/microsoft/boot/efisys_noprompt.bin).

vmd rebuilds nothing and copies nothing: the user's ISO stays as it is, the backing file of a
qcow2 layer that changes one 2 KiB sector, the boot catalog, so that its EFI entry points
at efisys_noprompt.bin, already on the disc. The catalog's layout is the El Torito
specification's (1995): a Boot Record volume descriptor at sector 17 names the catalog's
sector; the catalog is 32-byte entries (a validation entry, the default entry, then section
headers, 0x90/0x91, each followed by its entries; platform 0xEF is EFI), an entry holding
its image's size in 512-byte sectors (offset 6) and first 2 KiB sector (offset 8).
"""

from __future__ import annotations

import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pycdlib
from pycdlib.pycdlibexception import PyCdlibException

from vmd.host_env import clean_env
from vmd.images.windows.install_domain import InstallMedium

SECTOR = 2048
BOOT_RECORD_SECTOR = 17
EL_TORITO_ID = b"EL TORITO SPECIFICATION"
EFI_PLATFORM = 0xEF
NOPROMPT_PATH = "/efi/microsoft/boot/efisys_noprompt.bin"
MEDIUM_FILE = "install-noprompt.qcow2"


@dataclass(frozen=True)
class BootEntry:
    offset: int  # the entry's byte offset in the ISO
    platform: int  # 0 BIOS, 0xEF EFI
    bootable: bool
    sector_count: int  # 512-byte sectors of the boot image
    load_rba: int  # the boot image's first 2 KiB sector
    raw: bytes  # the entry's 32 bytes

    def patched(self, load_rba: int, size: int) -> bytes:
        """This entry's 32 bytes pointing at another image of `size` bytes (as genisoimage
        writes an EFI image's entry: its whole size, in 512-byte sectors)."""
        count = min(-(-size // 512), 0xFFFF)
        return self.raw[:6] + struct.pack("<HI", count, load_rba) + self.raw[12:]


@dataclass(frozen=True)
class BootMedium:
    medium: InstallMedium
    no_prompt: bool  # False: the firmware will show the loader's prompt (install.py presses the key)
    note: str  # what the build says of it


def boot_entries(iso: Path) -> list[BootEntry]:
    """The ISO's El Torito entries (the default one and every section's), or [] when it has none."""
    with open(iso, "rb") as f:
        f.seek(BOOT_RECORD_SECTOR * SECTOR)
        record = f.read(SECTOR)
        if record[1:6] != b"CD001" or record[0] != 0 or not record[7:39].startswith(EL_TORITO_ID):
            return []
        catalog_sector = struct.unpack_from("<I", record, 0x47)[0]
        f.seek(catalog_sector * SECTOR)
        catalog = f.read(SECTOR)
    if catalog[0] != 1 or catalog[30:32] != b"\x55\xaa":
        return []  # no validation entry: not a catalog
    base = catalog_sector * SECTOR
    entries = [_entry(catalog, 32, base, catalog[1])]
    pos = 64
    while pos + 32 <= SECTOR and catalog[pos] in (0x90, 0x91):
        final, platform, count = catalog[pos] == 0x91, catalog[pos + 1], struct.unpack_from("<H", catalog, pos + 2)[0]
        pos += 32
        for _ in range(count):
            if pos + 32 > SECTOR:
                break
            entries.append(_entry(catalog, pos, base, platform))
            pos += 32
        if final:
            break
    return entries


def _entry(catalog: bytes, pos: int, base: int, platform: int) -> BootEntry:
    indicator, _media, _seg, _system, _unused, count, rba = struct.unpack_from("<BBHBBHI", catalog, pos)
    return BootEntry(base + pos, platform, indicator == 0x88, count, rba, catalog[pos:pos + 32])


def noprompt_extent(iso: Path) -> tuple[int, int] | None:
    """(first 2 KiB sector, size) of efisys_noprompt.bin on the ISO, or None. Microsoft's
    media keep their files in UDF (the ISO 9660 tree holds only a README); Joliet and ISO
    9660 are looked at for other media."""
    disc = pycdlib.PyCdlib()
    try:
        disc.open(str(iso))
    except (PyCdlibException, OSError):
        return None
    try:
        for kind, path in (("udf_path", NOPROMPT_PATH), ("joliet_path", NOPROMPT_PATH),
                           ("iso_path", "/EFI/MICROSOFT/BOOT/EFISYS_NOPROMPT.BIN;1")):
            if (kind == "udf_path" and not disc.has_udf()) or (kind == "joliet_path" and not disc.has_joliet()):
                continue
            try:
                record = disc.get_record(**{kind: path})
            except PyCdlibException:
                continue
            if record.inode is not None and record.inode.get_data_length() > 0:
                return record.inode.extent_location(), record.inode.get_data_length()
        return None
    finally:
        disc.close()


def no_prompt_medium(iso: Path, folder: Path) -> BootMedium:
    """The install CD for `iso`: a qcow2 layer in `folder` whose EFI boot entry is the
    no-prompt loader, or the ISO itself (with what that means) when it has no such loader
    or no EFI entry to point at it."""
    efi = [entry for entry in boot_entries(iso) if entry.platform == EFI_PLATFORM and entry.bootable]
    extent = noprompt_extent(iso)
    if not efi or extent is None:
        missing = "an El Torito entry for EFI" if not efi else NOPROMPT_PATH.lstrip("/")
        return BootMedium(InstallMedium(iso), False,
                          f"the ISO has no {missing}: its loader will ask for a key, which the build presses")
    rba, size = extent
    layer = folder / MEDIUM_FILE
    layer.unlink(missing_ok=True)
    patch = folder / "boot-entry.bin"
    patch.write_bytes(efi[0].patched(rba, size))
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(iso), "-F", "raw", str(layer)],
                       check=True, capture_output=True, env=clean_env())
        subprocess.run(["qemu-io", "-f", "qcow2", "-c", f"write -q -s {patch} {efi[0].offset} 32", str(layer)],
                       check=True, capture_output=True, env=clean_env())
    finally:
        patch.unlink(missing_ok=True)
    return BootMedium(InstallMedium(layer, "qcow2"), True,
                      f"it boots {NOPROMPT_PATH.lstrip('/')}, no key to press (a qcow2 layer over the ISO, which is untouched)")
