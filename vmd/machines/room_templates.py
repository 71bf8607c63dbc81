"""Room templates: one saved guest per image, restored for each clean room, never used up.

A clean room (vmd/session/clean_room.py) is a fresh machine of the session's image for one
check: the finish's candidate, its baseline, the eval's hidden check. A cold boot costs
30-45 s under TCG (two of them per verified finish); a warm slot (vmd/machines/warm_pool.py)
is used up by the session it goes to, and its refill is another boot. A template is made
the way a slot is (booted to a ready desktop, its identity reset, its share unmounted,
saved with `virDomainSave`), but a room restores it **without using it up**: the room's
disk is a new qcow2 overlay over the template's (which no guest ever writes again), its
console log and share are the room's own, and the saved memory is only read. So every
room after the first costs a restore (~1.5 s under TCG) instead of a boot.

    <room templates dir>/<key>/<n>/        slot.json, saved.img, overlay.qcow2, console.log
    <room templates dir>/<key>/<n>.lock    held while <n> is made and while a room runs from it

`key` is the image's folder (its recipe's hash) and what the saved guest depends on: the
image's place (the template's disk is an overlay over it), vmd's config (memory, vCPUs,
accelerator) and vmd's own making of it (RECIPE). A change of any of them is a new key, and the old keys' templates are removed. A restore keeps the saved
domain's name and UUID (libvirt checks the UUID of a restore against the saved one), so one
template serves **one room at a time**: the lock. A host runs up to `room_templates` rooms
from templates at once; another room waits for one (a room's life is its check's length)
and boots cold when the wait is longer than a boot. A lock is an open file: a vmd that
dies lets go of it, and the next room destroys the guest it left.

What rooms of one template share: the SSH host keys and machine-id the template was given,
and the kernel's random state at the save. A room is vmd's for one run (no model, no
person, no network to another room), so neither is anyone's to exploit.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import libvirt

from vmd.config import VmdConfig
from vmd.machines.boot_share import NVRAM_FILE, share_for
from vmd.machines.domain_life import connect, free_port
from vmd.machines.domain_xml import smb_socket_of
from vmd.machines.host import LOCAL, Host
from vmd.machines.images import Image
from vmd.machines.machine import Machine, accel, timeout_scale
from vmd.machines.parked_slot import unlabelled
from vmd.machines.port import MachineError
from vmd.machines.warm_pool import WarmPool
from vmd.machines.warm_slot import SlotInfo, boot_factor, give_to_qemu, restore_xml, unpoolable
from vmd.private_fs import passable_dir, qemu_gid, write_private
from vmd.projects.tree import share_owner

log = logging.getLogger("vmd.machines.room_templates")

TEMPLATE_PREFIX = "vmagent-r-"
def template_domain(folder: Path, number: int) -> str:
    """The libvirt name of template `number` in `folder`. libvirt's names are the host's, so
    the name is of the folder's whole path, not only its key: two templates dirs on one host
    (two vmds, or a test's own beside the suite's) with the same image would otherwise make,
    discard and restore one domain, each destroying the other's running room."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:10]
    return f"{TEMPLATE_PREFIX}{digest}-{number}"


# How long a room waits for a template in use, at KVM's pace: about a boot (timeout_scale
# makes it ~40 s under TCG); past it the room boots cold rather than wait more.
WAIT_S = 10.0
# What of vmd's own making a saved template depends on beyond the config (the domain XML
# vmd writes, what a slot's identity reset does): raise it when that changes, so that old
# templates are made anew rather than found unrestorable.
RECIPE = 1


class RoomTemplates:
    """A host's templates of each image, made on first use (`room`)."""

    def __init__(self, config: VmdConfig, host: Host):
        self.config = config
        self.host = host
        base = config.room_templates_dir or config.state_dir / "room-templates"
        self.dir = base if host.name == LOCAL else base.parent / f"{base.name}-{host.name}"
        self.most = config.room_templates
        self._pool = WarmPool(config, host, 0)  # its slot making, into a template's folder
        self._making = threading.Lock()  # one template boots at a time in this vmd
        self.made = 0  # templates made by this vmd (tests, the benchmark)

    def key(self, image: Image) -> str:
        # The image's place too: the template's disk is an overlay over that image's disk.
        recipe = (f"{RECIPE}:{self.config.guest_memory_mib}:{self.config.guest_vcpus}:{accel(self.config)}:"
                  f"{image.dir.resolve()}")
        return f"{image.dir.name}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"

    def usable(self, image: Image) -> bool:
        return self.most > 0 and unpoolable(image) is None

    def room(self, image: Image, *, workdir: Path, project_dir: Path | None,
             session_id: str) -> "tuple[Machine, Callable[[], None]] | None":
        """A room's machine restored from a template of `image` (made now when none is free
        and the host may have another) and what frees the template once the machine is
        destroyed; or None: then the room boots cold. A template that fails to restore is
        removed, and the next room makes it anew."""
        if not self.usable(image):
            return None
        folder = self.dir / self.key(image)
        passable_dir(self.dir, qemu_gid(self.config.share_user))
        passable_dir(folder, qemu_gid(self.config.share_user))
        lock = self._free_template(folder, image)
        if lock is None:
            return None
        number, fd = lock
        machine = self.restore_locked(folder / str(number), fd, image, workdir=workdir, project_dir=project_dir,
                                session_id=session_id)
        return None if machine is None else (machine, lambda: os.close(fd))

    def restore_locked(self, template: Path, fd: int, image: Image, *, workdir: Path, project_dir: Path | None,
                 session_id: str | None, own_disk: bool = False) -> Machine | None:
        """`template` (whose lock `fd` is held) restored into `workdir`, or None: then it is
        removed (the next room makes it anew) and its lock let go. `own_disk`: the room's
        disk is given to QEMU's user by vmd, not relabelled by libvirt (a parked room, whose
        folder is renamed at its hand-out: parked_slot.py `unlabelled`)."""
        try:
            return self._restore(template, image, workdir=workdir, project_dir=project_dir, session_id=session_id,
                                 own_disk=own_disk)
        except Exception as exc:
            log.warning("room template %s/%s could not be restored (%s); it is removed and made anew "
                        "for the next room", template.parent.name, template.name, exc)
            shutil.rmtree(template, ignore_errors=True)
            os.close(fd)
            return None

    def claim_made(self, image: Image) -> tuple[Path, int] | None:
        """A template of `image` already made that no room uses, locked: (its folder, its
        lock), or None. For a parked room (vmd/machines/parked_rooms.py), which neither makes
        a template (the first finish does) nor waits for one."""
        if not self.usable(image):
            return None
        folder = self.dir / self.key(image)
        for number in range(self.most):
            template = folder / str(number)
            if not (template / "slot.json").is_file():
                continue
            fd = _try_lock(folder / f"{number}.lock")
            if fd is None:
                continue
            if (template / "slot.json").is_file():  # not removed while this locked it
                return template, fd
            os.close(fd)
        return None

    # --- which template --------------------------------------------------------------------

    def _free_template(self, folder: Path, image: Image) -> tuple[int, int] | None:
        """(its number, its held lock) of a template ready for a room: a free one, else one
        made now, else one that comes free within a cold boot's time."""
        self._remove_old_keys(folder, image)
        for number in range(self.most):
            fd = _try_lock(folder / f"{number}.lock")
            if fd is None:
                continue
            if (folder / str(number) / "slot.json").is_file():
                return number, fd
            if self._make(folder, number, image):
                return number, fd
            os.close(fd)
            return None  # the making failed (logged): this room boots cold
        # Every template is in use: a room runs for its check's length, often less than a boot,
        # so one is waited for about a boot's time (30-45 s under TCG, ~8 s with KVM), no longer.
        deadline = time.monotonic() + WAIT_S * timeout_scale(accel(self.config)) * boot_factor(image)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            for number in range(self.most):
                if (folder / str(number) / "slot.json").is_file():
                    fd = _try_lock(folder / f"{number}.lock")
                    if fd is not None:
                        return number, fd
        return None

    def _make(self, folder: Path, number: int, image: Image) -> bool:
        target = folder / str(number)
        shutil.rmtree(target, ignore_errors=True)  # a half-made one of a vmd that died
        name = template_domain(folder, number)
        Machine.discard(name, target, self.host)
        with self._making:
            try:
                made = self._pool.make_slot(image, into=target, name=name)
            except Exception as exc:
                log.warning("a room template of %s could not be made: %s", image.name, exc)
                return False
        self.made += 1
        log.info("room template %s/%d made in %.0f s", folder.name, number,
                 SlotInfo.model_validate_json((made / "slot.json").read_text()).boot_seconds)
        return True

    def _remove_old_keys(self, folder: Path, image: Image) -> None:
        """Templates of another build of the image or another config: none will restore."""
        if not self.dir.is_dir():
            return
        for other in self.dir.iterdir():
            if other == folder or not other.is_dir() or not other.name.startswith(image.name + "-"):
                continue
            locks = [_try_lock(p) for p in other.glob("*.lock")]
            if all(fd is not None for fd in locks):  # no room runs from it now
                shutil.rmtree(other, ignore_errors=True)
            for fd in locks:
                if fd is not None:
                    os.close(fd)

    # --- the restore -----------------------------------------------------------------------

    def _restore(self, template: Path, image: Image, *, workdir: Path, project_dir: Path | None,
                 session_id: str | None, own_disk: bool = False) -> Machine:
        info = SlotInfo.model_validate_json((template / "slot.json").read_text())
        saved = template / "saved.img"
        conn = connect(self.host.libvirt_uri)
        # We hold the template's lock: a guest of its name is one a dead vmd left running.
        Machine.discard(info.name, workdir, self.host)
        xml = conn.saveImageGetXMLDesc(str(saved), 0)
        passable_dir(workdir, qemu_gid(self.config.share_user))
        share = project_dir
        if share is None:
            share = workdir / "share"
            give_to_qemu(share, self.config.share_user)
        # The room's disk: an overlay over the template's, which stays as it was saved.
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                        str(template / "overlay.qcow2"), str(workdir / "overlay.qcow2")],
                       check=True, capture_output=True, timeout=60)
        (workdir / "console.log").touch()
        if (template / NVRAM_FILE).exists():
            shutil.copy2(template / NVRAM_FILE, workdir / NVRAM_FILE)
        if smb_socket_of(xml) is not None:
            share_for(image, share, workdir, share_owner(self.config.share_user), "smb")
        # A port of its own: the template's was free when it was made, not necessarily now.
        port = free_port()
        xml = with_ssh_port(restore_xml(xml, info, workdir, share, session_id), info.ssh_port, port)
        owner = share_owner(self.config.share_user)
        if own_disk and owner is not None:
            xml = unlabelled(xml)
            os.chown(workdir / "overlay.qcow2", *owner)
            # Nor is the disk's backing chain relabelled then (libvirt's DAC driver takes the
            # disk's relabel="no" for its backing files): the template's disk, which QEMU only
            # reads, is QEMU's user's as a room's restore leaves it; the image's disk is already.
            os.chown(template / "overlay.qcow2", *owner)
        write_private(workdir / "domain.xml", xml)
        try:
            conn.restoreFlags(str(saved), xml, libvirt.VIR_DOMAIN_SAVE_RUNNING)
            domain = conn.lookupByName(info.name)
        except libvirt.libvirtError as exc:
            Machine.discard(info.name, workdir, self.host)
            raise MachineError(f"libvirt could not restore it: {exc.get_error_message()}") from None
        return Machine.adopt_restored(image, name=info.name, workdir=workdir, project_dir=project_dir,
                                      host=self.host, domain=domain, ssh_port=port, accel=info.accel,
                                      config=self.config, qemu_user=self.config.share_user)


def with_ssh_port(xml: str, old: int, new: int) -> str:
    """The domain XML with its SSH forward (a QEMU argument, vmd/machines/domain_xml.py
    UserNetwork) and vmd's record of it moved from port `old` to `new`: the host side of
    the forward is no part of the saved guest."""
    root = ET.fromstring(xml)
    forward = f"hostfwd=tcp:127.0.0.1:{old}-:22"
    for element in root.iter():
        value = element.get("value")
        if value and forward in value:
            element.set("value", value.replace(forward, f"hostfwd=tcp:127.0.0.1:{new}-:22"))
        if element.get("ssh-port") == str(old):
            element.set("ssh-port", str(new))
    return ET.tostring(root, encoding="unicode")


def _try_lock(path: Path) -> int | None:
    """An exclusive lock on `path` (made if missing), or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd

