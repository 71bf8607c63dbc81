"""One warm slot (vmd/machines/warm_pool.py): its making, its folder on disk, its restore.

A slot is one guest booted to the point a session needs (desktop up, SSH answering), given
its own identity (SSH host keys, machine-id or Windows' MachineGuid: the image bakes one of
each), with the project share present but unmounted (QEMU refuses to save a guest with a
mounted 9p share), then saved with `virDomainSave` into its own folder (`make_slot_in`):

    <pool>/<image dir>/<slot id>/   slot.json, saved.img, overlay.qcow2, console.log[, OVMF_VARS.fd]

A hand-out (`restore_slot`) moves its overlay and console log into the session's folder, and
restores it with the saved XML edited to point at them and at the session's project folder
(libvirt accepts other file paths; the domain's name and devices must stay those saved). The
slot's name stays the domain's name; the session learns it from the machine (`name`). The
session's `ready` then mounts the share, sets the guest's clock and reads the same facts a
boot does.
"""

from __future__ import annotations

import os
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import libvirt
from pydantic import BaseModel

from vmd.config import VmdConfig
from vmd.guests.guest import GuestError
from vmd.machines.boot_share import NVRAM_FILE, share_for
from vmd.machines.domain_life import connect
from vmd.machines.domain_xml import VmdOwner, set_session, smb_socket_of
from vmd.machines.host import Host
from vmd.machines.images import Image
from vmd.machines.machine import Machine, timeout_scale
from vmd.machines.parked_slot import unlabelled
from vmd.machines.port import MachineError
from vmd.private_fs import passable_dir, private_dir, private_file, qemu_gid, write_private
from vmd.projects.tree import share_owner

SLOT_PREFIX = "vmagent-w-"  # a slot's domain: this and its id
# What makes a booted guest a slot is `Guest.forget_identity` (vmd/guests/linux/verbs.py): its
# own SSH host keys and machine-id (every guest of an image would share the image's),
# nothing of the placeholder share mounted, and no process of ours left in the guest.
# A slot's bounds (its boot to a ready desktop, its whole making) are VmdConfig.slot_ready_s
# and slot_make_s, with their reasons.

# Windows to a ready desktop with sshd: 1-2 minutes with KVM, against the 75 s slot_ready_s
# allows a Linux desktop (boot_factor).
WINDOWS_BOOT_FACTOR = 3.0


class WarmFailed(RuntimeError):
    """A slot could not be handed out; it was discarded."""


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


def unpoolable(image) -> str | None:
    """Why slots of `image` cannot be made, or None. A slot is saved and restored into a
    session's folder with a new identity in place: a Linux guest that boots the host's
    kernel and gets its folder over 9p or SMB, or a Windows guest (disk boot, UEFI store
    and TPM, the folder over SMB: vmd/guests/windows/verbs.py `forget_identity`). Any other
    kind would have its slots made and thrown away for ever, so the pool makes none."""
    linux = image.boot == "kernel" and image.share in ("9p", "smb")
    windows = image.os_family == "windows" and image.boot == "disk" and image.share == "smb"
    if not (linux or windows):
        return (f"the warm pool serves no '{image.name}' guests yet (a {image.boot} boot with a {image.share} "
                f"share); its sessions boot cold. Set VMD_WARM_POOL_SIZE=0 to say so, or make a Linux "
                f"image the default.")
    return None


def boot_factor(image) -> float:
    """How much longer than the Linux desktop the slot bounds are set for (VmdConfig.slot_ready_s)
    a guest of `image` takes to a ready desktop: Windows takes 1-2 minutes with KVM (the
    issue's figure; no Windows boots on vmd's build machines)."""
    return WINDOWS_BOOT_FACTOR if image.os_family == "windows" else 1.0


def make_slot_in(folder: Path, image: Image, name: str, *, host: Host, config: VmdConfig, state_dir: Path,
                 yields: Callable[[], bool]) -> None:
    """Boots the domain `name` of `image` in `folder` (its placeholder share `folder/share`,
    given to QEMU already), gives its guest its own identity, saves it and writes slot.json.
    `yields()`, asked once QEMU runs: whether it boots below the sessions' priority. The
    guest is gone if this fails; the folder is the caller's."""
    share = folder / "share"
    started = time.monotonic()
    machine = None
    try:
        machine = Machine.create(image, name=name, workdir=folder, project_dir=share, host=host,
                                 qemu_user=config.share_user, config=config,
                                 owner=VmdOwner(state_dir=str(state_dir), session=None))
        if yields():
            renice_qemu(name)
        machine.ready(config.slot_ready_s * timeout_scale(machine.accel) * boot_factor(image), desktop=True)
        try:
            machine.guest.forget_identity()  # each session restored from it gets its own
        except GuestError as exc:
            raise WarmFailed(f"the slot could not be prepared: {exc}") from None
        boot_seconds = round(time.monotonic() - started, 1)
        machine.ssh.close()
        machine.domain.save(str(folder / "saved.img"))
        if machine.smb_relay is not None:  # its guest is on disk now; a hand-out relays anew
            machine.smb_relay.stop()
        undefine_saved(machine.domain)
        info = SlotInfo(name=name, folder=str(folder), share=str(share),
                        ssh_port=machine.ssh_port, accel=machine.accel, boot_seconds=boot_seconds,
                        made_at=time.time())
        write_private(folder / "slot.json", info.model_dump_json())
        private_file(folder / "saved.img")  # the guest's memory: vmd's alone
    except BaseException:
        if machine is not None:
            try:
                machine.destroy()
            except Exception:
                pass
        else:
            Machine.discard(name, folder, host)
        raise


def restore_slot(claimed: Path, image: Image, *, workdir: Path, project_dir: Path | None, host: Host,
                 config: VmdConfig, session_id: str | None = None, own_disk: bool = False) -> Machine:
    """Restores the claimed slot folder as a session's machine in `workdir`. The slot is gone
    afterwards, handed out or discarded (WarmFailed). `own_disk`: its disk is given to QEMU's
    user by vmd, not relabelled by libvirt (a parking: parked_slot.py `unlabelled`)."""
    qemu_user = config.share_user
    try:
        info = SlotInfo.model_validate_json((claimed / "slot.json").read_text())
        saved = claimed / "saved.img"
        conn = connect(host.libvirt_uri)
        xml = conn.saveImageGetXMLDesc(str(saved), 0)
        passable_dir(workdir, qemu_gid(qemu_user))
        share = project_dir
        if share is None:  # a session without a project folder: an empty share of its own
            share = workdir / "share"
            give_to_qemu(share, qemu_user)
        for part in SLOT_FILES:
            if (claimed / part).exists():
                shutil.move(str(claimed / part), str(workdir / part))
        if smb_socket_of(xml) is not None:
            # smbd's configuration for the session's project, in its workdir, where the
            # restored QEMU listens (restore_xml) and the relay finds it (relay_for).
            try:
                share_for(image, share, workdir, share_owner(qemu_user), "smb")
            except MachineError as exc:
                raise WarmFailed(str(exc)) from None
        xml = restore_xml(xml, info, workdir, share, session_id)
        owner = share_owner(qemu_user)
        if own_disk and owner is not None:
            xml = unlabelled(xml)
            os.chown(workdir / "overlay.qcow2", *owner)
        write_private(workdir / "domain.xml", xml)
        try:
            conn.restoreFlags(str(saved), xml, libvirt.VIR_DOMAIN_SAVE_RUNNING)
            domain = conn.lookupByName(info.name)
        except libvirt.libvirtError as exc:
            Machine.discard(info.name, workdir, host)
            raise WarmFailed(f"libvirt could not restore it: {exc.get_error_message()}") from None
        machine = Machine.adopt_restored(image, name=info.name, workdir=workdir, project_dir=project_dir,
                                         host=host, domain=domain, ssh_port=info.ssh_port,
                                         accel=info.accel, config=config, qemu_user=qemu_user)
    except WarmFailed:
        (workdir / "overlay.qcow2").unlink(missing_ok=True)
        raise
    except Exception as exc:
        (workdir / "overlay.qcow2").unlink(missing_ok=True)
        raise WarmFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        shutil.rmtree(claimed, ignore_errors=True)
    return machine


def renice_qemu(name: str, niceness: int = 10) -> None:
    """Every thread of a slot's QEMU (started by libvirtd, at its priority) yields to the
    sessions' guests while it boots; a hand-out's restore is a new QEMU, at the usual one."""
    try:
        pid = int(Path(f"/run/libvirt/qemu/{name}.pid").read_text().strip())
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
    except (OSError, ValueError):
        pass  # not QEMU here (the test driver), or it went meanwhile


def give_to_qemu(share: Path, qemu_user: str) -> None:
    """An empty share folder of QEMU's user, 0700, as the project folders are."""
    private_dir(share)
    owner = share_owner(qemu_user)
    if owner is not None:
        os.chown(share, *owner)
