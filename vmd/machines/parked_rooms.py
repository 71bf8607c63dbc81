"""Parked clean rooms: rooms restored from a room template ahead, woken and paused.

A clean room (vmd/session/clean_room.py) restored from a template (vmd/machines/room_templates.py)
still spends, while the finish waits, libvirt's restore of the saved memory, a new SSH
handshake, the waking command and a command runner's start: 6.9-7.7 s a room on the 2-core
TCG host (bench/finish.py), two rooms a finish. A parked room has had all of that done while
no one waited, the way a parked warm slot has (vmd/machines/parked_slot.py: `park`,
`hand_out_parked`, the same code): a free template is restored into a folder of its own
(`<rooms-parked>/<id>.parked`) with an empty share of its own, woken, given a command runner
and paused. A check's room then takes it by a resume and the room's project (the commit's
tree, laid out by vmd: clean_room.py `lay_out`) moved into its share; the room's machine
folder is the parked folder, renamed.

A parked room holds its template's lock from its restore to its destroy (a restore keeps
the template's domain name and UUID: one room of a template at a time), so at most
`room_templates` rooms are parked, and a room that finds every template held by a parked
room takes a parked one. Each parked room goes to **one** check and is destroyed after it,
never parked again; the refill then restores a new one from the template, in the background
at low priority (`nice`, and only while the host has room). A parked room that fails its
hand-out (its guest gone, not paused, its share written) is destroyed, never reused, and the
room is restored from the template it held (no parking can take that template between);
else from another template, else booted cold, as without parking (libvirt_machines.py).
With one room parked (`room_parked` 1) a finish's baseline, whose room is asked for first
(check_flow.py: it comes up beside the candidate's check), usually takes it.

What a room from a template guarantees, a parked one keeps: a fresh guest of the template
that no model, no person and no other room ever touched (paused since its wake, which ran only
vmd's own commands), its share empty until the room's tree is moved in, no network to any
session's guest, its egress the session's as a room's is (libvirt_machines.py). It lives only
as long as this vmd (its SSH connection and runner are this process's): `stop` destroys the
parked rooms, and the next vmd removes what one that died left (`clear`).

Rooms are parked for the images of the sessions this vmd has given a machine (`want`) and
only once a template of that image exists: the first finish makes the templates, as without
parking; a vmd whose sessions never finish never makes or parks one.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from vmd.config import VmdConfig
from vmd.machines.domain_life import connect
from vmd.machines.host import LOCAL, Host
from vmd.machines.images import Image
from vmd.machines.machine import Machine, timeout_scale
from vmd.machines.parked_slot import (PARKED_FILE, PARKED_SUFFIX, ParkedInfo, ParkedSlot, ParkFailed, discard,
                                      hand_out_parked, park, parkable)
from vmd.machines.room_templates import RoomTemplates
from vmd.machines.warm_slot import give_to_qemu, renice_qemu
from vmd.private_fs import passable_dir, qemu_gid

log = logging.getLogger("vmd.machines.parked_rooms")

# After a room could not be parked, none is parked for this long (rooms are restored from
# their template meanwhile): a fault that stays would otherwise cost a restore and a wake
# every few seconds. As the warm pool's PARK_OFF_S.
PARK_OFF_S = 600.0
# How often the refill looks for a template come free (a room's destroy frees one).
POLL_S = 3.0


class ParkedRooms:
    """One host's parked rooms, for every image a session of it runs."""

    def __init__(self, config: VmdConfig, host: Host, templates: RoomTemplates):
        self.config = config
        self.host = host
        self.templates = templates
        self.most = min(config.room_parked, config.room_templates)
        # Beside the sessions' folders (the hand-out renames a parked folder to a room's
        # machine folder, and moves the room's project into its share: one filesystem).
        self.dir = config.state_dir / ("rooms-parked" if host.name == LOCAL else f"rooms-parked-{host.name}")
        self._rooms: list[tuple[ParkedSlot, Path, int]] = []  # each with its template and its held lock
        self._images: dict[str, Image] = {}  # image dir name -> image: whose rooms to keep parked
        self._changed = threading.Condition()
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._parking: tuple[str, Path] | None = None  # the domain being parked now, its folder
        self._off_until = 0.0  # no parking before (monotonic): the last one failed
        self._waiting_because: str | None = None  # why the refill waits (host_room.py), once logged
        self.taken = 0  # rooms handed out parked (tests, the benchmark)

    def usable(self, image: Image) -> bool:
        return self.most > 0 and parkable(image) and self.templates.usable(image)

    def parked(self, image: Image) -> int:
        with self._changed:
            return sum(1 for p, _, _ in self._rooms if p.image_dir == image.dir.name)

    # --- the hand-out ----------------------------------------------------------------------

    def take(self, image: Image, *, workdir: Path, project_dir: Path | None,
             session_id: str) -> "tuple[Machine, Callable[[], None], str] | None":
        """A parked room of `image` as a check's machine in `workdir` with `project_dir` as its
        project, what frees its template once it is destroyed, and how it came ("parked"); or
        None when none is parked. A parked room that fails its hand-out is destroyed (never
        reused) and its template, still held, restored for this room instead ("template"),
        so that no other parking takes it meanwhile; None when that fails too."""
        self.want(image)
        claimed = self._claim(image)
        if claimed is None:
            return None
        parked, template, fd = claimed
        self._kick.set()  # the refill parks the next once a template is free
        try:
            machine = hand_out_parked(parked, workdir=workdir, project_dir=project_dir, session_id=session_id)
        except ParkFailed as exc:
            log.warning("a parked clean room could not be handed out (%s); it was destroyed, and the room "
                        "is restored from its template", exc)
            machine = self.templates.restore_locked(template, fd, image, workdir=workdir, project_dir=project_dir,
                                                    session_id=session_id)
            return None if machine is None else (machine, lambda: os.close(fd), "template")
        renice_qemu(machine.name, 0)  # parked at the refill's priority; the check's now
        self.taken += 1
        return machine, lambda: os.close(fd), "parked"

    def _claim(self, image: Image) -> tuple[ParkedSlot, Path, int] | None:
        with self._changed:
            for got in self._rooms:
                if got[0].image_dir == image.dir.name:
                    self._rooms.remove(got)
                    return got
        return None

    # --- the refill ------------------------------------------------------------------------

    def want(self, image: Image) -> None:
        """Rooms of `image` are kept parked from now on (a session of it runs here)."""
        if not self.usable(image):
            return
        with self._changed:
            self._images[image.dir.name] = image
            if self._thread is None and not self._stop.is_set():
                self.clear()
                self._thread = threading.Thread(target=self._loop, name="vmd-parked-rooms", daemon=True)
                self._thread.start()
        self._kick.set()

    def _loop(self) -> None:
        try:
            os.nice(10)  # this thread's own work (qemu-img, SSH) yields to the sessions'
        except OSError:
            pass
        while not self._stop.is_set():
            self._kick.wait(POLL_S)
            self._kick.clear()
            with self._changed:
                images = list(self._images.values())
            for image in images:
                try:
                    self._refill(image)
                except Exception as exc:  # never the end of the thread: the next poll tries again
                    log.warning("a clean room could not be parked: %s", exc)

    def _refill(self, image: Image) -> None:
        while (not self._stop.is_set() and self.parked(image) < self.most
               and time.monotonic() >= self._off_until):
            why_not = self.host.room.no_room(self.dir, self.config.guest_memory_mib)
            if why_not != self._waiting_because and why_not is not None:
                log.info("parked clean rooms wait to refill: %s", why_not)  # once, as the warm pool's
            self._waiting_because = why_not
            if why_not is not None:
                return
            started = time.monotonic()
            try:
                parked = self.park_one(image)
            except ParkFailed as exc:
                self._off_until = time.monotonic() + PARK_OFF_S
                log.warning("a clean room could not be parked (%s); it was discarded, and for %.0f s rooms are "
                            "restored from their template", exc, PARK_OFF_S)
                return
            if parked is None:
                return  # no template free (rooms run from them, or none made yet)
            log.info("clean room %s parked in %.1f s", parked.name, time.monotonic() - started)

    def park_one(self, image: Image) -> ParkedSlot | None:
        """Restores a free template of `image` into a folder of its own and parks it; None
        when no template is free; ParkFailed when it could not be parked (it is gone, its
        template free again)."""
        claimed = self.templates.claim_made(image)
        if claimed is None:
            return None
        template, fd = claimed
        folder = self.dir / f"{uuid.uuid4().hex[:12]}{PARKED_SUFFIX}"
        gid = qemu_gid(self.config.share_user)
        passable_dir(self.dir, gid)
        passable_dir(folder, gid)
        give_to_qemu(folder / "share", self.config.share_user)
        machine = self.templates.restore_locked(template, fd, image, workdir=folder, project_dir=folder / "share",
                                          session_id=None, own_disk=True)
        if machine is None:  # the template was removed (logged): the next finish makes it anew
            shutil.rmtree(folder, ignore_errors=True)
            return None
        with self._changed:
            # A `stop` during the restore found nothing to end: the wake would have waited out
            # its ready time for it (60 s in a CI run, where the test driver's guest never answers).
            stopped = self._stop.is_set()
            if not stopped:
                self._parking = machine.name, folder
        if stopped:
            discard(machine, folder)
            os.close(fd)
            return None
        renice_qemu(machine.name, 10)  # its wake yields to the sessions' guests
        try:
            parked = park(machine, folder, image, self.config.slot_ready_s * timeout_scale(machine.accel))
        except ParkFailed:
            os.close(fd)
            raise
        finally:
            self._parking = None
        with self._changed:
            if not self._stop.is_set():
                self._rooms.append((parked, template, fd))
                self._changed.notify_all()
                return parked
        discard(parked.machine, parked.folder)
        os.close(fd)
        return None

    # --- the end ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Every parked room destroyed (they live only with this vmd)."""
        with self._changed:  # as park_one reads them: a parking either sees the stop or is seen here
            self._stop.set()
            parking = self._parking
        self._kick.set()
        if parking is not None:  # its wake or pause fails, and `park` discards it
            try:
                Machine.discard(*parking, self.host)
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(60)
        with self._changed:
            rooms, self._rooms = self._rooms, []
        for parked, _, fd in rooms:
            discard(parked.machine, parked.folder)
            os.close(fd)

    def clear(self) -> None:
        """What a vmd that died left here: its parked guests destroyed, their folders removed.
        (Their templates' locks went with that vmd's process.)"""
        if not self.dir.is_dir():
            return
        with self._changed:
            ours = {parked.folder for parked, _, _ in self._rooms}
        for folder in self.dir.iterdir():
            if folder in ours:
                continue
            try:
                name = ParkedInfo.model_validate_json((folder / PARKED_FILE).read_text()).name
                # The name is its template's, which another vmd on the same templates folder may
                # be running a room of now: only the guest whose disk is in this folder is ended.
                domain = connect(self.host.libvirt_uri).lookupByName(name)
                if f"{folder}/" in domain.XMLDesc(0):
                    Machine.discard(name, folder, self.host)
            except Exception:
                pass  # no parked.json or no such guest: the template's next restore ends what is left
            shutil.rmtree(folder, ignore_errors=True)
