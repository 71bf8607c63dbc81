"""libvirt domain XML built from small typed pieces (after virtinst's device modules).

Each device is a dataclass that knows how to write its own element; `Domain.to_xml()`
assembles them. Nothing here talks to libvirt, so the XML is testable on its own and
against libvirt's `test:///default` driver.
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
# vmd's own facts about a domain, kept in libvirt's <metadata> so that a restarted vmd
# can re-bind to a running guest (the SSH port is otherwise only in QEMU's arguments).
VMD_NS = "https://vmagent.invalid/xmlns/vmd/1"
ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("vmd", VMD_NS)


def sub_element(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    """A child element; attributes given as keywords (a trailing _ for Python's words, such
    as type_), None ones left out. The Windows install's domain is written with it too."""
    el = ET.SubElement(parent, tag, {k.rstrip("_"): v for k, v in attrs.items() if v is not None})
    if text is not None:
        el.text = text
    return el


_sub = sub_element


@dataclass
class DirectKernel:
    """Boot a kernel and initrd from the host: no bootloader, no partition table."""
    kernel: str
    initrd: str
    cmdline: str

    def write(self, os_el: ET.Element) -> None:
        _sub(os_el, "kernel", self.kernel)
        _sub(os_el, "initrd", self.initrd)
        _sub(os_el, "cmdline", self.cmdline)

    def write_devices(self, devices: ET.Element) -> None:
        pass


# Debian's ovmf package. The 4M builds: the 2M ones cannot hold Windows' Secure Boot and
# TPM variables (Debian's README.Debian for ovmf recommends the 4M images for new VMs).
OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"


@dataclass
class DiskBoot:
    """Boot from the guest's own disk: SeaBIOS, or UEFI (OVMF) with a per-domain copy of
    the firmware's variable store (`nvram`: libvirt copies `vars_template` there when the
    file is missing, so the guest's boot entries are its own and never the template's),
    and a TPM 2.0 (swtpm, which libvirt starts per domain) for Windows 11's setup check."""
    uefi: bool = False
    tpm: bool = False
    nvram: str | None = None  # where the domain's variable store lives (its workdir)
    loader: str = OVMF_CODE
    vars_template: str = OVMF_VARS
    # None: the devices' own boot order decides (the Windows install boots its ISO first);
    # libvirt refuses <os><boot> beside per-device <boot order>.
    boot_dev: str | None = "hd"

    def write(self, os_el: ET.Element) -> None:
        if self.uefi:
            if not self.nvram:
                raise ValueError("a UEFI boot needs the path of the domain's own variable store (nvram)")
            _sub(os_el, "loader", self.loader, readonly="yes", type="pflash")
            _sub(os_el, "nvram", self.nvram, template=self.vars_template)
        if self.boot_dev:
            _sub(os_el, "boot", dev=self.boot_dev)

    def write_devices(self, devices: ET.Element) -> None:
        if self.tpm:
            # CRB: the interface Windows 11 expects of a TPM 2.0 on q35 (libvirt's domain
            # format: tpm-tis or tpm-crb; emulator = swtpm run by libvirt for this domain).
            tpm = _sub(devices, "tpm", model="tpm-crb")
            _sub(tpm, "backend", type="emulator", version="2.0")


@dataclass
class Disk:
    path: str
    target: str = "vda"
    bus: str = "virtio"
    format: str = "qcow2"

    def write(self, devices: ET.Element) -> None:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type=self.format, cache="unsafe", discard="unmap")
        _sub(disk, "source", file=self.path)
        _sub(disk, "target", dev=self.target, bus=self.bus)


@dataclass
class NinePShare:
    """A host folder shared over virtio 9p; the guest mounts it by `tag`."""
    source: str
    tag: str = "project"
    # mapped (QEMU's mapped-xattr): the guest's owners, modes, links and device nodes are
    # metadata in user.virtfs.* xattrs on files that belong to QEMU's unprivileged user.
    # passthrough would let a guest's root make root-owned and setuid files on the host.
    accessmode: str = "mapped"

    def write(self, devices: ET.Element) -> None:
        fs = _sub(devices, "filesystem", type="mount", accessmode=self.accessmode)
        _sub(fs, "driver", type="path", wrpolicy="immediate")
        _sub(fs, "source", dir=self.source)
        _sub(fs, "target", dir=self.tag)

    def qemu_args(self) -> list[str]:
        return []

    def netdev_options(self) -> list[str]:
        return []


SMB_SERVER = "10.0.2.4"  # the address QEMU's own smb= uses, so a guest finds it where it is usual
SMB_CHARDEV = "vmdsmb"


@dataclass
class SmbShare:
    """The project folder over SMB, for guests without a 9p driver (Windows).

    The guest's connections to SMB_SERVER:445 are forwarded (slirp guestfwd, which works
    with restrict=on) into a character device: a Unix socket QEMU listens on in the
    session's private workdir (`socket`); vmd connects to it and hands each SMB connection
    of the guest to a fresh smbd of its own configuration (vmd/machines/smb_share.py).
    Not `guestfwd=...-cmd:` nor `smb=`: libvirt starts QEMU with `-sandbox spawn=deny`, so
    QEMU cannot start smbd (checked here: the guest's connection was refused, QEMU logged
    `slirp_socketpair(): Connection refused`), and libslirp's exec pairs QEMU with the
    command through a listener on the host's 127.0.0.1, which every guest's forwards share.
    `source` is the host folder shared (for readers of the XML; smbd's conf names it)."""
    source: str
    socket: str
    name: str = "project"  # the share's name: //10.0.2.4/project

    def write(self, devices: ET.Element) -> None:
        pass

    def qemu_args(self) -> list[str]:
        # server=on,wait=off: QEMU listens and starts at once; vmd connects after the start.
        return ["-chardev", f"socket,id={SMB_CHARDEV},path={self.socket},server=on,wait=off"]

    def netdev_options(self) -> list[str]:
        return [f"guestfwd=tcp:{SMB_SERVER}:445-chardev:{SMB_CHARDEV}"]


@dataclass
class RunAs:
    """QEMU runs as this uid:gid whatever qemu.conf says (a static DAC label); libvirt
    gives it the disk, kernel and console files."""
    uid: int
    gid: int

    def write(self, dom: ET.Element) -> None:
        label = _sub(dom, "seclabel", type="static", model="dac", relabel="yes")
        _sub(label, "label", f"+{self.uid}:+{self.gid}")


@dataclass
class Tablet:
    """A USB tablet: absolute pointer positions, so a click lands where it was aimed."""

    def write(self, devices: ET.Element) -> None:
        _sub(devices, "controller", type="usb", model="qemu-xhci")
        _sub(devices, "input", type="tablet", bus="usb")
        _sub(devices, "input", type="keyboard", bus="usb")


@dataclass
class Video:
    width: int
    height: int
    model: str = "virtio"

    def write(self, devices: ET.Element) -> None:
        video = _sub(devices, "video")
        model = _sub(video, "model", type=self.model, heads="1", primary="yes")
        _sub(model, "resolution", x=str(self.width), y=str(self.height))
        # No <graphics>: no screen server on any port (a VNC server on the host's loopback
        # had no password, and approved egress could reach it). QEMU renders into the video
        # device all the same; vmd reads it with QMP's screendump and sends input with
        # input-send-event, people see it through the preview, which goes through vmd.


@dataclass
class SerialLog:
    """The guest's serial console written to a file: boot messages for error reports."""
    path: str

    def write(self, devices: ET.Element) -> None:
        serial = _sub(devices, "serial", type="file")
        _sub(serial, "source", path=self.path, append="off")
        _sub(serial, "target", port="0")
        console = _sub(devices, "console", type="file")
        _sub(console, "source", path=self.path, append="off")
        _sub(console, "target", type="serial", port="0")


@dataclass
class GuestAgentChannel:
    def write(self, devices: ET.Element) -> None:
        _sub(devices, "controller", type="virtio-serial", index="0")
        channel = _sub(devices, "channel", type="unix")
        _sub(channel, "target", type="virtio", name="org.qemu.guest_agent.0")


EGRESS_NET = "10.0.3.0/24"
HOTPLUG_PORT = "ua-hotplug0"


# The guest tells its SSH NIC by its fixed PCI slot (UserNetwork.pci_addr;
# images/debian/rootfs/etc/systemd/network/10-vmd-ssh.network), not by its address: every
# machine has addresses of its own, and no default that machines could end up sharing.
def nic_macs(name: str) -> tuple[str, str]:
    """(SSH NIC, egress NIC) MAC addresses of the machine named `name`: its own, so no two
    machines share one, and derived from the name, so that vmd knows them again after a
    restart or a warm machine's restore (it keeps its slot's name) without storing them.
    Locally administered unicast under QEMU's 52:54:00 prefix."""
    digest = hashlib.sha256(name.encode()).digest()
    ssh = "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])
    egress = "52:54:00:" + ":".join(f"{b:02x}" for b in digest[3:6])
    if egress == ssh:
        egress = egress[:-2] + f"{int(egress[-2:], 16) ^ 1:02x}"
    return ssh, egress


# QEMU's device for each NIC model an image's manifest may name (images.py `Image.nic`).
NIC_DRIVERS = {"virtio": "virtio-net-pci", "e1000e": "e1000e"}


def egress_netdev_args(mac: str, driver: str = NIC_DRIVERS["virtio"]) -> tuple[str, str]:
    """(netdev, device) for the egress NIC: unrestricted user networking on its own
    subnet, so its route never competes with the SSH NIC's."""
    return (f"user,id=vmdegress,net={EGRESS_NET}",
            f"{driver},netdev=vmdegress,mac={mac},id=vmdegressnic")


@dataclass
class UserNetwork:
    """QEMU user-mode networking with the guest's sshd forwarded to a host loopback port.

    libvirt 9.0 cannot express hostfwd for the slirp backend, so the netdev and its NIC
    go on QEMU's command line. The SSH NIC is always `restrict=on` (no egress, the
    forward still works); egress is a second NIC, present from the start when asked for
    or hot-plugged later when a person approves it.
    """
    ssh_port: int
    ssh_mac: str  # the machine's own: nic_macs(name)
    egress_mac: str
    egress: bool = False
    nic_driver: str = NIC_DRIVERS["virtio"]  # QEMU's device for both NICs (NIC_DRIVERS)
    # Fixed PCI slots far from libvirt's own allocations, which do not know about them. The
    # guest finds its SSH NIC by this slot (pci-0000:00:1e.0).
    pci_addr: str = "0x1e"
    egress_pci_addr: str = "0x1d"

    def args(self, options: list[str] | None = None) -> list[str]:
        """`options`: more of the SSH netdev's options (the SMB share's guestfwd)."""
        netdev = ",".join(["user,id=vmdnet0,restrict=on", f"hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22",
                           *(options or [])])
        args = ["-netdev", netdev,
                "-device", f"{self.nic_driver},netdev=vmdnet0,mac={self.ssh_mac},bus=pcie.0,addr={self.pci_addr}"]
        if self.egress:
            netdev, device = egress_netdev_args(self.egress_mac, self.nic_driver)
            args += ["-netdev", netdev, "-device", f"{device},bus=pcie.0,addr={self.egress_pci_addr}"]
        return args


@dataclass
class HotplugPort:
    """A spare PCIe root port: q35's root bus takes no hot-plugged devices."""
    alias: str = HOTPLUG_PORT
    # Well above the indexes libvirt gives the root ports it adds for its own devices.
    index: int = 16

    def write(self, devices: ET.Element) -> None:
        port = _sub(devices, "controller", type="pci", model="pcie-root-port", index=str(self.index))
        _sub(port, "alias", name=self.alias)


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

    def to_element(self) -> ET.Element:
        dom = ET.Element("domain", {"type": self.accel})
        _sub(dom, "name", self.name)
        _sub(dom, "description", self.description)
        metadata = _sub(dom, "metadata")
        # One element in vmd's namespace (libvirt keeps one per namespace), its facts inside.
        machine = ET.SubElement(metadata, f"{{{VMD_NS}}}machine", {"ssh-port": str(self.network.ssh_port)})
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
        # host-passthrough needs KVM; TCG gets QEMU's own model with the extensions it emulates.
        if self.accel == "kvm":
            _sub(dom, "cpu", mode="host-passthrough")
        else:
            _sub(dom, "cpu", mode="maximum", migratable="on")
        _sub(dom, "clock", offset="utc")
        _sub(dom, "on_poweroff", "destroy")
        _sub(dom, "on_reboot", "restart")
        _sub(dom, "on_crash", "destroy")
        devices = _sub(dom, "devices")
        if self.emulator:
            _sub(devices, "emulator", self.emulator)
        self.disk.write(devices)
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
