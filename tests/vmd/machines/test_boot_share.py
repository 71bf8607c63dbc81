"""Typed boot and share in the domain XML, chosen from the image manifest.

Each combination of boot (the host's kernel, or the guest's disk with SeaBIOS, OVMF,
OVMF and a TPM) and share (9p, SMB) has a golden file under tests/support/golden/boot_share/: a
change to the XML shows as a diff to read; when it is meant, run this file with
--regold and read the diff of the files (tests/support/golden.py). libvirt's test:///default driver
checks that libvirt takes each one and keeps what vmd relies on.
"""

from __future__ import annotations

import json
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from tests.support.golden import assert_golden
from vmd.machines.boot_share import NVRAM_FILE, boot_for, share_for
from vmd.machines.domain_xml import (OVMF_CODE, OVMF_VARS, QEMU_NS, SMB_SERVER, DirectKernel, Disk, DiskBoot, Domain,
                                     NinePShare, SerialLog, SmbShare, UserNetwork, Video, smb_socket_of)
from vmd.machines.images import Image
from vmd.machines.port import MachineError
from vmd.machines.smb_share import release_share

MACS = {"ssh_mac": "52:54:00:a9:00:01", "egress_mac": "52:54:00:e9:00:01"}

BOOTS = {
    "kernel": DirectKernel("/img/vmlinuz", "/img/initrd.img", "root=/dev/vda rw"),
    "disk-bios": DiskBoot(),
    "disk-bios-tpm": DiskBoot(tpm=True),
    "disk-uefi": DiskBoot(uefi=True, nvram="/srv/vm/OVMF_VARS.fd"),
    "disk-uefi-tpm": DiskBoot(uefi=True, tpm=True, nvram="/srv/vm/OVMF_VARS.fd"),
}
SHARES = {
    "9p": NinePShare("/projects/p"),
    "smb": SmbShare(source="/projects/p", socket="/srv/vm/smb/q.sock"),
}
COMBINATIONS = [(b, s) for b in BOOTS for s in SHARES]


def _domain(boot, share, name: str = "t") -> Domain:
    return Domain(name=name, memory_mib=1024, vcpus=2, accel="qemu", boot=boot, disk=Disk("/srv/vm/overlay.qcow2"),
                  network=UserNetwork(ssh_port=40022, **MACS), video=Video(1280, 800), shared=share,
                  serial=SerialLog("/srv/vm/console.log"))


def _args(root: ET.Element) -> list[str]:
    return [a.get("value") for a in root.find(f"{{{QEMU_NS}}}commandline")]


@pytest.mark.parametrize("boot,share", COMBINATIONS)
def test_each_boot_and_share_matches_its_golden_file(boot, share):
    xml = _domain(BOOTS[boot], SHARES[share]).to_xml() + "\n"
    assert_golden(f"boot_share/{boot}+{share}.xml", xml)


@pytest.mark.parametrize("boot,share", COMBINATIONS)
def test_libvirt_takes_each_combination_and_keeps_the_boot_and_share(boot, share):
    conn = libvirt.open("test:///default")
    dom = conn.defineXML(_domain(BOOTS[boot], SHARES[share], name=f"bs-{boot}-{share}").to_xml())
    try:
        back = ET.fromstring(dom.XMLDesc(0))
        os_el = back.find("os")
        if boot == "kernel":
            assert os_el.find("kernel").text == "/img/vmlinuz" and os_el.find("loader") is None
        else:
            assert os_el.find("kernel") is None and os_el.find("boot").get("dev") == "hd"
        if "uefi" in boot:
            loader, nvram = os_el.find("loader"), os_el.find("nvram")
            assert loader.text == OVMF_CODE and loader.get("type") == "pflash" and loader.get("readonly") == "yes"
            # The domain's own variable store, made from the template (never the template itself).
            assert nvram.text == "/srv/vm/OVMF_VARS.fd" and nvram.get("template") == OVMF_VARS
        else:
            assert os_el.find("loader") is None and os_el.find("nvram") is None
        tpm = back.find("devices/tpm")
        if "tpm" in boot:
            assert tpm.get("model") == "tpm-crb"
            assert (tpm.find("backend").get("type"), tpm.find("backend").get("version")) == ("emulator", "2.0")
        else:
            assert tpm is None
        if share == "9p":
            assert back.find("devices/filesystem/source").get("dir") == "/projects/p"
            assert smb_socket_of(back) is None
        else:
            assert back.find("devices/filesystem") is None
            assert smb_socket_of(back) == "/srv/vm/smb/q.sock"  # read back as a restarted vmd does
    finally:
        dom.undefine()  # the test driver keeps no nvram or TPM state (and refuses those flags)


def test_the_smb_share_reaches_the_guest_only_through_a_forward_on_the_restricted_nic():
    args = _args(ET.fromstring(_domain(BOOTS["kernel"], SHARES["smb"]).to_xml()))
    chardev = args[args.index("-chardev") + 1]
    netdev = args[args.index("-netdev") + 1]
    assert args.index("-chardev") < args.index("-netdev")  # QEMU needs the chardev the netdev names
    # QEMU listens on a Unix socket in the session's folder; no TCP port anywhere.
    assert chardev == "socket,id=vmdsmb,path=/srv/vm/smb/q.sock,server=on,wait=off"
    assert netdev.startswith("user,id=vmdnet0,restrict=on,")
    assert f"guestfwd=tcp:{SMB_SERVER}:445-chardev:vmdsmb" in netdev
    assert "smb=" not in netdev and "cmd:" not in netdev


def test_a_uefi_boot_without_its_own_variable_store_is_refused():
    with pytest.raises(ValueError, match="variable store"):
        _domain(DiskBoot(uefi=True), None).to_xml()


def _image(tmp_path: Path, **manifest) -> Image:
    base = dict(name="img", os_family="linux", user="agent", project_path="/mnt/project", resolution=[1024, 768],
                desktop=False, kernel="vmlinuz", initrd="initrd.img", kernel_args="root=/dev/vda")
    base.update(manifest)
    (tmp_path / "manifest.json").write_text(json.dumps(base))
    return Image(**json.loads((tmp_path / "manifest.json").read_text()), dir=tmp_path)


def test_todays_debian_manifest_means_its_kernel_and_9p(tmp_path):
    # The manifest vmd/images/debian/build.sh writes names neither boot nor share.
    image = _image(tmp_path)
    boot = boot_for(image, tmp_path / "w")
    assert boot == DirectKernel(str(tmp_path / "vmlinuz"), str(tmp_path / "initrd.img"), "root=/dev/vda")
    assert share_for(image, tmp_path / "p", tmp_path / "w", None) == NinePShare(str(tmp_path / "p"))
    assert share_for(image, None, tmp_path / "w", None) is None


def test_a_windows_manifest_means_ovmf_a_tpm_and_smb(tmp_path):
    image = _image(tmp_path, os_family="windows", boot="disk", uefi=True, tpm=True, share="smb",
                   kernel=None, initrd=None)
    workdir = tmp_path / "w"
    assert boot_for(image, workdir) == DiskBoot(uefi=True, tpm=True, nvram=str(workdir / NVRAM_FILE))
    (tmp_path / "p").mkdir()
    share = share_for(image, tmp_path / "p", workdir, None)
    assert isinstance(share, SmbShare) and share.source == str(tmp_path / "p")
    assert Path(share.socket).parent == workdir / "smb"
    # vmd's own smbd folder: its configuration and the share's account, private to vmd; the
    # project folder given to the share's own uid.
    assert stat.S_IMODE((workdir / "smb").stat().st_mode) == 0o700
    assert stat.S_IMODE((workdir / "smbd").stat().st_mode) == 0o700
    assert stat.S_IMODE((workdir / "smbd" / "account.json").stat().st_mode) == 0o600
    account = json.loads((workdir / "smbd" / "account.json").read_text())
    assert (tmp_path / "p").stat().st_uid == account["uid"] != 0
    assert f"valid users = {account['user']}" in (workdir / "smbd" / "smb.conf").read_text()
    release_share(workdir)


def test_a_test_may_boot_the_debian_guest_with_smb_and_bad_choices_get_a_sentence(tmp_path):
    image = _image(tmp_path)
    (tmp_path / "p").mkdir()
    assert isinstance(share_for(image, tmp_path / "p", tmp_path / "w", None, kind="smb"), SmbShare)
    release_share(tmp_path / "w")
    with pytest.raises(MachineError, match="vmd shares over 9p or smb"):
        share_for(image, tmp_path / "p", tmp_path / "w", None, kind="nfs")
    with pytest.raises(Exception, match="boot"):
        _image(tmp_path, boot="pxe")
    with pytest.raises(MachineError, match="no kernel or initrd; rebuild it"):
        boot_for(_image(tmp_path, kernel=None), tmp_path / "w")


def test_a_machine_of_a_windows_manifest_gets_ovmf_a_tpm_and_the_smb_forward(tmp_path):
    # The wiring in machine.py, on libvirt's test driver: what the manifest asks is what
    # libvirt is told (the domain.xml vmd keeps), and destroy leaves no domain behind.
    import subprocess

    from vmd.machines.machine import Machine

    folder = tmp_path / "windows-test"
    folder.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "disk.qcow2"), "64M"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_ed25519")], check=True)
    # Built without virtio-win: a SATA disk and e1000e NICs, which Windows drives itself.
    image = _image(folder, os_family="windows", user="agent", project_path="Z:\\", desktop=True, boot="disk",
                   uefi=True, tpm=True, share="smb", kernel=None, initrd=None, disk_bus="sata", nic="e1000e")
    project = tmp_path / "project"
    project.mkdir()
    machine = Machine.create(image, name="win-wiring", workdir=tmp_path / "w", project_dir=project,
                             uri="test:///default")
    try:
        root = ET.fromstring((tmp_path / "w" / "domain.xml").read_text())
        assert root.find("os/loader").text == OVMF_CODE and root.find("os/kernel") is None
        assert root.find("os/nvram").text == str(tmp_path / "w" / NVRAM_FILE)
        assert root.find("devices/tpm").get("model") == "tpm-crb"
        assert root.find("devices/filesystem") is None
        assert any("guestfwd=tcp:10.0.2.4:445-chardev:vmdsmb" in arg for arg in _args(root))
        assert machine.guest.share == "smb"
        # The guest maps the share with the share's own login, which the record never sees.
        account = json.loads((tmp_path / "w" / "smbd" / "account.json").read_text())
        assert machine.guest.share_login.user == account["user"]
        assert machine.guest.share_login.password == account["password"]
        assert account["password"] not in repr(machine.guest.share_login)
        assert account["password"] not in (tmp_path / "w" / "domain.xml").read_text()
        target = root.find("devices/disk[@device='disk']/target")
        assert (target.get("bus"), target.get("dev")) == ("sata", "sda")
        nics = [a for a in _args(root) if "netdev=vmdnet0" in a]
        assert nics and all(a.startswith("e1000e,") for a in nics), nics
    finally:
        machine.destroy()
    assert "win-wiring" not in [d.name() for d in libvirt.open("test:///default").listAllDomains()]
    assert not (tmp_path / "w" / "smbd" / "account.json").exists()  # its uid free, its password gone


def test_a_uefi_guest_is_undefined_with_its_variable_store_on_libvirts_qemu_driver(tmp_path):
    # libvirt's QEMU driver refuses a plain undefine of a domain whose nvram file exists
    # ("cannot undefine domain with nvram"): the sweep and destroy would leave it defined.
    import shutil
    import uuid

    from vmd.machines.domain_life import undefine

    try:
        conn = libvirt.open("qemu:///system")
    except libvirt.libvirtError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"libvirtd must answer in CI: {exc}", pytrace=False)
        pytest.skip(f"libvirtd is not reachable ({exc})")
    nvram = tmp_path / "OVMF_VARS.fd"
    shutil.copy(OVMF_VARS, nvram)  # what libvirt makes from the template at the first start
    name = f"vmdtest-uefi-{uuid.uuid4().hex[:8]}"
    dom = conn.defineXML(_domain(DiskBoot(uefi=True, tpm=True, nvram=str(nvram)), None, name=name).to_xml())
    try:
        with pytest.raises(libvirt.libvirtError, match="nvram"):
            dom.undefine()
        undefine(dom)
        assert name not in [d.name() for d in conn.listAllDomains()]
        assert not nvram.exists()
    finally:
        if name in [d.name() for d in conn.listAllDomains()]:
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        conn.close()


def test_a_machine_whose_project_share_does_not_map_is_not_ready_and_says_why(tmp_path):
    # Before, ready() mapped Z: and never looked: every command lost its Z:\ folder. Now a
    # share the guest could not map stops the machine's ready with the guest's own words.
    import subprocess

    from vmd.guests.guest import GuestFacts
    from vmd.machines.machine import Machine

    folder = tmp_path / "windows-test"
    folder.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "disk.qcow2"), "64M"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_ed25519")], check=True)
    image = _image(folder, os_family="windows", user="agent", project_path="Z:\\", desktop=False, boot="disk",
                   uefi=True, tpm=True, share="smb", kernel=None, initrd=None, disk_bus="sata", nic="e1000e")
    project = tmp_path / "project"
    project.mkdir()
    machine = Machine.create(image, name="win-unmapped", workdir=tmp_path / "w", project_dir=project,
                             uri="test:///default")

    class Unmapped:  # what WindowsGuest answers when net use fails
        share_login = machine.guest.share_login

        def mount_share(self):
            return "net use exited 2: System error 1326 has occurred. The user name or password is incorrect."

        def facts(self):
            return GuestFacts(os="Windows 11 Pro", kernel="", python="none", git="none", desktop=True,
                              project_mounted=False, boot_id="b", hostname="W")

    try:
        machine.guest = Unmapped()
        machine.ssh.transport = lambda: None  # sshd answers
        with pytest.raises(MachineError, match=r"its project share is not mounted at Z:\\ \(net use exited 2: System "
                                               r"error 1326 .*\); nothing it wrote would be kept"):
            machine.ready(timeout=30)
    finally:
        machine.destroy()


def test_a_start_refused_over_libvirts_stale_owner_count_says_what_to_do():
    """libvirt 9's words when its xattr count of a shared kernel's users is stale (seen on
    a CI host after a QEMU ended outside libvirt): the error names the setting that ends it."""
    from vmd.machines.domain_life import owner_count_hint

    words = ("Requested operation is not valid: Setting different DAC user or group on "
             "/var/lib/vmagent/images/debian-x/vmlinuz which is already in use")
    hint = owner_count_hint(words)
    assert "remember_owner = 0" in hint and "restart libvirtd" in hint
    assert owner_count_hint("Requested operation is not valid: domain is already running") == ""
