"""Clean rooms restored from a room template, on real guests (vmd/machines/room_templates.py):

- the first room makes the template, later rooms restore it in a fraction of a cold boot;
- each room is a machine of its own: what one room wrote on its disk is not on the next's,
  and each shows its own project folder;
- a template whose saved memory is corrupt is removed, and that room boots cold.

Its own templates folder (not the suite's shared one), so the making is seen every run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.test_vmd_faults_vm import work  # noqa: F401 (fixture)
from tests.support.vmd_fakes import make_config
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.machines.port import MachineSpec

pytestmark = pytest.mark.vm

ROOM_PROBE = "test ! -e /var/tmp/room-was-here && touch /var/tmp/room-was-here && cat /mnt/project/which"


def a_room(machines: LibvirtMachines, work: Path, label: str):
    project = work / f"project-{label}"
    project.mkdir(mode=0o777)
    (project / "which").write_text(label)
    project.chmod(0o777)
    (project / "which").chmod(0o644)
    spec = MachineSpec(session_id="s-20261204-000000-abcdef", os="debian", name=f"vmagent-test-room-{label}",
                       workdir=work / f"machine-{label}", project_dir=project, for_check=True)
    started = time.monotonic()
    machine = machines.create(spec)
    machine.ready(900)
    return machine, time.monotonic() - started


def test_rooms_restore_one_template_each_a_machine_of_its_own_and_a_corrupt_one_is_replaced(
        work, debian_image):  # noqa: F811
    config = make_config(work, images_dir=debian_image.dir.parent, room_templates=1,
                         room_templates_dir=work / "templates")
    machines = LibvirtMachines(config)
    templates = machines.templates["local"]

    first, made_in = a_room(machines, work, "one")
    try:
        assert first.came == "template" and templates.made == 1
        assert first.guest.run(ROOM_PROBE, timeout=60).stdout == "one"
    finally:
        first.destroy()

    second, restored_in = a_room(machines, work, "two")
    try:
        assert second.came == "template" and templates.made == 1, "the template was used up"
        out = second.guest.run(ROOM_PROBE, timeout=60)
        assert out.exit_code == 0 and out.stdout == "two", ("the second room saw the first room's disk "
                                                            f"or folder: {out}")
    finally:
        second.destroy()
    assert restored_in < made_in / 3, f"a room from the template took {restored_in:.1f} s, " \
                                      f"against {made_in:.1f} s to make it"

    [template] = [p for p in (work / "templates").glob("*/0") if p.is_dir()]
    with open(template / "saved.img", "r+b") as fh:
        fh.write(b"\0" * 4096)
    cold, cold_in = a_room(machines, work, "three")
    try:
        assert cold.came == "cold", "a corrupt template was restored"
        assert cold.guest.run(ROOM_PROBE, timeout=60).stdout == "three"
    finally:
        cold.destroy()
    assert not (template / "slot.json").exists(), "the corrupt template was kept"
    print(f"room template: made (with the first room) in {made_in:.1f} s, a room from it in "
          f"{restored_in:.1f} s, a cold room in {cold_in:.1f} s")
