"""A warm slot on disk (vmd/machines/warm_pool.py): its folder's record and files, the
undefine once its guest is saved, and the saved XML moved to a session's folder.

    <pool>/<image dir>/<slot id>/   slot.json, saved.img, overlay.qcow2, console.log[, OVMF_VARS.fd]
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
from pydantic import BaseModel

from vmd.machines.boot_share import NVRAM_FILE
from vmd.machines.domain_xml import set_session

# What a slot folder holds of its guest beside the saved memory, moved to the session's
# workdir at the hand-out: the disk's overlay, the serial log and a UEFI guest's variable store.
SLOT_FILES = ("overlay.qcow2", "console.log", NVRAM_FILE)


class SlotInfo(BaseModel):
    """slot.json: what a hand-out needs to know of its slot."""
    name: str  # the libvirt domain's name, kept by the restore
    folder: str  # where the slot was made: the saved XML's paths start here
    share: str  # the placeholder share folder the slot was booted with
    ssh_port: int
    accel: str
    boot_seconds: float
    made_at: float


def ready_slots_in(folder: Path) -> list[Path]:
    """The slots ready to hand out in one image's folder of a pool (vmd's host_info counts
    them too, from its state dir)."""
    if not folder.is_dir():
        return []
    # `.<id>.making`: still being made (its slot.json is written just before the rename).
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "slot.json").is_file()
                  and not p.name.startswith(".") and not p.name.endswith(".taken"))


def undefine_saved(domain: libvirt.virDomain) -> None:
    """Undefines a slot's domain once it is saved. A UEFI guest's variable store is kept: it
    is the slot's own file (NVRAM_FILE in the slot folder), moved to the session's at the
    hand-out, and a plain undefine refuses a domain with one. A TPM's state is dropped: QEMU
    carries swtpm's state blobs in the saved image, and libvirt gives the restored domain a
    fresh swtpm that they are loaded into, so none is left behind in libvirt's swtpm folder
    for a slot that is discarded unrestored. libvirt's test driver knows no flag."""
    try:
        domain.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_KEEP_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_TPM)
    except libvirt.libvirtError:
        try:
            domain.undefine()
        except libvirt.libvirtError:
            pass


def restore_xml(xml: str, info: SlotInfo, workdir: Path, share: Path, session_id: str | None = None) -> str:
    """The saved XML with the slot's files moved to the session's folder, the share
    pointed at the session's project folder, and the session named as its owner in vmd's
    <metadata> (the sweep finds the session by it; the domain keeps the slot's name).

    The slot's folder is in <source> attributes (disk, console) and, for an SMB share, in
    its socket's QEMU argument and vmd's metadata: every attribute and text is moved."""
    root = ET.fromstring(xml)
    if session_id:
        set_session(root, session_id)
    old, new = info.folder + "/", str(workdir) + "/"
    for element in root.iter():
        for attr, value in element.attrib.items():
            if element.tag == "source" and attr == "dir" and value == info.share:
                element.set(attr, str(share))  # 9p: the placeholder share is the session's project
            elif old in value:
                element.set(attr, value.replace(old, new))
        if element.text and old in element.text:
            element.text = element.text.replace(old, new)
    return ET.tostring(root, encoding="unicode")
