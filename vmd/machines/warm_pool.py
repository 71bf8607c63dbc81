"""Warm machines: guests booted ahead, saved to disk, handed out by restore.

A cold boot to a ready desktop takes 30-45 s under TCG (~10 s on KVM; Windows 1-2 min on
KVM); a restore of a saved guest takes about 1.5 s. A slot is one guest booted to the point a session needs
(desktop up, SSH answering), given its own identity (SSH host keys, machine-id or Windows'
MachineGuid: the image bakes one of each), with the project share present but unmounted (QEMU refuses to save a
guest with a mounted 9p share), then saved with `virDomainSave` into its own folder:

    <state>/warm/<image dir>/<slot id>/   slot.json, saved.img, overlay.qcow2, console.log
                                          (and a UEFI guest's variable store: warm_slot.py)

A hand-out claims a slot by renaming its folder (atomic: no slot serves two sessions),
moves its overlay and console log into the session's folder, and restores it with the
saved XML edited to point at them and at the session's project folder (libvirt accepts
other file paths; the domain's name and devices must stay those saved). The slot's name
stays the domain's name; the session learns it from the machine (`name`). The session's
`ready` then mounts the share, sets the guest's clock and reads the same facts a boot does.

Up to `warm_parked` of the slots wait restored, woken and paused (vmd/machines/parked_slot.py):
a hand-out takes one of those first (a resume and a few renames, well under a second), then a
saved one (the restore above), then the slot being made or parked, else the session boots cold.

A restore that fails discards the slot, and the session boots cold instead, with a note
in the record. Slots of an older build of the image are discarded (the image folder's
name carries its recipe's hash). The refill runs in the background at low priority
(`nice`) and only while the host has room (its `Room.no_room`: load, memory, disk); it
waits out the cold boots of sessions that found the pool empty. `VMD_WARM_POOL_SIZE=auto`
sizes the pool for the host (its `Room.pool_size`; vmd/machines/host_room.py for this
machine); a vmd started with the pool off removes an earlier pool's slots. One pool per
host (vmd/machines/host.py): its slots are made and restored by that host's libvirt.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import libvirt

from vmd.config import VmdConfig
from vmd.guests.guest import GuestError
from vmd.machines.boot_share import share_for
from vmd.machines.domain_xml import VmdOwner, smb_socket_of
from vmd.machines.host import LOCAL, Host
from vmd.machines.images import Image
from vmd.machines.machine import Machine, accel, connect, timeout_scale
from vmd.machines.parked_slot import (PARKED_SUFFIX, ParkedSlot, ParkFailed, discard, hand_out_parked, park,
                                      parkable, unlabelled)
from vmd.machines.port import MachineError
from vmd.machines.warm_slot import SLOT_FILES, SlotInfo, ready_slots_in, restore_xml, undefine_saved
from vmd.private_fs import passable_dir, private_dir, private_file, qemu_gid, write_private
from vmd.projects.tree import share_owner

log = logging.getLogger("vmd.machines.warm_pool")

SLOT_PREFIX = "vmagent-w-"
# A slot's bounds (its boot to a ready desktop, its whole making) are VmdConfig.slot_ready_s
# and slot_make_s, with their reasons.
# What makes a booted guest a slot is `Guest.forget_identity` (vmd/guests/linux/verbs.py): its
# own SSH host keys and machine-id (every guest of an image would share the image's),
# nothing of the placeholder share mounted, and no process of ours left in the guest.
# A slot's folder on disk and its restore XML: vmd/machines/warm_slot.py.

# After a slot could not be parked, the pool parks none for this long (its slots are handed out
# by a restore meanwhile): a fault that stays would otherwise cost a slot's boot each time.
PARK_OFF_S = 600.0

# Windows to a ready desktop with sshd: 1-2 minutes with KVM, against the 75 s slot_ready_s
# allows a Linux desktop (boot_factor).
WINDOWS_BOOT_FACTOR = 3.0


class WarmFailed(RuntimeError):
    """A slot could not be handed out; it was discarded."""


class WarmPool:
    def __init__(self, config: VmdConfig, host: Host, size: int):
        # The local host's slots where they always were; another host's beside them.
        self.dir = config.state_dir / ("warm" if host.name == LOCAL else f"warm-{host.name}")
        # vmd's config: the accelerator (accel, images_dir), the guest's memory and vCPUs,
        # the slot's bounds (slot_ready_s, slot_make_s) and QEMU's user.
        self.config = config
        self.host = host
        self.uri = host.libvirt_uri
        self.qemu_user = config.share_user
        self.size = size
        self.parked_most = min(config.warm_parked, size)  # of the slots, this many wait parked
        self.made = 0  # slots made by this pool (tests, the benchmark)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._making: str | None = None  # the slot domain booting now
        self._making_since = 0.0  # when it began (monotonic)
        # A session that found no ready slot waits for the one being made when that comes
        # sooner than its own cold boot would (machine_for); one session per slot.
        self._changed = threading.Condition()
        self._waited_for: str | None = None
        self._quiet_until = 0.0  # no refill before (monotonic): a session boots cold meanwhile
        self._waiting_because: str | None = None  # why the refill waits (no_room): logged once
        # Parked slots (vmd/machines/parked_slot.py), under _changed: they live in this vmd only.
        self._parked: list[ParkedSlot] = []
        self._parking = False  # a slot is being parked now
        self._parking_name: str | None = None  # its domain, once its slot is claimed
        self._park_off_until = 0.0  # no parking before (monotonic): the last one failed
        # Slot domains restored for a session in the last few minutes: the session may not
        # have stored its machine's name yet, and the sweep must not take them meanwhile.
        self._handing_out: dict[str, float] = {}
        self._handing_lock = threading.Lock()  # sessions' boots add, the reaper's sweep reads

    def timeout_scale(self) -> float:
        """How much longer than on KVM the pool's guests take (vmd/machines/accel.py)."""
        return timeout_scale(accel(self.config))

    # --- slots ---------------------------------------------------------------------------

    def _image_dir(self, image: Image) -> Path:
        return self.dir / image.dir.name

    def ready_slots(self, image: Image) -> list[Path]:
        return ready_slots_in(self._image_dir(image))

    def make_slot(self, image: Image, into: Path | None = None, name: str | None = None) -> Path:
        """Boots one slot of `image` and saves it; returns its folder. `into` and `name`: a
        room template's folder and domain name (vmd/machines/room_templates.py), made the same
        way but no session's to wait for."""

        slot_id = uuid.uuid4().hex[:12]
        parent = into.parent if into is not None else self._image_dir(image)
        folder = parent / f".{slot_id}.making"  # not a slot until renamed
        share = folder / "share"
        # Private folders QEMU may pass through (vmd/private_fs.py); the placeholder share
        # is QEMU's own, as a session's project folder is.
        gid = qemu_gid(self.qemu_user)
        for place in (self.dir, parent) if into is None else (parent,):
            passable_dir(place, gid)
        passable_dir(folder, gid)
        give_to_qemu(share, self.qemu_user)
        name = name or SLOT_PREFIX + slot_id
        started = time.monotonic()
        if into is None:
            with self._changed:
                self._making, self._making_since = name, started
        machine = None
        try:
            machine = Machine.create(image, name=name, workdir=folder, project_dir=share, host=self.host,
                                     qemu_user=self.qemu_user, config=self.config,
                                     owner=VmdOwner(state_dir=str(self.dir.parent), session=None))
            # A slot a session waits for boots at the sessions' priority, and so does a template
            # (a room's check waits for it).
            if into is None and self._waited_for != name:
                _renice(name)
            machine.ready(self.config.slot_ready_s * timeout_scale(machine.accel) * boot_factor(image), desktop=True)
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
            final = into if into is not None else parent / slot_id
            # The saved XML names the folder it was made in; a hand-out edits those paths.
            os.rename(folder, final)
            self.made += 1
            return final
        except BaseException:
            if machine is not None:
                try:
                    machine.destroy()
                except Exception:
                    pass
            else:
                Machine.discard(name, folder, self.host)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            if into is None:
                with self._changed:
                    self._making = None
                    self._changed.notify_all()

    def take(self, image: Image) -> Path | None:
        """Claims a ready slot of `image` (renamed to `<id>.taken`), or None."""
        for slot in self.ready_slots(image):
            claimed = slot.with_name(slot.name + ".taken")
            try:
                os.rename(slot, claimed)
            except OSError:
                continue  # another hand-out took it
            return claimed
        return None

    def hand_out(self, claimed: Path, image: Image, *, workdir: Path, project_dir: Path | None,
                 session_id: str | None = None, own_disk: bool = False):
        """Restores the claimed slot as a session's machine (vmd.machines.machine.Machine). The slot
        is gone afterwards, handed out or discarded (WarmFailed). `own_disk`: its disk is given
        to QEMU's user by vmd, not relabelled by libvirt (a parking: parked_slot.py `unlabelled`)."""

        try:
            info = SlotInfo.model_validate_json((claimed / "slot.json").read_text())
            saved = claimed / "saved.img"
            conn = connect(self.uri)
            xml = conn.saveImageGetXMLDesc(str(saved), 0)
            passable_dir(workdir, qemu_gid(self.qemu_user))
            share = project_dir
            if share is None:  # a session without a project folder: an empty share of its own
                share = workdir / "share"
                give_to_qemu(share, self.qemu_user)
            for part in SLOT_FILES:
                if (claimed / part).exists():
                    shutil.move(str(claimed / part), str(workdir / part))
            if smb_socket_of(xml) is not None:
                # smbd's configuration for the session's project, in its workdir, where the
                # restored QEMU listens (_restore_xml) and the relay finds it (relay_for).
                try:
                    share_for(image, share, workdir, share_owner(self.qemu_user), "smb")
                except MachineError as exc:
                    raise WarmFailed(str(exc)) from None
            xml = restore_xml(xml, info, workdir, share, session_id)
            owner = share_owner(self.qemu_user)
            if own_disk and owner is not None:
                xml = unlabelled(xml)
                os.chown(workdir / "overlay.qcow2", *owner)
            write_private(workdir / "domain.xml", xml)
            try:
                conn.restoreFlags(str(saved), xml, libvirt.VIR_DOMAIN_SAVE_RUNNING)
                domain = conn.lookupByName(info.name)
            except libvirt.libvirtError as exc:
                Machine.discard(info.name, workdir, self.host)
                raise WarmFailed(f"libvirt could not restore it: {exc.get_error_message()}") from None
            machine = Machine.adopt_restored(image, name=info.name, workdir=workdir, project_dir=project_dir,
                                             host=self.host, domain=domain, ssh_port=info.ssh_port,
                                             accel=info.accel, config=self.config, qemu_user=self.qemu_user)
        except WarmFailed:
            (workdir / "overlay.qcow2").unlink(missing_ok=True)
            raise
        except Exception as exc:
            (workdir / "overlay.qcow2").unlink(missing_ok=True)
            raise WarmFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            shutil.rmtree(claimed, ignore_errors=True)
        return machine

    def machine_for(self, image: Image, *, workdir: Path, project_dir: Path | None,
                    session_id: str | None = None):
        """(a warm machine, None), or (None, why not): then the session boots cold, and
        the refill waits that boot out rather than compete with it."""

        failed = None
        claimed = self.claim_parked(image) or self.take(image) or self._wait_for_a_slot(image)
        while isinstance(claimed, ParkedSlot):
            self._handing(claimed.name)
            try:
                return hand_out_parked(claimed, workdir=workdir, project_dir=project_dir,
                                       session_id=session_id), None
            except ParkFailed as exc:
                log.warning("a parked warm machine could not be handed out (%s); it was destroyed", exc)
                failed = f"the warm machine could not be handed out ({exc}); it was discarded"
            claimed = self.claim_parked(image) or self.take(image)
        if claimed is None:
            note = f"{failed} and this one booted cold" if failed else "no warm machine was ready, so this one booted cold"
        else:
            self._handing(SLOT_PREFIX + claimed.name.removesuffix(".taken"))
            try:
                return self.hand_out(claimed, image, workdir=workdir, project_dir=project_dir,
                                     session_id=session_id), None
            except WarmFailed as exc:
                note = f"the warm machine could not be handed out ({exc}); it was discarded and this one booted cold"
        self.defer(30 * self.timeout_scale())  # about a cold boot
        return None, note

    def _handing(self, name: str) -> None:
        with self._handing_lock:
            self._handing_out[name] = time.monotonic()

    def _wait_for_a_slot(self, image: Image) -> "ParkedSlot | Path | None":
        """Claims the slot being made (or parked) once it is ready, for one session that found
        none ready: the slot has booted for a while already, so it is ready sooner than a cold
        boot started now, which would also compete with it for the cores. It boots at the
        sessions' priority from here. None when no slot is being made or parked, another
        session waits for it, or its making fails or runs past its own bounds (make_slot;
        its parking, a restore and a wake, within slot_ready_s).

        The wait is not cut shorter than that: a session that gave up on a slot at its
        last slot's pace then boots cold beside the slot it gave up on (seen in
        bench/load.py: 256 s to the first command against 164 s for a plain cold boot)."""

        with self._changed:
            name = self._making
            if (name is None and not self._parking) or self._waited_for is not None:
                return None
            self._waited_for = name or "parking"
            # After the claim: the accelerator's probe may take a while, and a second session
            # asking meanwhile must find this one waiting.
            scale = self.timeout_scale() * boot_factor(image)
            made_by = self._making_since + self.config.slot_make_s * scale
        parked_by = None  # set when the wait for a parking begins: a restore and a wake, within slot_ready_s
        try:
            if name is not None:
                _renice(name, 0)
            while True:
                with self._changed:
                    while not self._stop.is_set():
                        if name is not None and self._making == name:
                            deadline = made_by
                        elif self._parking:
                            parked_by = parked_by or time.monotonic() + self.config.slot_ready_s * scale
                            deadline = parked_by
                        else:
                            break
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return None
                        self._changed.wait(min(left, 2.0))
                got = self.claim_parked(image) or self.take(image)
                with self._changed:
                    # None, and the refill began to park the slot just made as this looked: its turn.
                    if got is not None or not self._parking or self._stop.is_set():
                        return got
        finally:
            with self._changed:
                self._waited_for = None

    # --- parked slots (vmd/machines/parked_slot.py) ------------------------------------------

    def claim_parked(self, image: Image) -> ParkedSlot | None:
        """Takes a parked slot of `image` out of the pool (one session's only), or None."""
        with self._changed:
            for parked in self._parked:
                if parked.image_dir == image.dir.name:
                    self._parked.remove(parked)
                    return parked
        return None

    def parked(self, image: Image) -> int:
        with self._changed:
            return sum(1 for p in self._parked if p.image_dir == image.dir.name)

    def park_one(self, image: Image) -> ParkedSlot | None:
        """Parks a ready slot of `image`: restored into `<id>.parked` with an empty share of its
        own, woken, paused. None when there is no slot to park or one is being parked now;
        ParkFailed when the slot could not be parked (it is gone)."""
        with self._changed:
            if self._parking:
                return None
            self._parking = True
        try:
            claimed = self.take(image)
            if claimed is None:
                return None
            folder = claimed.with_name(claimed.name.removesuffix(".taken") + PARKED_SUFFIX)
            self._parking_name = SLOT_PREFIX + claimed.name.removesuffix(".taken")
            passable_dir(folder, qemu_gid(self.qemu_user))
            give_to_qemu(folder / "share", self.qemu_user)
            try:
                machine = self.hand_out(claimed, image, workdir=folder, project_dir=folder / "share", own_disk=True)
            except WarmFailed as exc:
                shutil.rmtree(folder, ignore_errors=True)
                raise ParkFailed(str(exc)) from None
            parked = park(machine, folder, image, self.config.slot_ready_s * timeout_scale(machine.accel))
            return parked if self.add_parked(parked) else None
        finally:
            with self._changed:
                self._parking, self._parking_name = False, None
                self._changed.notify_all()

    def add_parked(self, parked: ParkedSlot) -> bool:
        """Offers `parked` to the sessions; False (and it is destroyed) once the pool stopped."""
        with self._changed:
            if not self._stop.is_set():
                self._parked.append(parked)
                self._changed.notify_all()
                return True
        self._drop(parked)
        return False

    def _should_park(self, image: Image) -> bool:
        return (self.parked_most > 0 and parkable(image) and time.monotonic() >= self._park_off_until
                and self.parked(image) < self.parked_most and bool(self.ready_slots(image)))

    def _park(self, image: Image) -> None:
        """The refill's parking of one slot; one that fails turns parking off for PARK_OFF_S."""
        started = time.monotonic()
        try:
            parked = self.park_one(image)
        except ParkFailed as exc:
            self._park_off_until = time.monotonic() + PARK_OFF_S
            log.warning("a warm slot could not be parked (%s); it was discarded, and for %.0f s slots are "
                        "handed out by a restore", exc, PARK_OFF_S)
            return
        if parked is not None:
            log.info("warm slot %s parked in %.1f s", parked.name, time.monotonic() - started)

    @staticmethod
    def _drop(parked: ParkedSlot) -> None:
        discard(parked.machine, parked.folder)

    def _drop_parked(self, keep_image_dir: str | None = None) -> None:
        """This pool's parked slots destroyed (all, or those of other builds than `keep_image_dir`)."""
        with self._changed:
            gone = [p for p in self._parked if p.image_dir != keep_image_dir]
            self._parked = [p for p in self._parked if p.image_dir == keep_image_dir]
        for parked in gone:
            self._drop(parked)

    def _discard_parked_folder(self, folder: Path) -> None:
        """A `<id>.parked` folder no parked slot of this pool owns: an earlier vmd's, whose guest
        (paused, its SSH connection gone with that vmd) can serve no one."""
        with self._changed:
            if any(p.folder == folder for p in self._parked):
                return
        try:
            Machine.discard(SLOT_PREFIX + folder.name.removesuffix(PARKED_SUFFIX), folder, self.host)
        except Exception as exc:
            log.warning("could not destroy the parked guest of %s: %s", folder.name, exc)
        shutil.rmtree(folder, ignore_errors=True)

    def handing_out(self, name: str, window_s: float = 300) -> bool:
        """Whether `name` is a slot handed to a session in the last `window_s` seconds."""
        now = time.monotonic()
        with self._handing_lock:
            for old in [n for n, at in self._handing_out.items() if now - at > window_s]:
                del self._handing_out[old]
            return name in self._handing_out

    def clear(self) -> None:
        """Every slot gone, half-made ones' guests destroyed: a vmd started with the pool
        off must not keep an earlier pool's saved guests on disk (each ~a guest's memory)."""
        if not self.dir.is_dir():
            return
        self._drop_parked()
        for image_dir in self.dir.iterdir():
            for slot in image_dir.iterdir() if image_dir.is_dir() else ():
                if slot.name.endswith(".making"):
                    self._discard_half_made(slot)
                elif slot.name.endswith(PARKED_SUFFIX):
                    self._discard_parked_folder(slot)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- the refill ------------------------------------------------------------------------

    def defer(self, seconds: float) -> None:
        """A session boots cold now: a slot's boot would compete with it, so the refill
        waits this long (a cold boot's budget) before it starts another."""
        self._quiet_until = max(self._quiet_until, time.monotonic() + seconds)

    def discard_stale(self, image: Image) -> None:
        """Slots of other builds of the image, claimed or half-made ones of an earlier vmd."""
        if not self.dir.is_dir():
            return
        self._drop_parked(keep_image_dir=image.dir.name)  # parked guests of an older build
        for folder in self.dir.iterdir():
            if folder.name != image.dir.name and folder.name.startswith(image.name + "-"):
                for slot in folder.iterdir() if folder.is_dir() else ():
                    if slot.name.endswith(PARKED_SUFFIX):
                        self._discard_parked_folder(slot)
                shutil.rmtree(folder, ignore_errors=True)
        mine = self._image_dir(image)
        if mine.is_dir():
            for slot in mine.iterdir():
                if slot.name.endswith(".making"):  # an earlier vmd died while it booted: its guest goes too
                    self._discard_half_made(slot)
                if slot.name.endswith(PARKED_SUFFIX):
                    self._discard_parked_folder(slot)
                if slot.name.endswith(".taken") or slot.name.endswith(".making"):
                    shutil.rmtree(slot, ignore_errors=True)

    def _discard_half_made(self, slot: Path) -> None:
        """The guest of `.<id>.making`, a slot an earlier vmd was booting when it stopped."""
        try:
            Machine.discard(SLOT_PREFIX + slot.name.strip(".").removesuffix(".making"), slot, self.host)
        except Exception as exc:
            log.warning("could not destroy the half-made slot %s: %s", slot.name, exc)

    def start(self, find_image) -> "WarmPool":
        if self.size <= 0:
            return self
        self._thread = threading.Thread(target=self._loop, args=(find_image,), name="vmd-warm-pool", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        # A slot booting or being parked now: its create, restore or ready fails and cleans up.
        for name in (self._making, self._parking_name):
            if name is not None:
                try:
                    connect(self.uri).lookupByName(name).destroy()
                except Exception:
                    pass
        if self._thread is not None:
            self._thread.join(60)
        # A parked guest lives only with this vmd (its SSH connection and runner are this
        # process's): gone with it; its slot's boot is the next vmd's to make again.
        self._drop_parked()

    def _loop(self, find_image) -> None:
        try:
            os.nice(10)  # this thread's own work (qemu-img, SSH) yields to the sessions'
        except OSError:
            pass
        image = None
        while not self._stop.is_set():
            try:
                current = find_image()
                if image is None or current.dir != image.dir:
                    image = current
                    self.discard_stale(image)
                    why_none = unpoolable(image)
                    if why_none is not None:
                        log.warning("%s", why_none)
                if unpoolable(image) is not None:
                    self._stop.wait(30)  # until the default image changes
                    continue
                ready = len(self.ready_slots(image)) + self.parked(image)
                make = ready < self.size
                if (make or self._should_park(image)) and time.monotonic() >= self._quiet_until:
                    why_not = self.host.room.no_room(self.dir, self.config.guest_memory_mib)
                    if why_not != self._waiting_because and why_not is not None:
                        log.info("the warm pool waits to refill: %s", why_not)
                    self._waiting_because = why_not
                    if why_not is None:
                        if make:
                            self.make_slot(image)
                        else:
                            self._park(image)
                        continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("the warm pool could not make a slot: %s", exc)
                self._stop.wait(30)
                continue
            self._stop.wait(2)


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


def _renice(name: str, niceness: int = 10) -> None:
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
