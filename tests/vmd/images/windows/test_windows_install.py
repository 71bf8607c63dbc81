"""The install boot's wait (vmd/images/windows/install.py run_install) against libvirt's
test:///default driver: the domain starts, the serial log is read until the ready marker
or a failure line, and the domain is shut down and gone either way."""

from __future__ import annotations

import io
import subprocess
import threading
import time

from pathlib import Path

import pytest

from vmd.guests.windows import contract
from vmd.images.windows.install import InstallFailed, run_install
from vmd.images.windows.install_domain import InstallMedium, install_domain
from vmd.machines.images import Image

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
    writer = write_later(tmp_path / "serial.log", f"vmd: OpenSSH Server\r\nvmd: OpenSSH Server: the Win32-OpenSSH MSI"
                                                  f"\r\nvmd: done\r\n{contract.READY_MARKER}\r\n")
    started = time.monotonic()
    out = io.StringIO()
    run_install(domain_xml(tmp_path, "vmd-win-ready"), tmp_path / "serial.log", URI, out,
                poll_s=0.05, boot_key_for_s=0.1)
    writer.join()
    # The guest's steps reach the build's log as they come: which way OpenSSH came, say.
    assert [line for line in out.getvalue().splitlines() if line.startswith("  guest: ")] == [
        "  guest: OpenSSH Server", "  guest: OpenSSH Server: the Win32-OpenSSH MSI", "  guest: done"]
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


# What OVMF prints on COM1 as it boots the install CD (its boot manager's lines).
CD_START = 'BdsDxe: starting Boot0003 "UEFI QEMU DVD-ROM QM00003 " from PciRoot(0x0)/Pci(0x1F,0x2)/Sata(0x1,0xFFFF,0x0)\r\n'
CD_TIMEOUT = ('BdsDxe: failed to start Boot0003 "UEFI QEMU DVD-ROM QM00003 " from '
              'PciRoot(0x0)/Pci(0x1F,0x2)/Sata(0x1,0xFFFF,0x0): Time out\r\n')


def append_later(path, chunks: list[tuple[float, str]]) -> threading.Thread:
    def write():
        for after_s, text in chunks:
            time.sleep(after_s)
            with open(path, "a") as f:
                f.write(text)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_a_missed_cd_prompt_resets_the_machine_and_presses_again(tmp_path):
    log = tmp_path / "serial.log"
    writer = append_later(log, [(0.2, CD_START), (0.1, CD_TIMEOUT), (0.4, CD_START),
                                (0.2, f"vmd: done\r\n{contract.READY_MARKER}\r\n")])
    out = io.StringIO()
    run_install(domain_xml(tmp_path, "vmd-win-missed"), log, URI, out, poll_s=0.05, boot_key_for_s=0.1)
    writer.join()
    assert "prompt went unanswered; resetting the machine (try 2 of 3)" in out.getvalue()
    assert not running("vmd-win-missed")


def test_a_prompt_missed_every_time_ends_the_build_with_the_step_and_a_screenshot(tmp_path):
    log = tmp_path / "serial.log"
    writer = append_later(log, [(0.2, CD_START + CD_TIMEOUT), (0.3, CD_START + CD_TIMEOUT),
                                (0.3, CD_START + CD_TIMEOUT)])
    out = io.StringIO()
    with pytest.raises(InstallFailed) as failed:
        run_install(domain_xml(tmp_path, "vmd-win-never"), log, URI, out, poll_s=0.05, boot_key_for_s=0.1)
    writer.join()
    message = str(failed.value)
    assert "waited for a key that never came (3 tries)" in message
    assert "It stopped in Windows Setup from the install CD" in message
    shot = tmp_path / "install-screen.png"
    assert f"a screenshot of the guest: {shot}" in message and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.getvalue().count("resetting the machine") == 2
    assert not running("vmd-win-never")


def test_with_the_no_prompt_cd_a_time_out_is_no_reason_to_retry(tmp_path):
    log = tmp_path / "serial.log"
    writer = append_later(log, [(0.2, CD_START + CD_TIMEOUT)])
    out = io.StringIO()
    with pytest.raises(InstallFailed, match=r"waited for a key that never came \(1 tries\)"):
        run_install(domain_xml(tmp_path, "vmd-win-noprompt"), log, URI, out, poll_s=0.05, press_keys=False)
    writer.join()
    assert "resetting" not in out.getvalue()


def test_a_firmware_with_nothing_to_boot_ends_the_build_at_once(tmp_path):
    log = tmp_path / "serial.log"
    writer = append_later(log, [(0.2, "BdsDxe: No bootable option or device was found.\r\n")])
    started = time.monotonic()
    with pytest.raises(InstallFailed, match="found nothing to boot.*It stopped in the firmware"):
        run_install(domain_xml(tmp_path, "vmd-win-empty"), log, URI, io.StringIO(), poll_s=0.05,
                    press_keys=False)
    writer.join()
    assert time.monotonic() - started < 10  # not the 2-hour bound


def test_a_timed_out_install_names_the_last_first_logon_step(tmp_path):
    (tmp_path / "serial.log").write_text(CD_START + "vmd: OpenSSH Server\r\n"
                                         "vmd: the OpenSSH capability did not install (timed out); trying the MSI\r\n")
    with pytest.raises(InstallFailed) as failed:
        run_install(domain_xml(tmp_path, "vmd-win-stuck"), tmp_path / "serial.log", URI, io.StringIO(),
                    timeout_s=0.3, poll_s=0.05, press_keys=False)
    assert ("It stopped in the first logon, step 'the OpenSSH capability did not install (timed out); "
            "trying the MSI'") in str(failed.value)


def test_a_ready_guest_is_logged_into_over_ssh_before_the_build_keeps_it(tmp_path):
    from tests.support.windows_ssh_server import Reply, WindowsSshServer
    from vmd.images.windows.install import sshd_takes_key

    (tmp_path / "serial.log").write_text(f"vmd: done\r\n{contract.READY_MARKER}\r\n")
    with WindowsSshServer(tmp_path / "guest", lambda found: Reply(), lambda script: None) as server:
        out = io.StringIO()
        run_install(domain_xml(tmp_path, "vmd-win-ssh"), tmp_path / "serial.log", URI, out, poll_s=0.05,
                    press_keys=False, ssh_check=sshd_takes_key(server.port, "agent", Path(server.key_path)))
        assert "  sshd takes the image's key" in out.getvalue()
        assert server.recorded.connections >= 1
        # Another key than the one the guest was given: refused, and the build says so.
        other = tmp_path / "other_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        with pytest.raises(InstallFailed) as failed:
            run_install(domain_xml(tmp_path, "vmd-win-ssh-no"), tmp_path / "serial.log", URI, io.StringIO(),
                        poll_s=0.05, press_keys=False, ssh_check=sshd_takes_key(server.port, "agent", other, 1.0))
    message = str(failed.value)
    assert "said VMD-READY but vmd could not log in over SSH with the image's key (AuthenticationException" in message
    assert "It stopped in the first logon, step 'done'" in message
    assert not running("vmd-win-ssh-no")


def test_a_guest_whose_sshd_does_not_listen_is_not_kept(tmp_path):
    from vmd.images.windows.install import free_port, sshd_takes_key

    (tmp_path / "serial.log").write_text(f"{contract.READY_MARKER}\r\n")
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(InstallFailed, match=r"could not log in over SSH .*ConnectionRefusedError"):
        run_install(domain_xml(tmp_path, "vmd-win-nossh"), tmp_path / "serial.log", URI, io.StringIO(),
                    poll_s=0.05, press_keys=False, ssh_check=sshd_takes_key(free_port(), "agent", key, 0.5))
