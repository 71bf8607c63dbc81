"""The libvirt domain that installs Windows: the image's own device set (vmd/machines/
device_set.py: the devices every session's machine of the image will have, so Windows meets
at each cold boot the machine it was installed on), plus the user's ISO and the seed as
CDs, its firmware trying the disk before the CD, COM1 logged to a file, and a first NIC
that reaches the internet (the first logon may fetch OpenSSH from Windows Update) with the
guest's sshd forwarded to the host's loopback (the build logs in once it is ready).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vmd.machines.device_set import device_set
from vmd.machines.domain_devices import CdRom, RunAs, SerialLog
from vmd.machines.domain_network import nic_macs
from vmd.machines.domain_xml import Domain
from vmd.machines.images import Image

# Windows 11's minimum is 4 GiB and 2 cores (Setup checks both unless bypassed); Setup
# itself runs in ~2 GiB, more only shortens the install.
INSTALL_MEMORY_MIB = 4096
INSTALL_VCPUS = 2
# 64 GB is Windows 11's minimum disk; the qcow2 only holds what Windows writes (~12-20 GB).
DISK_GB = 64
# SATA ports 1 and 2: port 0 is the system disk's when it is SATA, in sessions as here.
INSTALL_CD, SEED_CD = "sdb", "sdc"


@dataclass(frozen=True)
class InstallMedium:
    """What the install CD drive reads: the user's ISO (raw), or the qcow2 layer over it
    whose El Torito entry boots Setup without a key (vmd/images/windows/boot_medium.py)."""
    path: Path
    format: str = "raw"


def install_domain(image: Image, *, name: str, disk: Path, medium: InstallMedium, seed_iso: Path, serial_log: Path,
                   run_as: tuple[int, int] | None = None, accel: str = "kvm", ssh_port: int | None = None) -> Domain:
    """`image`: the image being built (its manifest's device fields; `image.dir` the build's
    folder, where the firmware's variable store is kept for the manifest's `uefi_vars`).
    Setup runs only under KVM (the build refuses without it): hours under TCG; `accel` is
    for the tests, which boot the install's firmware under TCG. `ssh_port`: the host's
    loopback port forwarded to the guest's sshd, for the build's check once it is ready."""
    devices = device_set(image, disk, image.dir, boot_by_device_order=True)
    ssh_mac, egress_mac = nic_macs(name)
    return devices.domain(
        name=name, memory_mib=INSTALL_MEMORY_MIB, vcpus=INSTALL_VCPUS, accel=accel,
        description="vmagent: Windows image install (vmd images build windows)",
        network=devices.network(ssh_port, ssh_mac, egress_mac, restrict=False),
        cdroms=[CdRom(str(medium.path), INSTALL_CD, format=medium.format, boot_order=2),
                CdRom(str(seed_iso), SEED_CD)],
        serial=SerialLog(str(serial_log)),
        run_as=RunAs(*run_as) if run_as else None)


def device_set_xml(image: Image) -> str:
    """The install machine with placeholder paths: what the recipe hash covers of it, so a
    change to the devices a Windows guest gets rebuilds the image, and nothing else of the
    code that writes them does."""
    placeholder = image.model_copy(update={"dir": Path("/image")})
    return install_domain(placeholder, name="vmd-windows-build", disk=Path("/image/install.qcow2"),
                          medium=InstallMedium(Path("/media/install.iso")), seed_iso=Path("/image/seed.iso"),
                          serial_log=Path("/image/serial.log")).to_xml()
