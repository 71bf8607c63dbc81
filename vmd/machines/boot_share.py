"""How a guest boots and gets the project folder, chosen from its image's manifest
(vmd/machines/images.py `Image.boot`, `uefi`, `tpm`, `share`): the typed pieces of
vmd/machines/domain_xml.py that the machine puts in its domain.

A manifest that names neither (the Debian image's) boots the image's kernel and initrd
from the host and shares the folder over virtio 9p; a Windows image boots from its disk
with OVMF (and a TPM for Windows 11) and gets the folder over SMB, since Windows has no
9p driver.
"""

from __future__ import annotations

from pathlib import Path

from vmd.machines.domain_xml import NIC_DRIVERS, DirectKernel, Disk, DiskBoot, NinePShare, SmbShare
from vmd.machines.images import Image
from vmd.machines.port import MachineError
from vmd.machines.smb_share import prepare_smb_share

SHARE_KINDS = ("9p", "smb")
# The domain's own copy of OVMF's variable store, beside its overlay in the workdir.
NVRAM_FILE = "OVMF_VARS.fd"


def boot_for(image: Image, workdir: Path) -> DirectKernel | DiskBoot:
    if image.boot == "disk":
        return DiskBoot(uefi=image.uefi, tpm=image.tpm, nvram=str(workdir / NVRAM_FILE) if image.uefi else None)
    if not image.kernel or not image.initrd:
        raise MachineError(f"the image '{image.name}' boots its kernel from the host but its manifest names "
                           f"no kernel or initrd; rebuild it with `vmd images build {image.name}`.")
    return DirectKernel(str(image.path("kernel")), str(image.path("initrd")), image.kernel_args)


def disk_for(image: Image, overlay: Path) -> Disk:
    """The guest's disk on the bus its manifest names (`sda` on SATA, `vda` on virtio)."""
    return Disk(str(overlay), target="sda" if image.disk_bus == "sata" else "vda", bus=image.disk_bus)


def nic_driver(image: Image) -> str:
    """QEMU's device for the guest's NICs, the SSH one and the egress one hot-plugged later."""
    return NIC_DRIVERS[image.nic]


def share_for(image: Image, project_dir: Path | None, workdir: Path, owner: tuple[int, int] | None,
              kind: str | None = None) -> NinePShare | SmbShare | None:
    """The project share of a guest of `image` (`kind` overrides the manifest's: tests
    boot the Debian guest with SMB), or None without a project folder. `owner`: QEMU's
    user's (uid, gid), who makes the SMB socket (smbd runs as the share's own uid)."""
    kind = kind or image.share
    if kind not in SHARE_KINDS:
        raise MachineError(f"there is no '{kind}' project share; vmd shares over {' or '.join(SHARE_KINDS)}.")
    if project_dir is None:
        return None
    if kind == "9p":
        return NinePShare(str(project_dir))
    try:
        return prepare_smb_share(workdir, project_dir, owner)
    except (ValueError, OSError) as exc:
        raise MachineError(f"the project's SMB share could not be prepared: {exc}") from None
