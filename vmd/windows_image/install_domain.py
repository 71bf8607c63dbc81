"""The libvirt domain that installs Windows: q35, UEFI (OVMF), a TPM 2.0 (swtpm) for
Windows 11, the user's ISO and the seed as CD-ROMs, COM1 logged to a file.

Built from small typed pieces; the firmware is the sessions' own `DiskBoot`
(vmd/machines/domain_xml.py: OVMF's 4M images, tpm-crb with libvirt's emulator backend), so
the install and the guests it makes boot alike.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from vmd.machines.domain_xml import DiskBoot
from vmd.machines.domain_xml import sub_element as _sub

# Windows 11's minimum is 4 GiB and 2 cores (Setup checks both unless bypassed); Setup
# itself runs in ~2 GiB, more only shortens the install.
INSTALL_MEMORY_MIB = 4096
INSTALL_VCPUS = 2
# 64 GB is Windows 11's minimum disk; the qcow2 only holds what Windows writes (~12-20 GB).
DISK_GB = 64


@dataclass
class CdRom:
    path: str
    target: str  # sda, sdb...: SATA, which WinPE reads without a driver
    boot_order: int | None = None

    def write(self, devices: ET.Element) -> None:
        cd = _sub(devices, "disk", type="file", device="cdrom")
        _sub(cd, "driver", name="qemu", type="raw")
        _sub(cd, "source", file=self.path)
        _sub(cd, "target", dev=self.target, bus="sata")
        _sub(cd, "readonly")
        if self.boot_order:
            _sub(cd, "boot", order=str(self.boot_order))


@dataclass
class SystemDisk:
    """virtio when the seed carries viostor, else SATA (AHCI: Windows' own driver, slower)."""
    path: str
    virtio: bool

    def write(self, devices: ET.Element) -> None:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
        _sub(disk, "source", file=self.path)
        _sub(disk, "target", dev="vda" if self.virtio else "sdc", bus="virtio" if self.virtio else "sata")
        _sub(disk, "boot", order="2")


def install_firmware(nvram: str, tpm: bool) -> DiskBoot:
    """UEFI with the install's own variable store and, for Windows 11, a TPM; the boot
    order is the devices' (the user's ISO first, then the disk Setup writes)."""
    return DiskBoot(uefi=True, tpm=tpm, nvram=nvram, boot_dev=None)


@dataclass
class InstallDomain:
    name: str
    firmware: DiskBoot  # install_firmware()
    disk: SystemDisk
    install_iso: str
    seed_iso: str
    serial_log: str
    virtio_net: bool
    run_as: tuple[int, int] | None = None
    memory_mib: int = INSTALL_MEMORY_MIB
    vcpus: int = INSTALL_VCPUS

    def to_element(self) -> ET.Element:
        # Setup is only ever run with KVM (the build refuses without it): hours under TCG.
        dom = ET.Element("domain", {"type": "kvm"})
        _sub(dom, "name", self.name)
        _sub(dom, "description", "vmagent: Windows image install (vmd images build windows)")
        _sub(dom, "memory", str(self.memory_mib), unit="MiB")
        _sub(dom, "vcpu", str(self.vcpus))
        os_el = _sub(dom, "os")
        _sub(os_el, "type", "hvm", arch="x86_64", machine="q35")
        self.firmware.write(os_el)
        features = _sub(dom, "features")
        _sub(features, "acpi")
        _sub(features, "apic")
        # Hyper-V enlightenments: Windows runs markedly faster under KVM with these.
        hyperv = _sub(features, "hyperv", mode="custom")
        _sub(hyperv, "relaxed", state="on")
        _sub(hyperv, "vapic", state="on")
        _sub(hyperv, "spinlocks", state="on", retries="8191")
        _sub(dom, "cpu", mode="host-passthrough")
        clock = _sub(dom, "clock", offset="utc")
        _sub(clock, "timer", name="hypervclock", present="yes")
        # Setup reboots twice; the domain must come back each time, and end when Windows shuts down.
        _sub(dom, "on_poweroff", "destroy")
        _sub(dom, "on_reboot", "restart")
        _sub(dom, "on_crash", "destroy")
        devices = _sub(dom, "devices")
        self.disk.write(devices)
        CdRom(self.install_iso, "sda", boot_order=1).write(devices)
        CdRom(self.seed_iso, "sdb").write(devices)
        self.firmware.write_devices(devices)
        # The first logon installs OpenSSH as a Feature on Demand, which Windows downloads;
        # user-mode networking, like every vmd guest's.
        nic = _sub(devices, "interface", type="user")
        _sub(nic, "model", type="virtio" if self.virtio_net else "e1000e")
        serial = _sub(devices, "serial", type="file")
        _sub(serial, "source", path=self.serial_log)
        _sub(serial, "target", port="0")
        _sub(devices, "input", type="tablet", bus="usb")
        video = _sub(devices, "video")
        _sub(video, "model", type="vga", vram="16384")
        _sub(devices, "memballoon", model="none")
        if self.run_as:
            label = _sub(dom, "seclabel", type="static", model="dac", relabel="yes")
            _sub(label, "label", f"+{self.run_as[0]}:+{self.run_as[1]}")
        return dom

    def to_xml(self) -> str:
        el = self.to_element()
        ET.indent(el)
        return ET.tostring(el, encoding="unicode")
