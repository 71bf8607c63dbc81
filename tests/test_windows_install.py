"""The install boot's wait (vmd/windows_image/install.py run_install) against libvirt's
test:///default driver: the domain starts, the serial log is read until the ready marker
or a failure line, and the domain is shut down and gone either way."""

from __future__ import annotations

import io
import threading
import time

import pytest

from vmd.guests import windows_contract as contract
from vmd.windows_image.install import InstallFailed, run_install
from vmd.machines.images import Image
from vmd.windows_image.install_domain import InstallMedium, install_domain

libvirt = pytest.importorskip("libvirt")
# test:///default keeps one state per process for this URI (a fresh open sees earlier domains).
URI = "test:///default"


def domain_xml(tmp_path, name: str) -> str:
    image = Image(name="windows", os_family="windows", user="agent", project_path="Z:\\", resolution=(1280, 800),
                  desktop=True, boot="disk", uefi=True, tpm=True, share="smb", disk_bus="sata", nic="e1000e",
                  dir=tmp_path)
    return install_domain(image, name=name, disk=tmp_path / "d.qcow2", medium=InstallMedium(tmp_path / "win.iso"),
                          seed_iso=tmp_path / "seed.iso", serial_log=tmp_path / "serial.log").to_xml()


def running(name: str) -> bool:
    conn = libvirt.open(URI)
    try:
        return name in [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()


def write_later(path, text: str, after_s: float = 0.3) -> threading.Thread:
    def write():
        time.sleep(after_s)
        path.write_text(text)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_the_install_waits_for_the_ready_marker_then_shuts_the_guest_down(tmp_path):
    writer = write_later(tmp_path / "serial.log", f"vmd: OpenSSH Server\r\nvmd: done\r\n{contract.READY_MARKER}\r\n")
    started = time.monotonic()
    run_install(domain_xml(tmp_path, "vmd-win-ready"), tmp_path / "serial.log", URI, io.StringIO(),
                poll_s=0.05, boot_key_for_s=0.1)
    writer.join()
    assert time.monotonic() - started >= 0.3  # it waited for the line
    assert not running("vmd-win-ready")


def test_a_failed_first_logon_ends_the_install_with_its_line(tmp_path):
    writer = write_later(tmp_path / "serial.log", "vmd: firstlogon failed: icacls failed on C:\\ProgramData\\ssh\r\n")
    with pytest.raises(InstallFailed, match=r"first logon failed: vmd: firstlogon failed: icacls failed"):
        run_install(domain_xml(tmp_path, "vmd-win-fail"), tmp_path / "serial.log", URI, io.StringIO(),
                    poll_s=0.05, boot_key_for_s=0.1)
    writer.join()
    assert not running("vmd-win-fail")


def test_an_install_that_never_gets_ready_times_out_and_is_destroyed(tmp_path):
    with pytest.raises(InstallFailed, match="not ready after"):
        run_install(domain_xml(tmp_path, "vmd-win-slow"), tmp_path / "serial.log", URI, io.StringIO(),
                    timeout_s=0.3, poll_s=0.05, boot_key_for_s=0.1)
    assert not running("vmd-win-slow")


def test_libvirt_refusing_the_domain_is_a_sentence(tmp_path):
    with pytest.raises(InstallFailed, match="libvirt could not start the install machine"):
        run_install("<domain type='kvm'><name>x</name></domain>", tmp_path / "serial.log", URI, io.StringIO(),
                    poll_s=0.05, boot_key_for_s=0.1)
