"""Parked slots: warm slots restored, woken and paused before any session asks for them.

A saved slot's hand-out (warm_pool.py `hand_out`) spends, from the request to the first
command answered, libvirt's restore of the saved memory, a new SSH handshake with the woken
guest, the waking command (clock, share, facts) and, at the first command, a command
runner's start (python3 under TCG): 2.9-3.9 s on the 2-core TCG build machine (bench/machine.py;
0.3-0.6 s for a parked one).
A parked slot has had all of that done while no one waited: the pool restores a saved slot
into a folder of its own, its share an empty folder of its own (`share`), wakes it (clock
set, share mounted, facts read, desktop seen), starts a command runner on the SSH transport
it keeps, and pauses it. Its hand-out (`hand_out_parked`) is then, with the guest paused:

1. the share folder is checked empty (a guest that wrote into it is not handed out; the
   only program that ran there is the image's own, but the check costs a listing) and the
   extended attributes set on the folder itself through the mount are dropped;
2. the domain's <metadata> names the session (the orphan sweep finds it by it);
3. the parked folder becomes the session's machine folder, by a rename: QEMU keeps the files
   it has open, and libvirt's live XML keeps the old paths, which nothing reads again (its
   disk is not relabelled by libvirt, `unlabelled`, so libvirt does not look for it there at
   the end either);
4. the session's project folder (vmd's own fresh checkout, which no guest has seen:
   vmd/projects/publish.py `prepare_project`) is moved into the share folder entry by entry,
   the share folder takes the project folder's owner, mode and mapped attributes, and then
   its place. QEMU's 9p holds its export by an open descriptor, not by its path
   (hw/9pfs/9p-local.c `mountfd`), so the guest's mount, which never saw another folder,
   now shows the project, and vmd finds it where the session's project folder is;
5. the guest resumes;
6. the session's `ready` sets the clock, which stood still while it was paused, and looks
   at the mount, in one command through the runner that waited with it
   (Machine._ready_parked).

What a saved slot guarantees, a parked one keeps: it was booted and given its own identity
(SSH host keys, machine-id) the same way, before it was saved, and goes to one session once;
no session's files were ever in its share; it was saved and parked without egress, which its
session gets on approval as any warm machine does (libvirt_machines.py `create`); its desktop
was seen before the pause. While it waits it runs nothing (paused: no CPU, the guest's clocks
stopped, and QEMU's user network runs its TCP timers on the virtual clock, net/slirp.c, so no
timer of its own drops the kept SSH connection however long it waits; read in QEMU's source,
and a connection that did drop is made anew by the first command, Machine._ready_parked) but
holds a guest's memory.
It lives only as long as the vmd that parked it, whose SSH connection and runner it keeps:
that vmd destroys its parked guests when it stops, and the next one destroys any it finds.

    <pool>/<image dir>/<id>.parked/   overlay.qcow2, console.log, domain.xml, screen/, share/,
                                      parked.json once it is paused (host_info counts it)
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import libvirt
from pydantic import BaseModel

from vmd.guests.linux.runner_link import START_TIMEOUT
from vmd.machines.domain_xml import VMD_NS, set_session
from vmd.machines.images import Image
from vmd.machines.machine import Machine
from vmd.machines.port import Facts
from vmd.private_fs import write_private

log = logging.getLogger("vmd.machines.parked_slot")

PARKED_SUFFIX = ".parked"
PARKED_FILE = "parked.json"
# The share folder's own extended attributes that are kept from the project folder: QEMU's
# mapped mode keeps the guest's view of owners and modes in these (vmd/projects/tree.py).
MAPPED_PREFIX = "user.virtfs."


class ParkFailed(RuntimeError):
    """A slot could not be parked or a parked one handed out; it was destroyed."""


class ParkedInfo(BaseModel):
    """parked.json: a parked slot, for what reads the pool's folder (host_info)."""
    name: str  # the domain
    parked_at: float  # time.time() when it was paused
    facts: Facts


@dataclass
class ParkedSlot:
    machine: Machine  # paused; its SSH transport and an idle runner kept
    folder: Path  # <pool>/<image dir>/<id>.parked
    image_dir: str  # the image's folder name: its build
    facts: Facts  # read when it was woken
    parked_at: float  # time.time()

    @property
    def name(self) -> str:
        return self.machine.name


def parkable(image: Image) -> bool:
    """Whether slots of `image` can be parked: a Linux guest with its project over 9p, whose
    export can be given another folder's contents under the guest's mount (step 3 above).
    Windows' SMB share and Linux guests on SMB are handed out by a restore."""
    return image.os_family == "linux" and image.boot == "kernel" and image.share == "9p"


def parked_slots_in(folder: Path) -> list[Path]:
    """The parked slots of one image's folder of a pool (vmd's host_info counts them)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith(PARKED_SUFFIX) and (p / PARKED_FILE).is_file())


def park(machine: Machine, folder: Path, image: Image, ready_s: float) -> ParkedSlot:
    """Wakes `machine`, a slot just restored into `folder` with `folder/share` as its share,
    and pauses it once its share is mounted, its desktop up and a command runner idle in it.
    Raises ParkFailed (the machine is destroyed and the folder removed)."""
    try:
        facts = machine.ready(ready_s, desktop=True)
        if not facts.project_mounted:
            raise ParkFailed("its share did not mount")
        if image.desktop and not facts.desktop:
            raise ParkFailed("its desktop did not come up")
        if not machine.guest.prewarmed(START_TIMEOUT):
            raise ParkFailed("no command runner started in it")
        machine.guest.keep_root_runner()  # for the clock at the hand-out; sudo does it without one
        machine.ssh.keepalive(0)  # nothing to send to a paused guest; turned on again at the hand-out
        machine.domain.suspend()
        parked = ParkedSlot(machine=machine, folder=folder, image_dir=image.dir.name, facts=facts,
                            parked_at=time.time())
        write_private(folder / PARKED_FILE,
                      ParkedInfo(name=machine.name, parked_at=parked.parked_at, facts=facts).model_dump_json())
        return parked
    except Exception as exc:
        discard(machine, folder)
        if isinstance(exc, ParkFailed):
            raise
        raise ParkFailed(f"{type(exc).__name__}: {exc}") from None


def hand_out_parked(parked: ParkedSlot, *, workdir: Path, project_dir: Path | None,
                    session_id: str | None) -> Machine:
    """The parked slot as a session's machine, running, with `project_dir` as its share and
    `workdir` as its folder (steps 1-5 above). Raises ParkFailed: the slot is destroyed and
    the project folder is as it was."""
    machine = parked.machine
    share = parked.folder / "share"
    try:
        state = machine.state()
        if state != "paused":
            raise ParkFailed(f"its guest is {state}, not paused as it was left")
        untouched(share)
        if project_dir is not None and os.stat(project_dir).st_dev != os.stat(share).st_dev:
            raise ParkFailed(f"the project folder {project_dir} is on another filesystem than the warm pool; "
                             "put VMD_PROJECTS_DIR beside VMD_STATE_DIR, or set VMD_WARM_PARKED=0")
        # The session is named first: a vmd that dies from here on leaves a guest its sweep
        # finds by the session (and the next vmd's pool destroys it while its folder is the pool's).
        xml = name_session(machine.domain, session_id) if session_id else None
        take_place(parked.folder, workdir)
    except Exception as exc:
        discard(machine, parked.folder)
        raise _failed(exc) from None
    share = workdir / "share"
    try:
        (workdir / PARKED_FILE).unlink(missing_ok=True)
        if xml is not None:
            write_private(workdir / "domain.xml", xml)
        if project_dir is not None:
            move_project_into(share, project_dir)
        try:
            machine.moved_to(workdir, project_dir, woken=parked.facts)
            machine.domain.resume()
            machine.ssh.keepalive()
        except Exception:
            if project_dir is not None:
                move_project_back(project_dir)
            raise
    except Exception as exc:
        discard(machine, workdir)
        raise _failed(exc) from None
    return machine


def _failed(exc: Exception) -> ParkFailed:
    return exc if isinstance(exc, ParkFailed) else ParkFailed(f"{type(exc).__name__}: {exc}")


def discard(machine: Machine, folder: Path) -> None:
    try:
        machine.destroy()
    except Exception as exc:
        log.warning("a parked guest %s could not be destroyed: %s", machine.name, exc)
    shutil.rmtree(folder, ignore_errors=True)


def untouched(share: Path) -> None:
    """The share folder as it was made (empty), its own extended attributes dropped. The guest
    is paused: nothing changes it between this and the move."""
    if share.is_symlink() or not share.is_dir():
        raise ParkFailed("its share folder is gone")
    if any(os.scandir(share)):
        raise ParkFailed("its guest wrote into its share folder before any session had it")
    for name in os.listxattr(share):
        os.removexattr(share, name)


def take_place(folder: Path, workdir: Path) -> None:
    """`folder` renamed to `workdir` (a missing or empty folder, as a session's is before its
    machine comes)."""
    try:
        os.rename(folder, workdir)
    except OSError as exc:
        raise ParkFailed(f"its folder could not become the session's machine folder {workdir}: "
                         f"{exc.strerror}") from None


def move_project_into(share: Path, project_dir: Path) -> None:
    """The project folder's entries moved into `share`, which then takes its owner, mode and
    mapped attributes and its place. What moved goes back if a step fails."""
    moved: list[str] = []
    try:
        for name in os.listdir(project_dir):
            os.rename(project_dir / name, share / name)
            moved.append(name)
        st = os.stat(project_dir)
        os.chown(share, st.st_uid, st.st_gid)
        os.chmod(share, st.st_mode & 0o7777)
        for name in os.listxattr(project_dir):
            if name.startswith(MAPPED_PREFIX):
                os.setxattr(share, name, os.getxattr(project_dir, name))
        os.rename(share, project_dir)  # over the project folder, empty now
    except OSError:
        for name in moved:
            try:
                os.rename(share / name, project_dir / name)
            except OSError as exc:
                log.error("%s could not be moved back into the project folder %s: %s", name, project_dir, exc)
        raise


def move_project_back(project_dir: Path) -> None:
    """Undoes a finished `move_project_into` before the guest resumed: the project's entries
    out of the folder that took its place, into a new folder of the same name. The guest saw
    nothing of them (it is paused and is destroyed next)."""
    kept = project_dir.with_name(project_dir.name + ".parked-share")
    os.rename(project_dir, kept)
    os.mkdir(project_dir)
    st = os.stat(kept)
    os.chown(project_dir, st.st_uid, st.st_gid)
    os.chmod(project_dir, st.st_mode & 0o7777)
    for name in os.listxattr(kept):
        os.setxattr(project_dir, name, os.getxattr(kept, name))
    for name in os.listdir(kept):
        os.rename(kept / name, project_dir / name)
    os.rmdir(kept)


def unlabelled(xml: str) -> str:
    """A slot's restore XML for its parking: libvirt is told not to relabel its disk, whose
    owner vmd sets itself (QEMU's user). libvirt gives a disk its owner back at the end by the
    path it started with, and a parked guest's folder is renamed at the hand-out: for each one
    destroyed, libvirtd logged "unable to stat …/<id>.parked/overlay.qcow2" errors."""
    root = ET.fromstring(xml)
    for source in root.iterfind("devices/disk/source"):
        for old in source.findall("seclabel"):
            source.remove(old)
        ET.SubElement(source, "seclabel", model="dac", relabel="no")
    return ET.tostring(root, encoding="unicode")


def name_session(domain: libvirt.virDomain, session_id: str) -> str:
    """The live domain's vmd <metadata> with `session_id` as its owner; its XML after."""
    root = ET.fromstring(domain.XMLDesc(0))
    set_session(root, session_id)
    element = root.find(f"metadata/{{{VMD_NS}}}machine")
    if element is None:
        raise ParkFailed("its domain has no vmd metadata")
    # libvirt puts the element in the namespace it is given (`uri`, prefix `key`) and refuses
    # one that declares that prefix itself ("failed to create a new XML namespace").
    for part in element.iter():
        part.tag = part.tag.removeprefix(f"{{{VMD_NS}}}")
    domain.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, ET.tostring(element, encoding="unicode"),
                       "vmd", VMD_NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    return domain.XMLDesc(0)
