"""The seed medium (vmd/images/windows/seed.py) read back with pycdlib: exactly the expected
Joliet tree (the names Windows reads; it ignores Rock Ridge), the drivers of the edition's
family and architecture taken from a virtio-win ISO in the real layout, and the label the
first logon command finds the medium by."""

from __future__ import annotations

import io

import pycdlib
import pytest

from tests.support.windows_media import VIRTIO_DRIVERS, make_iso, make_virtio_win_iso
from vmd.guests.windows import contract
from vmd.images.windows.editions import Edition, MediaError
from vmd.images.windows.seed import FIRSTLOGON, seed_files, write_seed

WIN11 = Edition(2, "Windows 11 Pro", "", "Professional", "x64", "Client", 10, 0, 22631, ("en-US",))
WIN10 = Edition(2, "Windows 10 Pro", "", "Professional", "x64", "Client", 10, 0, 19045, ("en-US",))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMf vmd"


def read_back(path) -> tuple[dict[str, bytes], str]:
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    files = {}
    for root, _dirs, names in iso.walk(joliet_path="/"):
        for name in names:
            where = f"{root.rstrip('/')}/{name}"
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, joliet_path=where)
            files[where.lstrip("/")] = out.getvalue()
    label = iso.pvd.volume_identifier.decode().strip()
    # Windows shows (and Get-Volume -FileSystemLabel matches) the Joliet label.
    assert iso.joliet_vd.volume_identifier.decode("utf-16-be").strip() == label
    assert not iso.has_rock_ridge()
    iso.close()
    return files, label


def test_the_seed_holds_the_answer_file_drivers_and_oem_folder(tmp_path):
    msi = tmp_path / "OpenSSH-Win64-v9.5.msi"
    msi.write_bytes(b"\xd0\xcf\x11\xe0 an msi")
    seed = write_seed(seed_files("<unattend/>", KEY, WIN11, make_virtio_win_iso(tmp_path), msi), tmp_path / "seed.iso")
    files, label = read_back(seed)
    drivers = {f"$WinPEDriver$/{d}/{d.lower()}.{ext}" for d in VIRTIO_DRIVERS for ext in ("inf", "sys", "cat")}
    assert set(files) == {"Autounattend.xml", "$OEM$/$1/vmd/firstlogon.ps1", "$OEM$/$1/vmd/vmd_key.pub",
                          "$OEM$/$1/vmd/OpenSSH-Win64.msi"} | drivers
    assert label == contract.SEED_LABEL
    assert files["Autounattend.xml"] == b"<unattend/>"
    assert files["$OEM$/$1/vmd/firstlogon.ps1"] == FIRSTLOGON.read_bytes()
    assert files["$OEM$/$1/vmd/vmd_key.pub"] == KEY.encode() + b"\n"
    assert files["$OEM$/$1/vmd/OpenSSH-Win64.msi"] == msi.read_bytes()
    # Windows 11, 64-bit: the w11/amd64 folders, never x86, ARM64 or another family's.
    assert files["$WinPEDriver$/viostor/viostor.sys"] == b"viostor w11 amd64 sys"
    assert all(b" w11 amd64 " in data for path, data in files.items() if path.startswith("$WinPEDriver$"))


def test_windows_10_gets_the_w10_drivers(tmp_path):
    files, _ = read_back(write_seed(seed_files("<u/>", KEY, WIN10, make_virtio_win_iso(tmp_path)), tmp_path / "s.iso"))
    assert files["$WinPEDriver$/NetKVM/netkvm.inf"] == b"NetKVM w10 amd64 inf"


def test_without_virtio_win_there_is_no_driver_folder(tmp_path):
    files, _ = read_back(write_seed(seed_files("<u/>", KEY, WIN11), tmp_path / "s.iso"))
    assert set(files) == {"Autounattend.xml", "$OEM$/$1/vmd/firstlogon.ps1", "$OEM$/$1/vmd/vmd_key.pub"}


def test_a_virtio_iso_without_the_disk_driver_for_the_edition_is_refused(tmp_path):
    iso = make_iso(tmp_path / "old-virtio.iso", {"viostor/2k8/amd64/viostor.sys": b"x"}, udf=False, joliet=True)
    with pytest.raises(MediaError, match=r"no viostor/w11/amd64 folder.*Windows 11 Pro"):
        seed_files("<u/>", KEY, WIN11, iso)


def test_missing_driver_or_msi_files_say_what_to_pass(tmp_path):
    with pytest.raises(MediaError, match="no virtio-win ISO at .*--virtio-win"):
        seed_files("<u/>", KEY, WIN11, tmp_path / "absent.iso")
    with pytest.raises(MediaError, match="no OpenSSH MSI at .*--openssh-msi"):
        seed_files("<u/>", KEY, WIN11, None, tmp_path / "absent.msi")
