"""Parked warm slots without a guest (vmd/machines/parked_slot.py), on libvirt's test driver and
real folders: what a hand-out does to the files, the project folder and the domain, and what
it refuses. The guest's side (its mount shows the project, its clock, its first command): 
tests/vmd/machines/test_warm_pool_vm.py."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import libvirt
import pytest

from tests.vmd.machines.test_domain_xml import TEST_URI, fake_image  # noqa: F401 (fixture)
from tests.support.vmd_fakes import make_config
from vmd.machines.domain_xml import VmdOwner, vmd_owner
from vmd.machines.host import local_host
from vmd.machines.machine import Machine
from vmd.machines.parked_slot import (PARKED_FILE, ParkedSlot, ParkFailed, move_project_into, parkable,
                                      parked_slots_in, untouched)
from vmd.machines.warm_pool import WarmPool
from vmd.contract.results import Facts

SESSION = "s-20260101-000000-abcdef"
MAPPED = "user.virtfs.mode"


def facts() -> Facts:
    return Facts(os="Debian GNU/Linux 12", kernel="Linux 6.1", python="Python 3.11", git="git 2.39",
                 desktop=True, project_path="/mnt/project", project_mounted=True, boot_id="b-1",
                 hostname="vmagent-guest", accel="qemu")


def new_pool(tmp_path: Path, size: int = 1) -> WarmPool:
    config = make_config(tmp_path, libvirt_uri=TEST_URI, share_user="nobody", warm_parked=1)
    return WarmPool(config, local_host(config.libvirt_uri), size=size)


def parked_slot(pool: WarmPool, image, slot_id: str | None = None) -> ParkedSlot:
    """A slot as `park` leaves one: its domain paused, its folder `<id>.parked` with an empty share.
    Its own name: the test driver's domains are the process's, and one a failed test left
    must not stop the next."""
    slot_id = slot_id or uuid.uuid4().hex[:12]
    folder = pool.dir / image.dir.name / f"{slot_id}.parked"
    (folder / "share").mkdir(parents=True)
    machine = Machine.create(image, name=f"vmagent-w-{slot_id}", workdir=folder, project_dir=folder / "share",
                             uri=TEST_URI, config=pool.config, owner=VmdOwner(state_dir=str(pool.dir.parent)))
    machine.domain.suspend()
    (folder / PARKED_FILE).write_text("{}")
    parked = ParkedSlot(machine=machine, folder=folder, image_dir=image.dir.name, facts=facts(),
                        parked_at=time.time())
    assert pool.add_parked(parked)
    return parked


def checkout(root: Path) -> Path:
    """A project folder as vmd prepares one: files, a folder, a hidden one, mapped attributes."""
    project = root / "projects" / "local" / "demo"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('hi')\n")
    (project / ".gitignore").write_text("*.pyc\n")
    (project / "README.md").write_text("# demo\n")
    os.chmod(project, 0o700)
    os.setxattr(project, MAPPED, (0o40755).to_bytes(4, "little"))
    return project


def domains() -> list[str]:
    return [d.name() for d in libvirt.open(TEST_URI).listAllDomains()]


def test_a_parked_slot_is_handed_out_first_running_with_the_sessions_project_and_owner(fake_image, tmp_path):  # noqa: F811
    pool = new_pool(tmp_path)
    parked = parked_slot(pool, fake_image)
    share_inode = os.stat(parked.folder / "share").st_ino
    project = checkout(tmp_path)
    workdir = tmp_path / "state" / "sessions" / SESSION / "machine"
    workdir.parent.mkdir(parents=True)

    machine, note = pool.machine_for(fake_image, workdir=workdir, project_dir=project, session_id=SESSION)

    assert note is None and machine is parked.machine
    try:
        assert machine.state() == "running"
        assert vmd_owner(machine.domain.XMLDesc(0)).session == SESSION, "the sweep would not find its session"
        assert vmd_owner((workdir / "domain.xml").read_text()).session == SESSION
        # The parked folder is the session's machine folder now, overlay and all.
        assert not parked.folder.exists() and (workdir / "overlay.qcow2").is_file()
        assert machine.workdir == workdir and machine.project_dir == project
        # The guest's export (the share folder, by its inode) is the project folder now, with
        # the project's files and the project folder's owner, mode and mapped attributes.
        assert os.stat(project).st_ino == share_inode
        assert sorted(os.listdir(project)) == [".gitignore", "README.md", "src"]
        assert (project / "src" / "main.py").read_text() == "print('hi')\n"
        assert os.stat(project).st_mode & 0o7777 == 0o700
        assert os.getxattr(project, MAPPED) == (0o40755).to_bytes(4, "little")
        assert not (workdir / "share").exists() and not (workdir / PARKED_FILE).exists()
        # Its first `ready` is the parked one (the clock through the kept runner), once.
        assert machine.woken == parked.facts
        assert pool.parked(fake_image) == 0 and pool.handing_out(machine.name)
    finally:
        machine.destroy()
    assert machine.name not in domains()
    # Its disk went back to the path libvirt knew for the destroy, and is gone from both.
    assert not (workdir / "overlay.qcow2").exists() and not parked.folder.exists()


def test_a_parked_guest_that_wrote_into_its_share_is_destroyed_and_the_session_boots_cold(fake_image, tmp_path):  # noqa: F811
    pool = new_pool(tmp_path)
    parked = parked_slot(pool, fake_image)
    (parked.folder / "share" / "planted").write_text("left for the next session\n")
    project = checkout(tmp_path)
    before = sorted(os.listdir(project))

    machine, note = pool.machine_for(fake_image, workdir=tmp_path / "machine", project_dir=project,
                                     session_id=SESSION)

    assert machine is None
    assert "wrote into its share folder" in note and "booted cold" in note, note
    assert parked.machine.name not in domains() and not parked.folder.exists()
    assert sorted(os.listdir(project)) == before and not (project / "planted").exists()


def test_a_parked_guest_that_is_no_longer_paused_is_not_handed_out(fake_image, tmp_path):  # noqa: F811
    # Paused is what makes the share's check and the move safe from the guest: one that runs
    # (someone resumed it; libvirt restarted it) could write between them.
    pool = new_pool(tmp_path)
    parked = parked_slot(pool, fake_image)
    parked.machine.domain.resume()
    machine, note = pool.machine_for(fake_image, workdir=tmp_path / "machine", project_dir=checkout(tmp_path),
                                     session_id=SESSION)
    assert machine is None and "running, not paused" in note, note
    assert parked.machine.name not in domains()


def test_the_share_folders_own_attributes_from_the_guest_are_dropped(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    os.setxattr(share, "user.virtfs.uid", (0).to_bytes(4, "little"))
    os.setxattr(share, "user.planted", b"x")
    untouched(share)
    assert os.listxattr(share) == []
    (share / "x").mkdir()
    with pytest.raises(ParkFailed, match="wrote into its share folder"):
        untouched(share)


def test_a_move_that_fails_half_way_leaves_the_project_folder_whole(tmp_path):
    project = checkout(tmp_path)
    share = tmp_path / "share"
    share.mkdir()
    # "src" cannot go where a non-empty folder of that name is: the move stops there.
    (share / "src" / "in-the-way").mkdir(parents=True)
    with pytest.raises(OSError):
        move_project_into(share, project)
    assert sorted(os.listdir(project)) == [".gitignore", "README.md", "src"]
    assert (project / "src" / "main.py").is_file()
    assert sorted(os.listdir(share)) == ["src"]


def test_a_parked_folder_of_an_earlier_vmd_is_destroyed_with_its_guest(fake_image, tmp_path):  # noqa: F811
    earlier = new_pool(tmp_path)
    left = parked_slot(earlier, fake_image)
    assert parked_slots_in(left.folder.parent) == [left.folder]
    pool = new_pool(tmp_path)  # the next vmd: its SSH connection to that guest is gone
    pool.discard_stale(fake_image)
    assert left.machine.name not in domains() and not left.folder.exists()


def test_a_stopped_pool_destroys_its_parked_guests(fake_image, tmp_path):  # noqa: F811
    pool = new_pool(tmp_path)
    parked = parked_slot(pool, fake_image)
    pool.stop()
    assert parked.machine.name not in domains() and not parked.folder.exists()
    assert pool.claim_parked(fake_image) is None


def test_only_linux_guests_on_9p_are_parked(fake_image):  # noqa: F811
    assert parkable(fake_image)
    assert not parkable(fake_image.model_copy(update={"share": "smb"}))
    assert not parkable(fake_image.model_copy(update={"os_family": "windows", "boot": "disk", "share": "smb"}))


def test_a_parked_guests_disk_is_not_relabelled_by_libvirt_whose_paths_go_stale(tmp_path):
    # The hand-out renames the parked folder; libvirt would give the disk its owner back at the
    # end by the old path. Its other sources (console, share) are not libvirt's to relabel anyway.
    import xml.etree.ElementTree as ET

    from tests.vmd.machines.test_warm_pool import SAVED_XML
    from vmd.machines.parked_slot import unlabelled

    root = ET.fromstring(unlabelled(SAVED_XML.format(slot="/state/warm/debian-1/abc.parked")))
    [label] = root.findall("devices/disk/source/seclabel")
    assert label.attrib == {"model": "dac", "relabel": "no"}
    assert root.findall("devices/filesystem/source/seclabel") == []
    assert root.find("devices/disk/source").get("file") == "/state/warm/debian-1/abc.parked/overlay.qcow2"
