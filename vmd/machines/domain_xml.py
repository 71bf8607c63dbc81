"""libvirt domain XML built from small typed pieces (after virtinst's device modules).

Each device is a dataclass that knows how to write its own element (domain_devices.py, the
network in domain_network.py); `Domain.to_xml()` assembles them, and vmd's own facts in its
<metadata>. Nothing here talks to libvirt, so the XML is testable on its own and against
libvirt's `test:///default` driver. Which devices a guest of an image gets is decided in
one place, vmd/machines/device_set.py, for sessions and the Windows install alike.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# The pieces, importable from here as before the split (smb_share.py, machine.py, tests).
from vmd.machines.domain_devices import (HOTPLUG_PORT, OVMF_CODE, OVMF_VARS, SMB_CHARDEV, SMB_SERVER,  # noqa: F401
                                         CdRom, DirectKernel, Disk, DiskBoot, GuestAgentChannel, HotplugPort,
                                         HyperV, NinePShare, RunAs, SerialLog, SmbShare, Tablet, Video,
                                         sub_element)
from vmd.machines.domain_network import (EGRESS_NET, NIC_DRIVERS, UserNetwork, egress_netdev_args,  # noqa: F401
                                         nic_macs)

_sub = sub_element

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
# vmd's own facts about a domain, kept in libvirt's <metadata> so that a restarted vmd
# can re-bind to a running guest (the SSH port is otherwise only in QEMU's arguments).
VMD_NS = "https://vmagent.invalid/xmlns/vmd/1"
ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("vmd", VMD_NS)


@dataclass
class VmdOwner:
    """Whose domain this is: the vmd (by its state dir, exactly) and the session. Kept in
    vmd's own <metadata> element, so that the sweep of guests no session owns matches on
    these facts and not on a path somewhere in the XML (a vmd under /srv/x once took the
    guests of one under /data/srv/x for its own). `session` is None for a warm pool slot
    (vmd/machines/warm_pool.py), which no session owns yet; its hand-out sets it."""
    state_dir: str
    session: str | None = None

    def write(self, machine: ET.Element) -> None:
        _sub(machine, f"{{{VMD_NS}}}state-dir", self.state_dir)
        if self.session:
            _sub(machine, f"{{{VMD_NS}}}session", self.session)


def vmd_owner(xml: str | ET.Element) -> VmdOwner | None:
    """The owner a vmd wrote into a domain's XML, or None (a domain of another program, or
    of a vmd older than this element)."""
    root = ET.fromstring(xml) if isinstance(xml, str) else xml
    machine = root.find(f"metadata/{{{VMD_NS}}}machine")
    state_dir = machine.findtext(f"{{{VMD_NS}}}state-dir") if machine is not None else None
    if not state_dir:
        return None
    return VmdOwner(state_dir=state_dir, session=machine.findtext(f"{{{VMD_NS}}}session") or None)


def ssh_port_of(xml: str | ET.Element) -> int | None:
    """The host port of the SSH forward a vmd wrote into a domain's XML, or None (a domain
    vmd did not make)."""
    root = ET.fromstring(xml) if isinstance(xml, str) else xml
    machine = root.find(f"metadata/{{{VMD_NS}}}machine")
    port = machine.get("ssh-port") if machine is not None else None
    return int(port) if port and port.isdigit() else None


def smb_socket_of(xml: str | ET.Element) -> str | None:
    """The Unix socket of the SMB share's character device (SmbShare) that a vmd wrote into
    a domain's XML, or None (a guest with 9p or no share): a restarted vmd relays to it again."""
    root = ET.fromstring(xml) if isinstance(xml, str) else xml
    machine = root.find(f"metadata/{{{VMD_NS}}}machine")
    return (machine.get("smb-socket") or None) if machine is not None else None


def set_session(root: ET.Element, session: str) -> None:
    """Names `session` as the owner in a domain's XML (a warm slot handed to a session)."""
    machine = root.find(f"metadata/{{{VMD_NS}}}machine")
    if machine is None:
        return
    for old in machine.findall(f"{{{VMD_NS}}}session"):
        machine.remove(old)
    _sub(machine, f"{{{VMD_NS}}}session", session)


@dataclass
class Domain:
    name: str
    memory_mib: int
    vcpus: int
    accel: str  # "kvm" or "qemu" (TCG)
    boot: DirectKernel | DiskBoot
    disk: Disk
    network: UserNetwork
    video: Video | None = None
    shared: NinePShare | SmbShare | None = None
    serial: SerialLog | None = None
    emulator: str | None = None
    extra_devices: list = field(default_factory=list)
    description: str = "vmagent guest"
    run_as: RunAs | None = None
    owner: VmdOwner | None = None
    # Windows' enlightenments (device_set.py gives them to every Windows guest), and the
    # Windows install's CDs: the only devices its machine has beyond a session's.
    hyperv: HyperV | None = None
    cdroms: list[CdRom] = field(default_factory=list)

    def to_element(self) -> ET.Element:
        dom = ET.Element("domain", {"type": self.accel})
        _sub(dom, "name", self.name)
        _sub(dom, "description", self.description)
        metadata = _sub(dom, "metadata")
        # One element in vmd's namespace (libvirt keeps one per namespace), its facts inside.
        machine = ET.SubElement(metadata, f"{{{VMD_NS}}}machine")
        if self.network.ssh_port is not None:
            machine.set("ssh-port", str(self.network.ssh_port))
        if isinstance(self.shared, SmbShare):  # QEMU's arguments, where it also is, are not read back
            machine.set("smb-socket", self.shared.socket)
        if self.owner:
            self.owner.write(machine)
        _sub(dom, "memory", str(self.memory_mib), unit="MiB")
        _sub(dom, "vcpu", str(self.vcpus))
        os_el = _sub(dom, "os")
        _sub(os_el, "type", "hvm", arch="x86_64", machine="q35")
        self.boot.write(os_el)
        features = _sub(dom, "features")
        _sub(features, "acpi")
        _sub(features, "apic")
        if self.hyperv:
            self.hyperv.write_features(features)
        # host-passthrough needs KVM; TCG gets QEMU's own model with the extensions it emulates.
        if self.accel == "kvm":
            _sub(dom, "cpu", mode="host-passthrough")
        else:
            _sub(dom, "cpu", mode="maximum", migratable="on")
        clock = _sub(dom, "clock", offset="utc")
        if self.hyperv:
            self.hyperv.write_clock(clock)
        _sub(dom, "on_poweroff", "destroy")
        _sub(dom, "on_reboot", "restart")
        _sub(dom, "on_crash", "destroy")
        devices = _sub(dom, "devices")
        if self.emulator:
            _sub(devices, "emulator", self.emulator)
        self.disk.write(devices)
        for cdrom in self.cdroms:
            cdrom.write(devices)
        if self.shared:
            self.shared.write(devices)
        self.boot.write_devices(devices)
        if self.video:
            self.video.write(devices)
        Tablet().write(devices)
        HotplugPort().write(devices)
        GuestAgentChannel().write(devices)
        if self.serial:
            self.serial.write(devices)
        for device in self.extra_devices:
            device.write(devices)
        _sub(devices, "memballoon", model="none")
        if self.run_as:
            self.run_as.write(dom)
        cmdline = ET.SubElement(dom, f"{{{QEMU_NS}}}commandline")
        share_args = self.shared.qemu_args() if self.shared else []
        netdev_options = self.shared.netdev_options() if self.shared else []
        for arg in share_args + self.network.args(netdev_options):  # a chardev before the netdev naming it
            ET.SubElement(cmdline, f"{{{QEMU_NS}}}arg", {"value": arg})
        return dom

    def to_xml(self) -> str:
        el = self.to_element()
        ET.indent(el)
        return ET.tostring(el, encoding="unicode")
