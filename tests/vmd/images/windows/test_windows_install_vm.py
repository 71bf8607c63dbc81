"""The install machine's boot under real OVMF, QEMU and libvirt (TCG here): the build's
domain (the image's device set, its disk first, then the install CD), with install media
laid out like Microsoft's whose boot loaders are stand-ins that OVMF really runs
(tests/support/efi_loader.py: the prompting one times out as Microsoft's does with no key, the
no-prompt one says the ready marker and powers off).

What only the real firmware shows: that it boots the El Torito entry of the qcow2 layer
over the ISO (boot_medium.py) with no key pressed, passing over the empty disk first; and
that the lines it prints on COM1 are the ones vmd watches for (install_watch.py)."""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import make_traversable
from tests.support.efi_loader import booting_loader, prompting_loader
from tests.support.windows_media import make_bootable_windows_iso
from vmd.guests.windows import contract
from vmd.images.windows.boot_medium import no_prompt_medium
from vmd.images.windows.install import InstallFailed, host_problems, run_install
from vmd.images.windows.install_domain import install_domain
from vmd.machines.images import Image

pytestmark = pytest.mark.vm
libvirt = pytest.importorskip("libvirt")
URI = "qemu:///system"


@pytest.fixture
def build_folder(tmp_path) -> Path:
    if host_problems(lambda: True):
        pytest.skip("ovmf, swtpm or qemu-img missing here (setup.sh installs them)")
    make_traversable(tmp_path)
    folder = tmp_path / "windows-test.partial"
    folder.mkdir(mode=0o711)
    return folder


def install_xml(folder: Path, name: str, medium) -> str:
    image = Image(name="windows", os_family="windows", user="agent", project_path="Z:\\", resolution=(1280, 800),
                  desktop=True, boot="disk", uefi=True, tpm=True, share="smb", disk_bus="sata", nic="e1000e",
                  dir=folder)
    disk = folder / "install.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "1G"], check=True)
    (folder / "seed.iso").write_bytes(b"\0" * 2048 * 16)
    return install_domain(image, name=name, disk=disk, medium=medium, seed_iso=folder / "seed.iso",
                          serial_log=folder / "serial.log", accel="qemu").to_xml()


def gone(name: str) -> bool:
    conn = libvirt.open(URI)
    try:
        return name not in [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()


def test_the_firmware_boots_the_no_prompt_loader_with_no_key_pressed(build_folder):
    work = build_folder.parent
    iso = make_bootable_windows_iso(work / "win.iso", prompting_loader(work), booting_loader(work, contract.READY_MARKER))
    boot = no_prompt_medium(iso, build_folder)
    assert boot.no_prompt
    out = io.StringIO()
    started = time.monotonic()
    run_install(install_xml(build_folder, "vmd-windows-build-vmtest-np", boot.medium), build_folder / "serial.log",
                URI, out, timeout_s=300, poll_s=0.5, press_keys=False)
    log = (build_folder / "serial.log").read_text(errors="replace")
    # The empty disk first, then the CD: its no-prompt loader ran, nobody pressed a key.
    assert 'BdsDxe: starting Boot' in log and '"UEFI QEMU DVD-ROM' in log
    assert "Press any key" not in log and "resetting" not in out.getvalue()
    assert log.index('"UEFI QEMU HARDDISK') < log.index('"UEFI QEMU DVD-ROM')
    assert gone("vmd-windows-build-vmtest-np")
    print(f"booted to the marker in {time.monotonic() - started:.0f} s under TCG")


def test_a_prompt_nobody_answers_is_seen_on_com1_retried_and_said(build_folder):
    # The ISO as it is (media without the no-prompt loader): the loader's prompt times out,
    # as Microsoft's does when the key comes too late; vmd sees it, resets, and at the
    # third miss says so. Its presses cannot reach a loader that does not read keys.
    work = build_folder.parent
    iso = make_bootable_windows_iso(work / "win.iso", prompting_loader(work), None)
    boot = no_prompt_medium(iso, build_folder)
    assert not boot.no_prompt
    out = io.StringIO()
    with pytest.raises(InstallFailed) as failed:
        run_install(install_xml(build_folder, "vmd-windows-build-vmtest-p", boot.medium), build_folder / "serial.log",
                    URI, out, timeout_s=600, poll_s=0.5, boot_key_for_s=5)
    message = str(failed.value)
    assert "waited for a key that never came (3 tries)" in message, message
    assert "It stopped in Windows Setup from the install CD" in message
    shot = build_folder / "install-screen.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.getvalue().count("resetting the machine") == 2
    assert gone("vmd-windows-build-vmtest-p")
