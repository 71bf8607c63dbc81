"""The install CD boots Setup with no key to press (vmd/images/windows/boot_medium.py): a qcow2
layer over the user's ISO whose El Torito entry for EFI names efisys_noprompt.bin. What the
firmware reads through the layer is read back here through QEMU's own block layer
(qemu-img convert), on ISOs laid out like Microsoft's (UDF, a BIOS entry, an EFI section)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pycdlib

from tests.support.windows_media import EFISYS, make_bootable_windows_iso, make_iso
from vmd.images.windows.boot_medium import EFI_PLATFORM, SECTOR, boot_entries, no_prompt_medium

PROMPTING = b"PROMPT-LOADER" * 300  # efisys.bin: "Press any key to boot from CD or DVD"
NO_PROMPT = b"NOPROMPT-LOADER" * 500  # efisys_noprompt.bin, of another size


def through_qemu(layer: Path, out: Path) -> Path:
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(layer), str(out)], check=True)
    return out


def boot_image(iso: Path, platform: int) -> bytes:
    entry = next(e for e in boot_entries(iso) if e.platform == platform)
    with open(iso, "rb") as f:
        f.seek(entry.load_rba * SECTOR)
        return f.read(entry.sector_count * 512)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_layer_boots_the_no_prompt_loader_and_leaves_the_iso_as_it_was(tmp_path):
    iso = make_bootable_windows_iso(tmp_path / "win.iso", PROMPTING, NO_PROMPT)
    before = sha256(iso)
    assert boot_image(iso, EFI_PLATFORM).startswith(PROMPTING)  # what the firmware would boot as it is
    bios = boot_image(iso, 0)
    got = no_prompt_medium(iso, tmp_path)
    assert got.no_prompt and got.medium.format == "qcow2" and "no key to press" in got.note
    seen = through_qemu(got.medium.path, tmp_path / "seen.raw")
    assert boot_image(seen, EFI_PLATFORM) == NO_PROMPT + b"\0" * (-len(NO_PROMPT) % 512)
    assert boot_image(seen, 0) == bios  # the BIOS entry is as it was
    assert sha256(iso) == before  # the user's ISO is only read
    assert got.medium.path.stat().st_size < 1024 * 1024  # one changed sector, no copy of the ISO
    # The file system is the ISO's: Setup finds its files as on the ISO itself.
    disc = pycdlib.PyCdlib()
    disc.open(str(seen))
    try:
        with disc.open_file_from_iso(udf_path="/" + EFISYS) as f:
            assert f.read() == PROMPTING
    finally:
        disc.close()
    # Everything but the catalog's EFI entry reads as the ISO does.
    entry = next(e for e in boot_entries(iso) if e.platform == EFI_PLATFORM)
    a, b = iso.read_bytes(), seen.read_bytes()
    assert a[:entry.offset] == b[:entry.offset] and a[entry.offset + 32:] == b[entry.offset + 32:]


def test_media_without_the_no_prompt_loader_boot_as_they_are_and_say_so(tmp_path):
    iso = make_bootable_windows_iso(tmp_path / "old.iso", PROMPTING, None)
    got = no_prompt_medium(iso, tmp_path)
    assert not got.no_prompt and got.medium.path == iso and got.medium.format == "raw"
    assert "efisys_noprompt.bin" in got.note and "presses" in got.note


def test_an_iso_without_an_efi_boot_entry_is_used_as_it_is(tmp_path):
    iso = make_iso(tmp_path / "data.iso", {"efi/microsoft/boot/efisys_noprompt.bin": NO_PROMPT})
    assert boot_entries(iso) == []
    got = no_prompt_medium(iso, tmp_path)
    assert not got.no_prompt and got.medium.path == iso and "El Torito entry for EFI" in got.note
    assert not (tmp_path / "install-noprompt.qcow2").exists()
