"""A warm slot of a guest made as Windows guests are (disk boot, UEFI with its own variable
store, a TPM 2.0 by swtpm, the project over SMB), made and handed out by the real pool on
the real libvirt: no Windows can boot here (no KVM, no media), so the guest is OVMF itself
on a blank disk, which runs its boot manager and writes its variables as it would before
Windows. What the pool must get right for such a guest is libvirt's and QEMU's, not
Windows': the undefine once saved (a plain one is refused for a domain with a variable
store), the variable store moved with the slot, swtpm's state carried by the save and
nothing of it left behind. Windows' own part of a slot (its new identity) is tested
against a server that answers like Windows' OpenSSH (tests/vmd/guests/windows/test_windows_guest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from vmd.config import VmdConfig
from vmd.guests.windows.guest import WindowsGuest
from vmd.machines.boot_share import NVRAM_FILE
from vmd.machines.domain_xml import OVMF_VARS
from vmd.machines.host import local_host
from vmd.machines.images import Image
from vmd.machines.machine import Machine
from vmd.machines.smb_share import share_account
from vmd.machines.warm_pool import WarmPool
from vmd.projects.tree import share_owner

pytestmark = pytest.mark.vm

SWTPM_STATE = Path("/var/lib/libvirt/swtpm")


def _uuid_of(conn: libvirt.virConnect, name: str) -> str | None:
    try:
        return conn.lookupByName(name).UUIDString()
    except libvirt.libvirtError:
        return None


def _wait_for(path: Path, text: bytes, seconds: float) -> bool:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if path.is_file() and text in path.read_bytes():
            return True
        time.sleep(0.5)
    return False


@pytest.fixture
def uefi_image(debian_image, request):
    """A Windows-shaped image whose disk is blank (OVMF finds nothing to boot), in a short
    folder QEMU's user passes through, as vmd's state is."""
    if not Path(OVMF_VARS).is_file() or shutil.which("swtpm") is None:
        pytest.fail("ovmf and swtpm are part of the setup (scripts/setup.sh): install them")
    state = Path(tempfile.mkdtemp(prefix="vmdu-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    for folder in (state, state / "sessions", state / "images", state / "images" / "uefi-1"):
        folder.mkdir(mode=0o711, exist_ok=True)
        folder.chmod(0o711)
    disk = state / "images" / "uefi-1" / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "64M"], check=True)
    disk.chmod(0o644)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(disk.parent / "id_ed25519")], check=True)
    image = Image(name="uefi", os_family="windows", user="agent", project_path="Z:\\", resolution=(1024, 768),
                  desktop=True, boot="disk", uefi=True, tpm=True, share="smb", disk_bus="sata", nic="e1000e",
                  dir=state / "images" / "uefi-1")
    # vmd's accelerator probe boots the Debian image's kernel: KVM only where it runs one.
    return image, state, debian_image.dir.parent


def test_a_uefi_tpm_guest_on_smb_is_saved_as_a_slot_and_handed_out_with_its_own_variable_store(
        uefi_image, tmp_path, monkeypatch):
    image, state, images_dir = uefi_image
    firmware_ran = {}

    def ready(machine, timeout, desktop=False, **kwargs):  # OVMF's boot manager, not sshd: see the module
        firmware_ran["boot manager"] = _wait_for(machine.workdir / "console.log", b"BdsDxe", 240)
    monkeypatch.setattr(Machine, "ready", ready)
    monkeypatch.setattr(WindowsGuest, "forget_identity", lambda guest: None)
    config = VmdConfig.load(env={}, state_dir=state, images_dir=images_dir, warm_pool_size=1)
    pool = WarmPool(config, local_host(config.libvirt_uri), size=1)
    conn = libvirt.open(config.libvirt_uri)
    machine = None
    try:
        slot = pool.make_slot(image)
        assert firmware_ran == {"boot manager": True}, (slot / "console.log").read_text(errors="replace")[-2000:]
        name = "vmagent-w-" + slot.name
        # Saved and gone from libvirt: a plain undefine is refused for a domain with a
        # variable store, and the slot's domain stayed defined (and restorable by no one).
        assert _uuid_of(conn, name) is None
        saved = ET.fromstring(conn.saveImageGetXMLDesc(str(slot / "saved.img"), 0))
        # swtpm's state is in the saved image (QEMU migrates it): none is kept in libvirt's
        # folder for a slot that may be discarded unrestored.
        assert not (SWTPM_STATE / saved.findtext("uuid")).exists()
        store = (slot / NVRAM_FILE).read_bytes()  # the slot's own, written by OVMF's boot
        slot_login = share_account(slot)  # the slot's SMB login, made before any session
        assert store != Path(OVMF_VARS).read_bytes()

        project = tmp_path / "project"
        project.mkdir(mode=0o700)
        owner = share_owner(config.share_user)
        if owner is not None:
            os.chown(project, *owner)
        workdir = state / "sessions" / "s-uefi"
        machine = pool.hand_out(pool.take(image), image, workdir=workdir, project_dir=project, session_id="s-uefi")
        assert not slot.exists() and not slot.with_name(slot.name + ".taken").exists()
        assert machine.restored and machine.domain.isActive()
        live = ET.fromstring(machine.domain.XMLDesc(0))
        assert live.findtext("os/nvram") == str(workdir / NVRAM_FILE)
        assert (workdir / NVRAM_FILE).read_bytes() == store
        assert live.find("devices/tpm/backend").get("type") == "emulator"
        uuid = machine.domain.UUIDString()
        assert uuid == saved.findtext("uuid")
        swtpm = subprocess.run(["pgrep", "-af", "swtpm"], capture_output=True, text=True).stdout
        assert uuid in swtpm, swtpm  # the restored guest's TPM runs, on its own state
        assert machine.smb_relay is not None and machine.smb_relay.socket_path.parent.parent == workdir
        # The share's login is the session's, set at the hand-out: a new password, not the
        # slot's; the project is the session's share's uid's.
        login = share_account(workdir)
        assert machine.guest.share_login.password == login.password != slot_login.password
        assert project.stat().st_uid == login.uid
        # The guest runs on after the restore (a guest whose CPU stopped, as under a KVM that
        # fails, stays "running" in libvirt's eyes but uses no more CPU time).
        cpu_before = machine.domain.info()[4]
        time.sleep(3)
        assert machine.domain.info()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert machine.domain.info()[4] > cpu_before
    finally:
        if machine is not None:
            machine.destroy()
        else:
            for domain in conn.listAllDomains():
                if domain.name().startswith("vmagent-w-"):
                    Machine.discard(domain.name(), state, local_host(config.libvirt_uri))
        conn.close()
    assert [d.name() for d in libvirt.open(config.libvirt_uri).listAllDomains() if "vmagent-w-" in d.name()] == []
    assert not (SWTPM_STATE / uuid).exists()  # the session's TPM state went with its guest
