"""The guest's network: QEMU user-mode networking on the command line (libvirt 9.0 cannot
write hostfwd for it), the SSH NIC at a fixed PCI slot, the egress NIC, each machine's MACs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

EGRESS_NET = "10.0.3.0/24"


# The guest tells its SSH NIC by its fixed PCI slot (UserNetwork.pci_addr;
# vmd/images/debian/rootfs/etc/systemd/network/10-vmd-ssh.network), not by its address: every
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
    go on QEMU's command line. A session's SSH NIC is always `restrict=on` (no egress, the
    forward still works); egress is a second NIC, present from the start when asked for
    or hot-plugged later when a person approves it. Only the Windows install's machine, in
    which nothing of a session runs, has an unrestricted first NIC (`restrict` False): its
    first logon fetches the OpenSSH capability from Windows Update.
    """
    ssh_port: int | None  # None: no forward (the install)
    ssh_mac: str  # the machine's own: nic_macs(name)
    egress_mac: str
    egress: bool = False
    restrict: bool = True
    nic_driver: str = NIC_DRIVERS["virtio"]  # QEMU's device for both NICs (NIC_DRIVERS)
    # Fixed PCI slots far from libvirt's own allocations, which do not know about them. The
    # guest finds its SSH NIC by this slot (pci-0000:00:1e.0).
    pci_addr: str = "0x1e"
    egress_pci_addr: str = "0x1d"

    def args(self, options: list[str] | None = None) -> list[str]:
        """`options`: more of the SSH netdev's options (the SMB share's guestfwd)."""
        forward = [f"hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22"] if self.ssh_port is not None else []
        netdev = ",".join(["user,id=vmdnet0" + (",restrict=on" if self.restrict else ""), *forward, *(options or [])])
        args = ["-netdev", netdev,
                "-device", f"{self.nic_driver},netdev=vmdnet0,mac={self.ssh_mac},bus=pcie.0,addr={self.pci_addr}"]
        if self.egress:
            netdev, device = egress_netdev_args(self.egress_mac, self.nic_driver)
            args += ["-netdev", netdev, "-device", f"{device},bus=pcie.0,addr={self.egress_pci_addr}"]
        return args

