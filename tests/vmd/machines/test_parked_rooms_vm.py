"""Parked clean rooms on a real guest (vmd/machines/parked_rooms.py): a finish's check takes a
room parked from the room template, which is destroyed after its one check; the model's
planted interpreter in the session's guest still cannot verify wrong code; a parked room
destroyed behind vmd's back is discarded and the check still runs, on its template's restore.
The bookkeeping without a guest: tests/vmd/machines/test_parked_rooms.py."""

from __future__ import annotations

import time
from dataclasses import replace

import libvirt
import pytest

from tests.e2e.test_clean_room_vm import TEST_CALC, TESTS, WRAPPER, WRONG_CALC, _refusal, _work
from tests.support.host_dirs import passable_folder
from tests.support.vmd_fakes import make_config
from tests.support.vmd_wire import WireVmd
from vmagent.link.errors import VmdError
from vmd.machines.host import local_host
from vmd.machines.host_room import LocalRoom
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.machines.images import find_image
from vmd.server.rpc import VmdServer

pytestmark = pytest.mark.vm

RIGHT_CALC = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def own_templates():
    """The module's own room templates, not the suite's (tests/support/vmd_fakes.py ROOM_TEMPLATES):
    parked rooms hold their templates while parked, and the other lane's finishes restore the
    suite's templates at the same time, so a test waiting for two parked rooms waited out its
    600 s in a CI rehearsal. Outside pytest's temp root, for QEMU to pass (tests/e2e/test_vmd_faults_vm.py
    `work`); the module's first finish makes them."""
    with passable_folder("vmd-parked-templates-") as folder:
        yield folder


class RoomWhateverTheLoad:
    """This host's room without its load gate (vmd/machines/host_room.py `no_room`, tested in
    tests/vmd/machines/test_warm_pool.py): in CI the other lane's guests (the compose fleet's)
    keep the load past twice the cores for minutes, and a test waiting for two parked rooms
    waited out its 600 s with one (CI of 04c7507). Memory and disk still gate."""

    def pool_size(self, guest_mib: int) -> int:
        return LocalRoom().pool_size(guest_mib)

    def no_room(self, folder, guest_mib: int) -> str | None:
        why = LocalRoom().no_room(folder, guest_mib)
        return None if why is not None and why.startswith("the host is busy") else why


@pytest.fixture
def vmd(tmp_path, debian_image, own_templates):
    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=900, verify_timeout_s=300,
                         room_parked=2, room_templates_dir=own_templates)
    machines = LibvirtMachines(config, hosts=[replace(local_host(config.libvirt_uri), room=RoomWhateverTheLoad())])
    server = VmdServer(config, machines).start()
    c = WireVmd(config.socket, timeout=1500).connect()
    c.config, c.machines = config, machines
    try:
        yield c
    finally:
        try:
            c.call("session_close")
        except Exception:
            pass
        c.close()
        server.stop()
    assert not any(machines.parked_rooms[h]._rooms for h in machines.parked_rooms), "a stopped vmd parks none"


def _rooms(c):
    return c.machines.parked_rooms[c.machines.host().name]


def _parked_ids(c) -> dict[str, int]:
    """Each parked room's domain name and libvirt id (a new one at each restore)."""
    with _rooms(c)._changed:
        return {p.machine.name: p.machine.domain.ID() for p, _, _ in _rooms(c)._rooms}


def _wait_parked(c, image, count: int = 2, within: float = 600) -> None:
    deadline = time.monotonic() + within
    while _rooms(c).parked(image) < count:
        assert time.monotonic() < deadline, f"only {_rooms(c).parked(image)} room(s) parked in {within:.0f} s"
        time.sleep(2)


def _rooms_gone(c, within: float = 120) -> None:
    """The session's rooms folders removed (a baseline's room still coming up when the check
    failed is torn down by its own thread once it came)."""
    deadline = time.monotonic() + within
    while list(c.config.sessions_dir.glob("*/rooms/*")):
        assert time.monotonic() < deadline, list(c.config.sessions_dir.glob("*/rooms/*"))
        time.sleep(1)


def _ready_with_parked_rooms(c, project: str, files: dict[str, str]):
    """A session at its finish with both rooms parked: when no template was made yet, a first
    finish makes them (as without parking), then the refill parks."""
    image = find_image("debian", c.config.images_dir)
    _work(c, project, files)
    if _rooms(c).templates.claim_made(image) is None and not _rooms(c).parked(image):
        c.call("run", command="true")
        try:  # its rooms make the templates; `true` itself is refused as proving nothing
            c.call("finish", summary="makes the templates", verification={"command": "true"})
        except VmdError as exc:
            assert "does not prove the work" in str(exc), exc
    _wait_parked(c, image)
    return image


def test_a_finish_takes_parked_rooms_destroyed_after_and_a_planted_interpreter_still_cannot_verify(vmd):
    image = _ready_with_parked_rooms(vmd, "parked-planted", {"calc.py": WRONG_CALC, "test_calc.py": TEST_CALC})
    before = _parked_ids(vmd)
    planted = vmd.call("run", command=WRAPPER, timeout=120)
    assert "ok" in planted["stdout"], planted  # in the session's guest the wrapper fools the tests

    refused = _refusal(vmd, summary="adds", verification={"command": TESTS})

    assert refused.message.startswith("REFUSED: your verification failed"), refused.message
    assert "AssertionError" in refused.message or "FAILED" in refused.message, refused.message
    attempt = refused.data["attempt"]
    assert attempt["where"] == "clean_room"
    assert [(r["role"], r["came"]) for r in attempt["rooms"]] == [("check", "parked")], attempt["rooms"]
    # The rooms are gone: each parked guest is destroyed after its one check (a name of a
    # template that runs again is a new restore, a new libvirt id, no session's), and the
    # session's rooms folder is empty.
    conn = libvirt.open(vmd.config.libvirt_uri)
    try:
        for name, old_id in before.items():
            try:
                again = conn.lookupByName(name)
            except libvirt.libvirtError:
                continue
            assert again.ID() != old_id, f"{name} is the guest of the check, still running"
    finally:
        conn.close()
    _rooms_gone(vmd)
    assert _rooms(vmd).taken >= 1
    # The refill parks the next ones, for the next finish.
    _wait_parked(vmd, image)
    assert set(_parked_ids(vmd).values()).isdisjoint(before.values())


def test_a_parked_room_destroyed_behind_vmds_back_is_discarded_and_the_check_still_runs(vmd):
    _ready_with_parked_rooms(vmd, "parked-gone", {"calc.py": RIGHT_CALC, "test_calc.py": TEST_CALC})
    vmd.call("run", command="true")
    before = _parked_ids(vmd)
    conn = libvirt.open(vmd.config.libvirt_uri)
    try:
        for name in before:
            conn.lookupByName(name).destroy()  # behind vmd's back
    finally:
        conn.close()

    finished = vmd.call("finish", summary="adds", verification={"command": TESTS})

    outcome = finished["outcome"]
    assert outcome["passed"] is True and outcome["proven"] is True, finished["text"]
    came = [r["came"] for r in outcome["rooms"]]
    assert "parked" not in came and set(came) <= {"template", "cold"}, outcome["rooms"]
    assert _rooms(vmd).taken == 0, "a destroyed parked room was handed out"
    _rooms_gone(vmd)
