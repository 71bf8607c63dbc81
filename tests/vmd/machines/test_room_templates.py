"""The room templates' bookkeeping without a guest (vmd/machines/room_templates.py): one room
per template at a time, another template made while one is in use, a room that waits for
a template to come free, old keys removed, the SSH forward moved. The restore on a real
guest: tests/vmd/machines/test_room_templates_vm.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from tests.support.vmd_fakes import make_config
from vmd.machines.host import local_host
from vmd.machines.room_templates import RoomTemplates, with_ssh_port
from vmd.machines.warm_slot import SlotInfo


def image(tmp_path: Path, build: str = "aaaa") -> SimpleNamespace:
    folder = tmp_path / "images" / f"debian-{build}"
    folder.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(name="debian", os_family="linux", dir=folder, boot="kernel", share="9p")


class Recorded(RoomTemplates):
    """RoomTemplates whose making and restore only write and read the template's folder."""

    def __init__(self, config):
        super().__init__(config, local_host(config.libvirt_uri))
        self.restored: list[str] = []
        self.making: list[int] = []

    def _make(self, folder, number, image):
        self.making.append(number)
        (folder / str(number)).mkdir(parents=True)
        (folder / str(number) / "slot.json").write_text(SlotInfo(
            name=f"vmagent-r-{number}", folder="/x", share="/s", ssh_port=1, accel="qemu",
            boot_seconds=1.0, made_at=0.0).model_dump_json())
        return True

    def _restore(self, template, image, **_):
        self.restored.append(template.name)
        return SimpleNamespace(template=template.name)


def templates(tmp_path: Path, most: int = 2, **settings) -> Recorded:
    config = make_config(tmp_path, libvirt_uri="test:///default", share_user="nobody", room_templates=most,
                         room_templates_dir=tmp_path / "rooms", **settings)
    return Recorded(config)


def room(t: RoomTemplates, img, tmp_path: Path):
    return t.room(img, workdir=tmp_path / "w", project_dir=None, session_id="s-1")


def test_a_template_serves_one_room_at_a_time_and_a_second_room_gets_a_second_template(tmp_path):
    t, img = templates(tmp_path), image(tmp_path)
    first, release_first = room(t, img, tmp_path)
    second, release_second = room(t, img, tmp_path)
    assert (first.template, second.template) == ("0", "1") and t.making == [0, 1]
    release_first()
    third, release_third = room(t, img, tmp_path)
    assert third.template == "0" and t.making == [0, 1], "a free template is restored, not made again"
    release_second(), release_third()
    # another vmd on the same folder (a test suite's, a restarted one) finds both made
    other = templates(tmp_path)
    assert room(other, img, tmp_path)[0].template == "0" and other.making == []


def test_with_every_template_in_use_a_room_waits_for_one_to_come_free(tmp_path):
    t, img = templates(tmp_path, most=1), image(tmp_path)
    _, release = room(t, img, tmp_path)
    freed_at = []

    def free_soon():
        time.sleep(1.0)
        freed_at.append(time.monotonic())
        release()

    threading.Thread(target=free_soon).start()
    got, _ = room(t, img, tmp_path)
    assert got.template == "0" and freed_at and time.monotonic() >= freed_at[0]
    assert t.making == [0]


def test_a_room_whose_template_cannot_be_made_boots_cold_and_none_is_left_half_made(tmp_path):
    t, img = templates(tmp_path), image(tmp_path)
    t._make = lambda folder, number, image: False
    assert room(t, img, tmp_path) is None
    lock = tmp_path / "rooms" / t.key(img) / "0.lock"
    fd = os.open(lock, os.O_RDWR)  # the lock was let go: the next room may try again
    import fcntl
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


def test_no_templates_or_an_image_vmd_cannot_restore_means_cold_rooms(tmp_path):
    assert room(templates(tmp_path, most=0), image(tmp_path), tmp_path) is None
    t = templates(tmp_path)
    odd = image(tmp_path)
    odd.boot = "disk"  # a Linux image booted from its own disk: not saved and restored (unpoolable)
    assert room(t, odd, tmp_path) is None and t.making == []


def test_a_rebuilt_image_or_another_memory_size_removes_the_old_templates(tmp_path):
    t, old = templates(tmp_path), image(tmp_path, "aaaa")
    _, release = room(t, old, tmp_path)
    release()
    old_folder = tmp_path / "rooms" / t.key(old)
    assert (old_folder / "0" / "slot.json").is_file()
    new = image(tmp_path, "bbbb")
    room(t, new, tmp_path)
    assert not old_folder.exists() and t.key(new) != t.key(old)
    bigger = templates(tmp_path, guest_memory_mib=4096)
    assert bigger.key(new) != t.key(new), "a guest of another memory size cannot restore the saved one"


def test_an_old_template_a_room_still_runs_from_is_kept(tmp_path):
    t, old = templates(tmp_path), image(tmp_path, "aaaa")
    _, release = room(t, old, tmp_path)  # held: a room runs from it
    room(templates(tmp_path), image(tmp_path, "bbbb"), tmp_path)
    assert (tmp_path / "rooms" / t.key(old) / "0" / "slot.json").is_file()
    release()


def test_the_restore_moves_the_ssh_forward_to_a_port_of_the_rooms_own():
    xml = ("<domain xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'><name>vmagent-r-1</name>"
           "<metadata><vmd:machine xmlns:vmd='https://vmagent.invalid/vmd' ssh-port='40001'/></metadata>"
           "<qemu:commandline><qemu:arg value='-netdev'/>"
           "<qemu:arg value='user,id=vmdnet0,restrict=on,hostfwd=tcp:127.0.0.1:40001-:22'/>"
           "</qemu:commandline></domain>")
    moved = with_ssh_port(xml, 40001, 45555)
    assert "hostfwd=tcp:127.0.0.1:45555-:22" in moved and "40001" not in moved
    assert "ssh-port=\"45555\"" in moved and "<name>vmagent-r-1</name>" in moved


def test_a_templates_dir_in_folders_that_do_not_exist_yet_is_passable_all_the_way(tmp_path):
    # The suite's shared dir once sat in a folder vmd made 0700: QEMU could not reach it, and
    # every room of a whole CI run booted cold ("cannot pass through ... (mode 700)").
    import grp
    import stat

    gid = grp.getgrnam("nogroup").gr_gid
    t = Recorded(make_config(tmp_path, libvirt_uri="test:///default", share_user="nobody", room_templates=1,
                             room_templates_dir=tmp_path / "new" / "deeper" / "rooms"))
    got, release = room(t, image(tmp_path), tmp_path)
    release()
    for folder in (tmp_path / "new", tmp_path / "new" / "deeper", tmp_path / "new" / "deeper" / "rooms"):
        st = folder.stat()
        assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o710, (folder, oct(st.st_mode))


def test_two_templates_dirs_on_one_host_name_their_guests_apart(tmp_path):
    # libvirt's names are the host's: the suite's templates dir and a test's own, with the same
    # image's key, once made one domain, and each discarded the other's running room.
    from vmd.machines.room_templates import template_domain

    key = "debian-7c5d3266eb942a90-7cf2048ba9"
    a, b = template_domain(tmp_path / "a" / key, 0), template_domain(tmp_path / "b" / key, 0)
    assert a != b and a.startswith("vmagent-r-") and b.startswith("vmagent-r-")
    assert template_domain(tmp_path / "a" / key, 0) == a != template_domain(tmp_path / "a" / key, 1)
