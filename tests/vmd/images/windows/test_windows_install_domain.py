"""The machine that installs Windows has the devices of every session's machine of the image
(vmd/machines/device_set.py), so Windows, which binds drivers to a device's identity and
slot, meets at each cold boot of the base the machine it was installed on.

The session's domain is the one vmd writes when it starts a session's machine
(Machine.create on libvirt's test:///default driver), the install's the one the build
hands to libvirt; both are golden files under tests/support/golden/windows_machines/, and libvirt
takes each with schema validation (the domain.rng libvirtd itself uses)."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.golden import assert_golden
from vmd.images.windows.install_domain import InstallMedium, device_set_xml, install_domain
from vmd.machines.domain_xml import QEMU_NS
from vmd.machines.images import Image

libvirt = pytest.importorskip("libvirt")
TEST_URI = "test:///default"
# Windows 11 built without virtio-win (SATA, e1000e, a TPM); Server built with it (virtio).
KINDS = {"win11-sata": dict(tpm=True, disk_bus="sata", nic="e1000e"),
         "server-virtio": dict(tpm=False, disk_bus="virtio", nic="virtio")}


def windows_image(folder: Path, kind: str) -> Image:
    return Image(name="windows", os_family="windows", user="agent", project_path="Z:\\", resolution=(1280, 800),
                 desktop=True, boot="disk", uefi=True, share="smb", dir=folder, **KINDS[kind])


def install_xml(image: Image, accel: str = "kvm") -> str:
    return install_domain(image, name="vmd-windows-build-t", disk=image.dir / "install.qcow2",
                          medium=InstallMedium(Path("/media/Win11.iso")), seed_iso=image.dir / "seed.iso",
                          serial_log=image.dir / "serial.log", run_as=(64055, 64055), accel=accel).to_xml()


def session_xml(tmp_path: Path, kind: str) -> str:
    """The domain vmd starts for a session on an image of `kind`, as it writes it."""
    from vmd.config import VmdConfig
    from vmd.machines.machine import Machine

    folder = tmp_path / "windows-img"
    folder.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "disk.qcow2"), "64M"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_ed25519")], check=True)
    config = VmdConfig.load(env={}, images_dir=str(tmp_path), state_dir=str(tmp_path / "state"), accel="kvm")
    machine = Machine.create(windows_image(folder, kind), name=f"vmagent-w-{kind}", workdir=tmp_path / "w",
                             project_dir=None, uri=TEST_URI, config=config)
    try:
        return (tmp_path / "w" / "domain.xml").read_text()
    finally:
        machine.destroy()


def shape(el: ET.Element) -> tuple:
    """An element without what differs between two machines of one image and is no device
    Windows keeps: files' paths, the domain's own MACs."""
    attrs = {k: v for k, v in el.attrib.items() if k not in ("file", "path", "dir")}
    return el.tag, tuple(sorted(attrs.items())), tuple(shape(child) for child in el)


def nic_device(root: ET.Element) -> str:
    args = [a.get("value") for a in root.find(f"{{{QEMU_NS}}}commandline")]
    device = args[args.index("-device") + 1]
    return ",".join(part for part in device.split(",") if not part.startswith("mac="))


@pytest.mark.parametrize("kind", KINDS)
def test_the_install_machine_has_the_devices_of_every_session_machine(tmp_path, kind):
    # The session's own paths and port, and this host's uid of QEMU's user, for the golden file.
    session_text = re.sub(r'(ssh-port="|127\.0\.0\.1:)\d+', r"\g<1>PORT",
                          session_xml(tmp_path, kind).replace(str(tmp_path), "/session"))
    session_text = re.sub(r"<label>\+\d+:\+\d+</label>", "<label>+QEMU:+QEMU</label>", session_text)
    session = ET.fromstring(session_text)
    install = ET.fromstring(install_xml(windows_image(Path("/images/windows.partial"), kind)))
    # The same devices in the same order (libvirt gives PCI slots in that order): the
    # install has its two CDs besides, and nothing else.
    session_devices = [shape(d) for d in session.find("devices") if d.tag != "emulator"]
    install_devices = [shape(d) for d in install.find("devices")
                       if not (d.tag == "disk" and d.get("device") == "cdrom")]
    # The install's disk carries the firmware's boot order (disk, then CD); the session's
    # firmware boots its disk by <os><boot dev='hd'/>.
    assert [d for d in install_devices if d[0] != "disk"] == [d for d in session_devices if d[0] != "disk"]
    strip_boot = lambda d: (d[0], d[1], tuple(c for c in d[2] if c[0] != "boot"))  # noqa: E731
    assert [strip_boot(d) for d in install_devices if d[0] == "disk"] == \
        [strip_boot(d) for d in session_devices if d[0] == "disk"]
    for path in ("features", "cpu", "clock"):
        assert shape(install.find(path)) == shape(session.find(path)), path
    assert install.find("features/hyperv") is not None and install.find("clock/timer").get("name") == "hypervclock"
    # The NIC on QEMU's command line: the same device at the same slot (only its MAC is the machine's own).
    assert nic_device(install) == nic_device(session)
    assert "addr=0x1e" in nic_device(session)
    # Windows has no driver for virtio-gpu or std VGA: it draws on the firmware's mode,
    # which std VGA takes from the resolution (domain_devices.Video).
    model = install.find("devices/video/model")
    assert model.get("type") == "vga" and model.find("resolution").attrib == {"x": "1280", "y": "800"}
    # Side by side for a reader: what a session gets and what the install got.
    assert_golden(f"windows_machines/{kind}-session.xml", session_text)
    assert_golden(f"windows_machines/{kind}-install.xml", install_xml(windows_image(Path("/images/windows.partial"), kind)))


@pytest.mark.parametrize("kind", KINDS)
def test_libvirt_accepts_the_install_domain(kind):
    image = windows_image(Path("/images/w.partial"), kind)
    conn = libvirt.open(TEST_URI)
    try:
        defined = conn.defineXMLFlags(install_xml(image), libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        back = ET.fromstring(defined.XMLDesc(0))
        defined.undefine()
    finally:
        conn.close()
    assert back.find("os/loader").get("type") == "pflash"
    assert back.find("os/nvram").text == "/images/w.partial/OVMF_VARS.fd"  # the manifest's uefi_vars
    assert (back.find("devices/tpm") is not None) == KINDS[kind]["tpm"]
    system = back.find("devices/disk[@device='disk']")
    assert system.find("target").attrib == ({"dev": "sda", "bus": "sata"} if kind == "win11-sata"
                                            else {"dev": "vda", "bus": "virtio"})
    orders = {d.find("source").get("file"): d.find("boot").get("order")
              for d in back.iterfind("devices/disk") if d.find("boot") is not None}
    # The disk first: empty, the firmware passes on to the CD; once Setup has written
    # Windows to it, every reboot of Setup boots Windows and not the CD again.
    assert orders == {"/images/w.partial/install.qcow2": "1", "/media/Win11.iso": "2"}
    assert back.find("devices/serial/source").get("path") == "/images/w.partial/serial.log"


def test_the_schema_check_is_real():
    broken = install_xml(windows_image(Path("/i"), "win11-sata")).replace("<readonly />", "<readonly /><nope />", 1)
    conn = libvirt.open(TEST_URI)
    try:
        with pytest.raises(libvirt.libvirtError, match="failed to validate against schema"):
            conn.defineXMLFlags(broken, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    finally:
        conn.close()


def test_the_install_reaches_the_internet_and_forwards_only_its_sshd():
    # Its first logon may fetch OpenSSH from Windows Update; nothing of a session runs in it.
    image = windows_image(Path("/i"), "win11-sata")
    root = ET.fromstring(install_xml(image))
    args = [a.get("value") for a in root.find(f"{{{QEMU_NS}}}commandline")]
    assert args[args.index("-netdev") + 1] == "user,id=vmdnet0"
    forwarded = install_domain(image, name="b", disk=Path("/i/d"), medium=InstallMedium(Path("/m.iso")),
                               seed_iso=Path("/i/s.iso"), serial_log=Path("/i/l"), ssh_port=40122)
    args = [a.get("value") for a in ET.fromstring(forwarded.to_xml()).find(f"{{{QEMU_NS}}}commandline")]
    assert args[args.index("-netdev") + 1] == "user,id=vmdnet0,hostfwd=tcp:127.0.0.1:40122-:22"


def test_the_device_set_s_text_names_no_path_of_the_build():
    image = windows_image(Path("/srv/images/windows-0123.partial"), "win11-sata")
    text = device_set_xml(image)
    assert "/srv/images" not in text and "/image/install.qcow2" in text
    assert device_set_xml(image) == device_set_xml(windows_image(Path("/elsewhere"), "win11-sata"))
