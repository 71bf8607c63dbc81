"""The devices of a guest of an image: one set for every machine of that image.

Windows binds a driver to a device by what the device is and where it sits (its PCI slot,
its SATA port): a machine with another NIC slot, display adapter, USB controller or set of
Hyper-V enlightenments than the one Windows was installed on is new hardware to it, found
and set up again at each cold boot of the read-only base. So the machine that installs a
Windows image (vmd/images/windows/install_domain.py) and each session's machine
(vmd/machines/machine.py) take their devices from here, from the image's manifest, in the
same order (libvirt gives PCI addresses in the order of the devices), and differ only in
what is not a device Windows keeps: the install's two CDs, the firmware's boot order,
memory and CPU count, the user network's options (a forward, a share's guestfwd) and MACs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vmd.machines.boot_share import boot_for, disk_for
from vmd.machines.domain_devices import CdRom, DirectKernel, Disk, DiskBoot, HyperV, Video
from vmd.machines.domain_network import NIC_DRIVERS, UserNetwork
from vmd.machines.domain_xml import Domain
from vmd.machines.images import Image


@dataclass
class DeviceSet:
    boot: DirectKernel | DiskBoot
    disk: Disk
    nic_driver: str  # QEMU's device for the NICs (domain_network.NIC_DRIVERS)
    video: Video | None
    hyperv: HyperV | None

    def network(self, ssh_port: int | None, ssh_mac: str, egress_mac: str, egress: bool = False,
                restrict: bool = True) -> UserNetwork:
        return UserNetwork(ssh_port=ssh_port, ssh_mac=ssh_mac, egress_mac=egress_mac, egress=egress,
                           restrict=restrict, nic_driver=self.nic_driver)

    def domain(self, *, network: UserNetwork, cdroms: list[CdRom] | None = None, **rest) -> Domain:
        """A domain with these devices; `rest`: Domain's other fields (name, memory, serial...)."""
        if network.nic_driver != self.nic_driver:
            raise ValueError(f"the network's NIC is {network.nic_driver}, the device set's {self.nic_driver}: "
                             "make it with DeviceSet.network")
        return Domain(boot=self.boot, disk=self.disk, network=network, video=self.video, hyperv=self.hyperv,
                      cdroms=cdroms or [], **rest)


def video_for(image: Image) -> Video | None:
    if not image.desktop:
        return None
    # Windows: std VGA, whose mode the firmware takes from the resolution (domain_devices.Video).
    return Video(*image.resolution, model="vga" if image.os_family == "windows" else "virtio")


def device_set(image: Image, disk: Path, workdir: Path, boot_by_device_order: bool = False) -> DeviceSet:
    """The devices of a guest of `image` on the disk file `disk`, its firmware's variable
    store in `workdir`. `boot_by_device_order`: the Windows install, whose firmware tries
    the disk first (empty until Setup has copied Windows to it, then Windows at every
    reboot of Setup) and the install CD after it: dockur's order (its disk bootindex 3,
    the CD 9), which needs no key press once the CD boots without a prompt."""
    boot = boot_for(image, workdir)
    target = disk_for(image, disk)
    if boot_by_device_order:
        if not isinstance(boot, DiskBoot):
            raise ValueError(f"the image '{image.name}' boots a kernel from the host; only a disk boot has a device order")
        boot.boot_dev = None
        target.boot_order = 1
    return DeviceSet(boot=boot, disk=target, nic_driver=NIC_DRIVERS[image.nic], video=video_for(image),
                     hyperv=HyperV() if image.os_family == "windows" else None)
