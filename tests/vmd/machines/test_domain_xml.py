"""Domain XML and the machine life cycle against libvirt's test:///default driver.

No hypervisor is needed: the test driver accepts and "runs" the domain, so what libvirt
would be told and what is left after destroy are checked here; what only QEMU can show
is in test_machine_vm.py.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from tests.support.golden import assert_golden
from vmd.machines import machine as machine_module
from vmd.machines.domain_xml import QEMU_NS, DirectKernel, Disk, Domain, NinePShare, SerialLog, UserNetwork, Video
from vmd.machines.images import Image, ImageMissing, find_image
from vmd.machines.machine import Machine
from vmd.machines.port import MachineError

TEST_URI = "test:///default"
# The whole domain of `_domain()`, as vmd would hand it to libvirt. A change to the XML
# shows here as a diff to read; when it is meant, --regold writes it (tests/support/golden.py).
GOLDEN = "domain.xml"


# The addresses in tests/support/golden/domain.xml.
MACS = {"ssh_mac": "52:54:00:a9:00:01", "egress_mac": "52:54:00:e9:00:01"}


def _domain(**overrides) -> Domain:
    spec = dict(name="t", memory_mib=1024, vcpus=2, accel="qemu",
                boot=DirectKernel("/img/vmlinuz", "/img/initrd.img", "root=/dev/vda rw"),
                disk=Disk("/srv/vm/overlay.qcow2"), network=UserNetwork(ssh_port=40022, **MACS),
                video=Video(1280, 800), shared=NinePShare("/projects/p"),
                serial=SerialLog("/srv/vm/console.log"))
    spec.update(overrides)
    return Domain(**spec)


def test_the_xml_matches_the_golden_file():
    assert_golden(GOLDEN, _domain().to_xml() + "\n")


def test_the_xml_asks_for_what_the_agent_relies_on():
    root = ET.fromstring(_domain().to_xml())
    assert root.get("type") == "qemu"
    assert root.find("os/kernel").text == "/img/vmlinuz"
    assert root.find("os/cmdline").text == "root=/dev/vda rw"
    assert root.find("devices/disk/source").get("file") == "/srv/vm/overlay.qcow2"
    assert root.find("devices/input[@type='tablet']").get("bus") == "usb"
    fs = root.find("devices/filesystem")
    assert fs.find("source").get("dir") == "/projects/p" and fs.find("target").get("dir") == "project"
    res = root.find("devices/video/model/resolution")
    assert (res.get("x"), res.get("y")) == ("1280", "800")
    args = [a.get("value") for a in root.find(f"{{{QEMU_NS}}}commandline")]
    netdev = args[args.index("-netdev") + 1]
    assert "hostfwd=tcp:127.0.0.1:40022-:22" in netdev
    assert "restrict=on" in netdev  # egress closed by default


def test_egress_is_opened_only_when_asked_and_kvm_gets_host_cpu():
    root = ET.fromstring(_domain(accel="kvm", network=UserNetwork(40022, **MACS, egress=True)).to_xml())
    assert root.get("type") == "kvm"
    assert root.find("cpu").get("mode") == "host-passthrough"
    args = [a.get("value") for a in root.find(f"{{{QEMU_NS}}}commandline")]
    netdevs = [args[i + 1] for i, a in enumerate(args) if a == "-netdev"]
    # The SSH NIC stays restricted; egress is a second, unrestricted NIC on its own subnet.
    assert netdevs[0].startswith("user,id=vmdnet0,restrict=on")
    assert netdevs[1] == "user,id=vmdegress,net=10.0.3.0/24"


def test_a_headless_machine_without_project_has_no_screen_or_share():
    root = ET.fromstring(_domain(video=None, shared=None).to_xml())
    assert root.find("devices/video") is None and root.find("devices/filesystem") is None


def test_libvirt_accepts_the_xml_and_keeps_our_devices():
    conn = libvirt.open(TEST_URI)
    dom = conn.defineXML(_domain(name="xml-roundtrip").to_xml())
    try:
        back = ET.fromstring(dom.XMLDesc(0))
        assert back.find("devices/input[@type='tablet']") is not None
        assert back.find("devices/filesystem/source").get("dir") == "/projects/p"
    finally:
        dom.undefine()


@pytest.fixture
def fake_image(tmp_path) -> Image:
    folder = tmp_path / "debian-test"
    folder.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "disk.qcow2"), "64M"], check=True)
    for name in ("vmlinuz", "initrd.img", "id_ed25519"):
        (folder / name).write_text("")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "key")], check=True)
    (folder / "id_ed25519").write_text((folder / "key").read_text())
    manifest = dict(name="debian", os_family="linux", user="agent", project_path="/mnt/project",
                    resolution=[1024, 768], desktop=True, kernel="vmlinuz", initrd="initrd.img",
                    kernel_args="root=/dev/vda")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return find_image("debian", tmp_path)


def test_create_suspend_resume_destroy_on_the_test_driver(fake_image, tmp_path):
    machine = Machine.create(fake_image, name="life", workdir=tmp_path / "w",
                             project_dir=tmp_path, uri=TEST_URI)
    overlay = tmp_path / "w" / "overlay.qcow2"
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(overlay)],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["backing-filename"].endswith("disk.qcow2")  # an overlay, never the base
    assert machine.state() == "running"
    machine.suspend()
    assert machine.state() == "paused"
    machine.resume()
    assert machine.state() == "running"
    again = Machine.attach(fake_image, name="life", workdir=tmp_path / "w", project_dir=tmp_path, uri=TEST_URI)
    assert again.ssh_port == machine.ssh_port
    machine.destroy()
    assert "life" not in [d.name() for d in libvirt.open(TEST_URI).listAllDomains()]
    assert not overlay.exists()
    with pytest.raises(MachineError, match="no longer exists"):
        Machine.attach(fake_image, name="life", workdir=tmp_path / "w", project_dir=None, uri=TEST_URI)


def test_a_guest_that_never_answers_gets_a_sentence(fake_image, tmp_path):
    machine = Machine.create(fake_image, name="silent", workdir=tmp_path / "w", project_dir=None, uri=TEST_URI)
    try:
        with pytest.raises(MachineError, match="did not answer over SSH within 2 s.*longer timeout"):
            machine.ready(timeout=2)
    finally:
        machine.destroy()


def test_an_image_without_its_key_is_refused_before_a_guest_starts(fake_image, tmp_path):
    (fake_image.dir / "id_ed25519").unlink()
    with pytest.raises(MachineError, match=r"has no SSH key for its guest at .*id_ed25519; rebuild it with "
                                           r"`vmd images build debian`"):
        Machine.create(fake_image, name="keyless", workdir=tmp_path / "w", project_dir=None, uri=TEST_URI)
    assert "keyless" not in [d.name() for d in libvirt.open(TEST_URI).listAllDomains()]


def test_a_guest_vmd_cannot_take_over_once_started_is_destroyed(fake_image, tmp_path, monkeypatch):
    # The domain runs before vmd builds its Machine (SSH, guest, screen, SMB relay): a failure
    # there must not leave a guest running that no session owns.
    def broken(domain, workdir, max_starts):
        raise OSError("the relay's socket folder is gone")
    monkeypatch.setattr(machine_module, "relay_for", broken)
    with pytest.raises(MachineError, match=r"the guest 'orphan' started but vmd could not take it over "
                                           r"\(OSError: the relay's socket folder is gone\); it was destroyed"):
        Machine.create(fake_image, name="orphan", workdir=tmp_path / "w", project_dir=None, uri=TEST_URI)
    assert "orphan" not in [d.name() for d in libvirt.open(TEST_URI).listAllDomains()]
    assert not (tmp_path / "w" / "overlay.qcow2").exists()


def test_a_missing_image_says_how_to_build_it(tmp_path):
    with pytest.raises(ImageMissing, match="vmd images build debian"):
        find_image("debian", tmp_path)


def test_libvirt_not_running_says_how_to_start_it(fake_image, tmp_path):
    uri = f"qemu+unix:///system?socket={tmp_path}/no-libvirt.sock"
    with pytest.raises(MachineError, match="libvirtd -d"):
        Machine.create(fake_image, name="nolibvirt", workdir=tmp_path / "w", project_dir=None, uri=uri)


def test_every_machine_has_nic_addresses_of_its_own_that_vmd_can_derive_again():
    import re

    from vmd.machines.domain_xml import nic_macs

    first, second = nic_macs("vmagent-w-0123456789ab"), nic_macs("vmagent-w-ba9876543210")
    assert nic_macs("vmagent-w-0123456789ab") == first  # known again after a restart or a restore
    assert len({*first, *second}) == 4
    for mac in (*first, *second):
        assert re.fullmatch(r"52:54:00(:[0-9a-f]{2}){3}", mac), mac
    args = UserNetwork(40022, egress=True, ssh_mac=first[0], egress_mac=first[1]).args()
    assert f"mac={first[0]},bus=pcie.0,addr=0x1e" in args[3]  # the guest finds its SSH NIC in this slot
    assert f"mac={first[1]}," in args[7]


def test_no_guest_has_a_screen_server_on_any_port():
    # A VNC listener on the host's loopback had no password; approved egress reached it.
    root = ET.fromstring(_domain().to_xml())
    assert root.findall("./devices/graphics") == []
    assert root.find("./devices/video") is not None  # QEMU still renders; screendump reads it


def test_the_accel_in_vmds_config_file_is_what_its_machines_and_warm_pool_use(fake_image, tmp_path, monkeypatch):
    # `vmd serve --config FILE` with accel in the file and nothing in the environment: the
    # doctor obeyed the file, the machines and the warm pool read the environment instead.
    from vmd.config import VmdConfig
    from vmd.machines import accel
    from vmd.machines.libvirt_machines import LibvirtMachines
    from vmd.machines.port import MachineSpec
    from vmd.machines.warm_pool import WarmPool

    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.delenv("VMD_ACCEL", raising=False)
    monkeypatch.setattr(accel, "kvm_works", lambda: True)  # what "auto" would pick on this host
    (tmp_path / "vmd.toml").write_text('accel = "qemu"\n')
    config = VmdConfig.load(tmp_path / "vmd.toml", state_dir=str(tmp_path / "state"), images_dir=str(tmp_path),
                            libvirt_uri=TEST_URI, warm_pool_size=1, share_user="nobody")
    machines = LibvirtMachines(config)
    made = machines.create(MachineSpec(session_id="s-20260101-000000-abcdef", os="debian", name="accel-file",
                                       workdir=tmp_path / "w", project_dir=None))
    try:
        assert made.machine.accel == "qemu"
        assert ET.fromstring(made.machine.domain.XMLDesc(0)).get("type") == "qemu"
        assert machines.timeout_scale() == 4.0  # TCG's, as the file says, not KVM's
    finally:
        made.destroy()
    monkeypatch.setattr(WarmPool, "start", lambda pool, find_image: pool)  # no slot made here
    machines.start_pool()
    assert machines.pool.timeout_scale() == 4.0


def test_the_image_manifest_picks_the_guest_and_session_open_can_say_its_family(fake_image, tmp_path):
    from vmd.config import VmdConfig
    from vmd.guests.linux.guest import LinuxGuest
    from vmd.machines.libvirt_machines import LibvirtMachines
    from vmd.machines.port import MachineError

    machine = Machine.create(fake_image, name="family", workdir=tmp_path / "w", project_dir=None, uri=TEST_URI)
    try:
        assert isinstance(machine.guest, LinuxGuest) and machine.guest.os_family == "linux"
    finally:
        machine.destroy()
    machines = LibvirtMachines(VmdConfig.load(env={}, images_dir=str(tmp_path), state_dir=str(tmp_path / "s")))
    assert machines.os_family("debian") == "linux" and machines.os_family("plan9") is None
    manifest = json.loads((fake_image.dir / "manifest.json").read_text())
    (fake_image.dir / "manifest.json").write_text(json.dumps({**manifest, "os_family": "haiku"}))
    with pytest.raises(MachineError, match="is haiku: this vmd drives linux, windows guests; no guest class"):
        Machine.create(find_image("debian", tmp_path), name="hk", workdir=tmp_path / "w2", project_dir=None,
                       uri=TEST_URI)
    assert machines.os_family("debian") == "haiku"
