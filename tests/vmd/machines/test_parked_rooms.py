"""Parked clean rooms without a guest (vmd/machines/parked_rooms.py), on libvirt's test driver
and real folders: a parked room goes to one check with the room's tree, holds its template
until it is destroyed and is never handed out again; one that fails is discarded and frees its
template; nothing is parked before a template exists; a stopped vmd leaves none. On a real
guest (the wake, the check in it, the fall-back): tests/vmd/machines/test_parked_rooms_vm.py."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import libvirt

from tests.vmd.machines.test_domain_xml import TEST_URI, fake_image  # noqa: F401 (fixture)
from tests.vmd.machines.test_parked_slot import checkout, domains, facts
from tests.support.vmd_fakes import make_config
from vmd.machines.domain_xml import VmdOwner, vmd_owner
from vmd.machines.host import local_host
from vmd.machines.machine import Machine
from vmd.machines.parked_rooms import ParkedRooms
from vmd.machines.parked_slot import PARKED_FILE, PARKED_SUFFIX, ParkedInfo, ParkedSlot
from vmd.machines.room_templates import RoomTemplates
from vmd.machines.warm_slot import SlotInfo

SESSION = "s-20260101-000000-abcdef"


class NeverMakes(RoomTemplates):
    """Room templates whose making is recorded (a parking must never make one) and whose
    restore is a new running guest of the test driver in the room's folder (it cannot
    restore a saved one), recorded."""

    def __init__(self, config):
        super().__init__(config, local_host(config.libvirt_uri))
        self.making: list[int] = []
        self.restores: list[Path] = []

    def _make(self, folder, number, image):
        self.making.append(number)
        return False

    def _restore(self, template, image, *, workdir, project_dir, session_id, own_disk=False):
        self.restores.append(workdir)
        return Machine.create(image, name=f"vmagent-r-{uuid.uuid4().hex[:12]}", workdir=workdir,
                              project_dir=project_dir, uri=TEST_URI, config=self.config,
                              owner=VmdOwner(state_dir=str(self.config.state_dir), session=session_id))


def rooms_of(tmp_path: Path, templates: int = 1, parked: int = 1) -> ParkedRooms:
    config = make_config(tmp_path, libvirt_uri=TEST_URI, share_user="nobody", room_templates=templates,
                         room_parked=parked, room_templates_dir=tmp_path / "templates")
    return ParkedRooms(config, local_host(config.libvirt_uri), NeverMakes(config))


def made_template(rooms: ParkedRooms, image, number: int = 0) -> Path:
    """A template's folder as RoomTemplates leaves a made one."""
    folder = rooms.templates.dir / rooms.templates.key(image) / str(number)
    folder.mkdir(parents=True)
    (folder / "slot.json").write_text(SlotInfo(
        name=f"vmagent-r-{number}", folder="/x", share="/s", ssh_port=1, accel="qemu", boot_seconds=1.0,
        made_at=0.0).model_dump_json())
    return folder


def park_by_hand(rooms: ParkedRooms, image) -> ParkedSlot:
    """A room as `park_one` leaves one: a free template's lock held, its guest paused in a
    `<id>.parked` folder with an empty share (the test driver cannot restore a saved guest)."""
    template, fd = rooms.templates.claim_made(image)
    folder = rooms.dir / f"{uuid.uuid4().hex[:12]}{PARKED_SUFFIX}"
    (folder / "share").mkdir(parents=True)
    machine = Machine.create(image, name=f"vmagent-r-{folder.name[:12]}", workdir=folder,
                             project_dir=folder / "share", uri=TEST_URI, config=rooms.config,
                             owner=VmdOwner(state_dir=str(rooms.config.state_dir)))
    machine.domain.suspend()
    (folder / PARKED_FILE).write_text(ParkedInfo(name=machine.name, parked_at=time.time(),
                                                 facts=facts()).model_dump_json())
    parked = ParkedSlot(machine=machine, folder=folder, image_dir=image.dir.name, facts=facts(),
                        parked_at=time.time())
    rooms._rooms.append((parked, template, fd))
    return parked


def room_folder(tmp_path: Path) -> Path:
    """A clean room's machine folder (clean_room.py): <session>/rooms/<label>/machine."""
    room = tmp_path / "state" / "sessions" / SESSION / "rooms" / "check-abc123"
    room.mkdir(parents=True)
    return room / "machine"


def test_a_parked_room_goes_to_one_check_with_its_tree_and_holds_its_template_until_destroyed(
        fake_image, tmp_path):  # noqa: F811
    rooms = rooms_of(tmp_path)
    made_template(rooms, fake_image)
    parked = park_by_hand(rooms, fake_image)
    assert rooms.parked(fake_image) == 1
    project = checkout(tmp_path)
    workdir = room_folder(tmp_path)

    machine, release, came = rooms.take(fake_image, workdir=workdir, project_dir=project, session_id=SESSION)

    try:
        assert came == "parked" and machine is parked.machine and machine.state() == "running"
        assert machine.workdir == workdir and (workdir / "overlay.qcow2").is_file() and not parked.folder.exists()
        assert sorted(os.listdir(project)) == [".gitignore", "README.md", "src"]
        assert vmd_owner(machine.domain.XMLDesc(0)).session == SESSION, "the sweep would not find its session"
        assert rooms.parked(fake_image) == 0 and rooms.taken == 1
        # Its template is its own while it runs: no other room restores the same saved guest.
        assert rooms.templates.claim_made(fake_image) is None
        # Never handed out twice: the next check finds no parked room (until the refill's).
        assert rooms.take(fake_image, workdir=tmp_path / "other", project_dir=None, session_id=SESSION) is None
    finally:
        machine.destroy()
        release()
    assert machine.name not in domains()
    freed = rooms.templates.claim_made(fake_image)
    assert freed is not None, "the destroyed room's template is free for the refill"
    os.close(freed[1])
    rooms.stop()


def test_a_parked_room_destroyed_behind_vmds_back_is_discarded_and_the_room_restored_from_its_template(
        fake_image, tmp_path):  # noqa: F811
    rooms = rooms_of(tmp_path)
    made_template(rooms, fake_image)
    parked = park_by_hand(rooms, fake_image)
    parked.machine.domain.destroy()
    project = checkout(tmp_path)
    workdir = room_folder(tmp_path)

    machine, release, came = rooms.take(fake_image, workdir=workdir, project_dir=project, session_id=SESSION)

    try:
        # The failed one is gone for good; the room is the template's restore, into the room's
        # own folder with the room's tree, from the template the parked one held (no other
        # parking could take it between).
        assert came == "template" and machine is not parked.machine and rooms.taken == 0
        assert not parked.folder.exists() and rooms.parked(fake_image) == 0
        assert rooms.templates.restores == [workdir] and machine.project_dir == project
        assert sorted(os.listdir(project)) == [".gitignore", "README.md", "src"]
        assert rooms.templates.claim_made(fake_image) is None, "the room holds its template"
    finally:
        machine.destroy()
        release()
    freed = rooms.templates.claim_made(fake_image)
    assert freed is not None
    os.close(freed[1])
    rooms.stop()


def test_nothing_is_parked_and_no_template_made_before_a_finish_made_one(fake_image, tmp_path):  # noqa: F811
    rooms = rooms_of(tmp_path, templates=2, parked=2)
    rooms.want(fake_image)  # a session of the image runs
    time.sleep(1.0)  # the refill's first look
    assert rooms.park_one(fake_image) is None
    assert rooms.parked(fake_image) == 0 and rooms.templates.making == []
    rooms.stop()


def test_at_most_as_many_rooms_are_parked_as_there_are_templates(tmp_path):
    assert rooms_of(tmp_path / "a", templates=1, parked=2).most == 1
    assert rooms_of(tmp_path / "b", templates=2, parked=0).most == 0
    assert rooms_of(tmp_path / "c", templates=2, parked=2).most == 2


def test_a_stopped_vmd_destroys_its_parked_rooms_and_frees_their_templates(fake_image, tmp_path):  # noqa: F811
    rooms = rooms_of(tmp_path)
    made_template(rooms, fake_image)
    parked = park_by_hand(rooms, fake_image)
    rooms.stop()
    assert parked.machine.name not in domains() and not parked.folder.exists()
    assert rooms.take(fake_image, workdir=room_folder(tmp_path), project_dir=None, session_id=SESSION) is None
    freed = rooms.templates.claim_made(fake_image)
    assert freed is not None
    os.close(freed[1])


def test_a_stop_while_a_room_is_restored_for_parking_ends_that_room_at_once(fake_image, tmp_path):  # noqa: F811
    # The refill restores a room while vmd stops: the restore ends after the stop, and the
    # room must not be woken then (its wake waited out the ready time, 60 s in a CI run, on a
    # guest that never answers: the test driver's).
    rooms = rooms_of(tmp_path)
    rooms.host = dataclasses.replace(rooms.host, room=SimpleNamespace(no_room=lambda *a: None))  # whatever the load
    made_template(rooms, fake_image)
    restoring, may_end, restored = threading.Event(), threading.Event(), []
    plain_restore = rooms.templates._restore

    def slow_restore(*args, **kwargs):
        restoring.set()
        may_end.wait(30)
        restored.append(plain_restore(*args, **kwargs))
        return restored[-1]

    rooms.templates._restore = slow_restore
    rooms.want(fake_image)
    assert restoring.wait(30), "the refill did not restore a room"
    stopping = threading.Thread(target=rooms.stop)
    started = time.monotonic()
    stopping.start()
    time.sleep(0.5)
    may_end.set()
    stopping.join(60)

    assert time.monotonic() - started < 10, "stop waited for the room's wake"
    assert [m.name for m in restored] and restored[0].name not in domains(), "the room restored is left running"
    assert rooms.parked(fake_image) == 0 and not any(rooms.dir.iterdir())
    freed = rooms.templates.claim_made(fake_image)
    assert freed is not None, "its template is free"
    os.close(freed[1])


def test_what_a_dead_vmd_parked_is_destroyed_but_not_another_vmds_guest_of_the_same_name(
        fake_image, tmp_path):  # noqa: F811
    rooms = rooms_of(tmp_path)
    made_template(rooms, fake_image)
    left = park_by_hand(rooms, fake_image)
    os.close(rooms._rooms.pop()[2])  # the vmd died: its lock went, its parked guest and folder stay
    # Another guest named as a template is (another vmd's room from the same templates folder)
    # whose parked.json a stale folder names: its disk is not in that folder, so it stays.
    other = Machine.create(fake_image, name=f"vmagent-r-{uuid.uuid4().hex[:8]}", workdir=tmp_path / "elsewhere",
                           project_dir=tmp_path, uri=TEST_URI, config=rooms.config)
    stale = rooms.dir / f"{uuid.uuid4().hex[:12]}{PARKED_SUFFIX}"
    stale.mkdir()
    (stale / PARKED_FILE).write_text(ParkedInfo(name=other.name, parked_at=0.0, facts=facts()).model_dump_json())
    try:
        rooms_of(tmp_path).clear()  # the next vmd
        assert left.machine.name not in domains() and not left.folder.exists() and not stale.exists()
        assert other.name in domains()
    finally:
        try:
            other.destroy()
        except libvirt.libvirtError:
            pass
