"""The devices of a libvirt domain, each a small typed piece that writes its own element
(after virtinst's device modules); vmd/machines/domain_xml.py assembles them into a domain,
vmd/machines/device_set.py picks them for an image's guests."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass


def sub_element(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    """A child element; attributes given as keywords (a trailing _ for Python's words, such
    as type_), None ones left out."""
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
    # None: the devices' own boot order decides (the Windows install: its disk, then its CD);
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
    # The firmware's order when the domain boots by its devices' order (DiskBoot.boot_dev
    # None: the Windows install, whose disk comes before its CD).
    boot_order: int | None = None

    def write(self, devices: ET.Element) -> None:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type=self.format, cache="unsafe", discard="unmap")
        _sub(disk, "source", file=self.path)
        _sub(disk, "target", dev=self.target, bus=self.bus)
        if self.boot_order:
            _sub(disk, "boot", order=str(self.boot_order))


@dataclass
class CdRom:
    """A read-only CD on SATA, which WinPE reads without a driver: the Windows install's ISO
    (raw, or the qcow2 layer over it that boots it without a key: boot_medium.py) and its seed."""
    path: str
    target: str  # sdb, sdc: SATA ports 1 and 2 (a SATA system disk is sda, port 0, in every machine)
    format: str = "raw"
    boot_order: int | None = None

    def write(self, devices: ET.Element) -> None:
        cd = _sub(devices, "disk", type="file", device="cdrom")
        _sub(cd, "driver", name="qemu", type=self.format)
        _sub(cd, "source", file=self.path)
        _sub(cd, "target", dev=self.target, bus="sata")
        _sub(cd, "readonly")
        if self.boot_order:
            _sub(cd, "boot", order=str(self.boot_order))


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


# MiB: QEMU's std VGA's default video memory, and the least given here.
VGA_MIN_MIB = 16


@dataclass
class Video:
    """The screen. `virtio` for Linux guests (their virtio-gpu driver sets any mode); `vga`
    (QEMU's std VGA) for Windows, which has no driver for either and draws on the mode the
    firmware left: OVMF takes std VGA's preferred mode from its EDID, which QEMU sets from
    xres/yres (libvirt's <resolution>), and ignores virtio-vga's (measured here with Debian
    12's OVMF 2022.11 under QEMU 7.2: std VGA at 1600x900 booted at 1600x900, virtio-vga at
    1600x900 at 1280x800). So the image's resolution is the firmware's, with no display
    driver in the guest."""
    width: int
    height: int
    model: str = "virtio"

    def vram_kib(self) -> int:
        """Room for one frame at 32 bits a pixel, in a power of two MiB (a PCI BAR's size)."""
        mib = VGA_MIN_MIB
        while mib * 1024 * 1024 < self.width * self.height * 4:
            mib *= 2
        return mib * 1024

    def write(self, devices: ET.Element) -> None:
        video = _sub(devices, "video")
        vram = str(self.vram_kib()) if self.model == "vga" else None
        model = _sub(video, "model", type=self.model, vram=vram, heads="1", primary="yes")
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



HOTPLUG_PORT = "ua-hotplug0"


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
class HyperV:
    """Hyper-V enlightenments for a Windows guest: Windows runs markedly faster under KVM
    with these (libvirt's domain format, <features><hyperv> and the hypervclock timer; the
    set virt-install gives Windows). QEMU 7.2 also starts with them under TCG (checked
    here), so a Windows guest has them whatever the accelerator, like its other devices."""
    spinlock_retries: int = 8191

    def write_features(self, features: ET.Element) -> None:
        hyperv = _sub(features, "hyperv", mode="custom")
        _sub(hyperv, "relaxed", state="on")
        _sub(hyperv, "vapic", state="on")
        _sub(hyperv, "spinlocks", state="on", retries=str(self.spinlock_retries))

    def write_clock(self, clock: ET.Element) -> None:
        _sub(clock, "timer", name="hypervclock", present="yes")
