"""The warm pool's bookkeeping without a guest (vmd/machines/warm_pool.py): which slots a hand-out
may take, what it restores, what goes stale; and how a session reports a machine that
came warm. The hand-out itself, on real guests: tests/vmd/machines/test_warm_pool_vm.py."""

from __future__ import annotations

import dataclasses
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

from tests.support.vmd_fakes import LocalMachine, LocalMachines, local_vmd, make_config
from tests.support.vmd_wire import WireVmd
from vmd.machines.domain_xml import QEMU_NS, SMB_CHARDEV, SmbShare, smb_socket_of
from vmd.machines.host import local_host
from vmd.machines.images import Image
from vmd.machines.warm_pool import WarmPool
from vmd.machines.boot_share import NVRAM_FILE
from vmd.machines.domain_xml import DiskBoot
from vmd.machines.warm_slot import SLOT_FILES, SlotInfo, restore_xml, unpoolable

SAVED_XML = """<domain type='qemu'>
  <name>vmagent-w-0123456789ab</name>
  <uuid>5b1f0c8e-3f5e-4c1e-9d55-0a4f3d1c2b7a</uuid>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{slot}/overlay.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <filesystem type='mount' accessmode='mapped'>
      <source dir='{slot}/share'/>
      <target dir='project'/>
    </filesystem>
    <serial type='file'><source path='{slot}/console.log' append='off'/></serial>
    <console type='file'><source path='{slot}/console.log' append='off'/></console>
    <kernel>/images/debian-1/vmlinuz</kernel>
  </devices>
</domain>"""


def image(tmp_path: Path, name: str = "debian", build: str = "aaaa") -> SimpleNamespace:
    return SimpleNamespace(name=name, os_family="linux", dir=tmp_path / "images" / f"{name}-{build}")


def new_pool(tmp_path: Path, size: int, **settings) -> WarmPool:
    """A pool of the local host on libvirt's test driver, its state under tmp_path/state."""
    config = make_config(tmp_path, libvirt_uri="test:///default", share_user="nobody", **settings)
    return WarmPool(config, local_host(config.libvirt_uri), size=size)


def make_ready_slot(pool: WarmPool, img, slot_id: str) -> Path:
    folder = pool.dir / img.dir.name / slot_id
    folder.mkdir(parents=True)
    (folder / "slot.json").write_text(SlotInfo(name=f"vmagent-w-{slot_id}", folder=str(folder), share="/s",
                                               ssh_port=2222, accel="qemu", boot_seconds=40.0,
                                               made_at=0.0).model_dump_json())
    return folder


def test_the_restore_points_the_slots_files_at_the_session_and_the_share_at_its_project(tmp_path):
    slot = "/state/warm/debian-aaaa/.0123456789ab.making"
    info = SlotInfo(name="vmagent-w-0123456789ab", folder=slot, share=f"{slot}/share", ssh_port=2222,
                    accel="qemu", boot_seconds=40.0, made_at=0.0)
    workdir, project = Path("/state/sessions/s-1/machine"), Path("/state/projects/local/demo")
    root = ET.fromstring(restore_xml(SAVED_XML.format(slot=slot), info, workdir, project))
    assert root.find("devices/disk/source").get("file") == f"{workdir}/overlay.qcow2"
    assert root.find("devices/filesystem/source").get("dir") == str(project)
    assert {e.get("path") for e in root.iter("source") if e.get("path")} == {f"{workdir}/console.log"}
    # What libvirt checks against the saved guest stays as saved.
    assert root.findtext("name") == "vmagent-w-0123456789ab"
    assert root.findtext("uuid") == "5b1f0c8e-3f5e-4c1e-9d55-0a4f3d1c2b7a"
    assert root.findtext("devices/kernel") == "/images/debian-1/vmlinuz"
    assert slot not in ET.tostring(root, encoding="unicode")


def test_the_restore_moves_an_smb_shares_socket_to_the_sessions_folder():
    # A guest on SMB: QEMU's socket is a QEMU argument and a line of vmd's metadata, not a
    # <source>; the restored QEMU must listen in the session's folder, where its relay is.
    slot = "/state/warm/debian-aaaa/.0123456789ab.making"
    info = SlotInfo(name="vmagent-w-0123456789ab", folder=slot, share=f"{slot}/share", ssh_port=2222,
                    accel="qemu", boot_seconds=40.0, made_at=0.0)
    smb = SmbShare(source=f"{slot}/share", socket=f"{slot}/smb/q.sock")
    args = "".join(f"<qemu:arg value='{a}'/>" for a in smb.qemu_args() + smb.netdev_options())
    saved = SAVED_XML.format(slot=slot).replace("<domain type='qemu'>", f"<domain type='qemu' xmlns:qemu='{QEMU_NS}'>")
    saved = saved.replace("</domain>", f"<qemu:commandline>{args}</qemu:commandline></domain>")
    saved = saved.replace("<name>", f"<metadata><vmd:machine xmlns:vmd='https://vmagent.invalid/xmlns/vmd/1' "
                                    f"ssh-port='2222' smb-socket='{slot}/smb/q.sock'/></metadata><name>", 1)
    workdir, project = Path("/state/sessions/s-1/machine"), Path("/state/projects/local/demo")
    restored = restore_xml(saved, info, workdir, project, "s-1")
    assert smb_socket_of(restored) == f"{workdir}/smb/q.sock"
    values = [e.get("value") for e in ET.fromstring(restored).iter(f"{{{QEMU_NS}}}arg")]
    assert f"socket,id={SMB_CHARDEV},path={workdir}/smb/q.sock,server=on,wait=off" in values
    assert slot not in restored


def test_a_slot_serves_one_session_and_half_made_ones_none(tmp_path):
    pool = new_pool(tmp_path, size=2)
    img = image(tmp_path)
    ready = make_ready_slot(pool, img, "aaaaaaaaaaaa")
    (pool.dir / img.dir.name / ".bbbbbbbbbbbb.making").mkdir()  # still booting
    (pool.dir / img.dir.name / "cccccccccccc.taken").mkdir()  # handed out already
    assert pool.ready_slots(img) == [ready]
    claims: list[Path | None] = []
    threads = [threading.Thread(target=lambda: claims.append(pool.take(img))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [c for c in claims if c is not None]
    assert won == [ready.with_name("aaaaaaaaaaaa.taken")], claims
    assert pool.take(img) is None and pool.ready_slots(img) == []


def test_a_rebuilt_image_discards_the_slots_of_its_older_build(tmp_path):
    pool = new_pool(tmp_path, size=1)
    old, new, other = image(tmp_path, build="old1"), image(tmp_path, build="new2"), image(tmp_path, "ubuntu")
    stale = make_ready_slot(pool, old, "aaaaaaaaaaaa")
    kept = make_ready_slot(pool, new, "bbbbbbbbbbbb")
    leftover = pool.dir / new.dir.name / "cccccccccccc.taken"  # a hand-out an earlier vmd cut short
    leftover.mkdir()
    others = make_ready_slot(pool, other, "dddddddddddd")
    pool.discard_stale(new)
    assert not stale.parent.exists() and not leftover.exists()
    assert kept.is_dir() and others.is_dir()


class WarmMachines(LocalMachines):
    """Stand-in machines that say they came from the pool, under a slot's domain name."""

    def create(self, spec):
        machine = super().create(spec)
        machine.name, machine.came, machine.came_note = "vmagent-w-0123456789ab", "warm", None
        return machine


def test_a_session_whose_machine_came_warm_says_so_and_keeps_the_slots_name(tmp_path):
    assert not hasattr(LocalMachine, "came")  # the plain stand-ins come cold, by default
    with local_vmd(tmp_path, machines=WarmMachines()) as (_, machines, config):
        with WireVmd(config.socket, timeout=60) as c:
            sid = c.call("session_open", task="warm", wait=True)["session_id"]
            ready = c.call("session_ready", timeout=60)
            status = c.call("session_status")
            assert ready["came"] == "warm" and "warm machine handed out" in ready["text"], ready
            assert status["machine_came"] == "warm" and "(warm, " in status["status_line"], status
            report = c.call("report")["markdown"]
            assert "The machine came warm from vmd's pool" in report, report
            c.call("session_close")
        session = (config.sessions_dir / sid / "session.json").read_text()
        assert '"machine_name": "vmagent-w-0123456789ab"' in session
        assert machines.destroyed == [f"vmagent-{sid}"]  # the stand-in's own name for it


def test_auto_sizes_the_pool_for_the_host_and_a_bad_size_is_refused_with_what_to_give():
    from vmd.config import VmdConfig, VmdConfigError
    from vmd.machines.host_room import host_pool_size

    gib = 1024
    assert host_pool_size(2, 24 * gib, 2048) == 1  # this kind of host: one slot, one core left to the sessions
    assert host_pool_size(1, 64 * gib, 2048) == 0  # a slot's boot would take the only core
    assert host_pool_size(16, 64 * gib, 2048) == 4  # capped
    assert host_pool_size(8, 8 * gib, 2048) == 1  # memory, not cores, decides
    assert host_pool_size(8, 4 * gib, 2048) == 0
    assert VmdConfig.load(env={}).warm_pool_size == "auto"
    assert VmdConfig.load(env={"VMD_WARM_POOL_SIZE": " 3 "}).warm_pool_size == 3
    for bad in ("many", "17", "-1"):
        try:
            VmdConfig.load(env={"VMD_WARM_POOL_SIZE": bad})
        except VmdConfigError as exc:
            assert "VMD_WARM_POOL_SIZE" in str(exc) and "or auto" in str(exc), exc
        else:
            raise AssertionError(f"VMD_WARM_POOL_SIZE={bad} was taken")


def test_the_refill_waits_while_the_host_has_no_room(tmp_path, monkeypatch):
    import os

    from vmd.machines.host_room import no_room

    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (2 * cores + 1.0, 0.0, 0.0))
    assert "busy" in no_room(tmp_path, guest_mib=1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert "memory available" in no_room(tmp_path, guest_mib=10**9)  # no host has two such guests' memory
    assert no_room(tmp_path, guest_mib=1) is None or "disk" in no_room(tmp_path, guest_mib=1)
    # Before the first slot the pool's folder does not exist: the disk it will be made on counts.
    import shutil
    seen = []
    monkeypatch.setattr(shutil, "disk_usage", lambda p: seen.append(p) or SimpleNamespace(free=1024 * 2**20))
    assert "MiB free" in no_room(tmp_path / "state" / "warm", guest_mib=1)
    assert seen == [tmp_path]


def test_a_vmd_started_with_the_pool_off_removes_an_earlier_pools_slots(tmp_path):
    from vmd.machines.libvirt_machines import LibvirtMachines

    config = make_config(tmp_path, warm_pool_size=0, libvirt_uri="test:///default")
    pool = new_pool(tmp_path, size=1)
    img = image(tmp_path)
    ready = make_ready_slot(pool, img, "aaaaaaaaaaaa")
    (ready / "saved.img").write_bytes(b"\0" * 4096)  # a guest's memory, on disk
    half_made = pool.dir / img.dir.name / ".bbbbbbbbbbbb.making"  # an earlier vmd died while it booted
    half_made.mkdir()
    machines = LibvirtMachines(config)
    machines.start_pool()
    assert machines.pool is None and not pool.dir.exists()


def test_a_session_that_finds_no_slot_waits_for_the_one_being_made_and_only_one_session_does(tmp_path):
    import time

    pool = new_pool(tmp_path, size=1)
    img = image(tmp_path)
    (pool.dir / img.dir.name).mkdir(parents=True)
    with pool._changed:  # the refill is booting slot cccc..., begun a moment ago
        pool._making, pool._making_since = "vmagent-w-cccccccccccc", time.monotonic()

    def the_refill_saves_it():
        time.sleep(0.5)
        make_ready_slot(pool, img, "cccccccccccc")
        with pool._changed:
            pool._making = None
            pool._changed.notify_all()

    got = {}
    waiter = threading.Thread(target=lambda: got.update(first=pool._wait_for_a_slot(img)))
    waiter.start()
    time.sleep(0.1)
    assert pool._wait_for_a_slot(img) is None  # a second session boots cold at once
    threading.Thread(target=the_refill_saves_it).start()
    waiter.join(10)
    assert got["first"] is not None and got["first"].name == "cccccccccccc.taken", got

    # A slot whose making ran past its own bounds (VmdConfig.slot_make_s, x4 under TCG) is
    # not waited for any longer.
    with pool._changed:
        pool._making = "vmagent-w-dddddddddddd"
        pool._making_since = time.monotonic() - pool.config.slot_make_s * pool.timeout_scale() + 0.5
    started = time.monotonic()
    assert pool._wait_for_a_slot(img) is None
    assert 0.3 < time.monotonic() - started < 5
    # The bound is the config's: a pool told 1 s (at KVM's pace) waits about that long.
    quick = new_pool(tmp_path / "quick", size=1, slot_make_s=1.0, accel="kvm")
    (quick.dir / img.dir.name).mkdir(parents=True)
    with quick._changed:
        quick._making, quick._making_since = "vmagent-w-eeeeeeeeeeee", time.monotonic()
    started = time.monotonic()
    assert quick._wait_for_a_slot(img) is None
    assert 0.8 < time.monotonic() - started < 1.8


def test_a_session_that_finds_no_slot_while_one_is_being_parked_waits_for_it(tmp_path):
    # The refill took the last saved slot to park it (a restore and a wake: seconds); a
    # session asking meanwhile gets it once it is parked rather than booting cold.
    import time

    from vmd.machines.parked_slot import ParkedSlot

    pool = new_pool(tmp_path, size=1)
    img = image(tmp_path)
    with pool._changed:
        pool._parking = True
    parked = ParkedSlot(machine=SimpleNamespace(name="vmagent-w-ffffffffffff"), folder=tmp_path / "p",
                        image_dir=img.dir.name, facts=None, parked_at=0.0)

    def the_refill_parks_it():
        time.sleep(0.5)
        pool.add_parked(parked)
        with pool._changed:
            pool._parking = False
            pool._changed.notify_all()

    threading.Thread(target=the_refill_parks_it).start()
    started = time.monotonic()
    assert pool._wait_for_a_slot(img) is parked
    assert time.monotonic() - started < 5
    assert pool.claim_parked(img) is None  # that session's only


def test_an_image_the_pool_cannot_restore_gets_no_slots_and_a_sentence_why(tmp_path, monkeypatch, caplog):
    """The pool serves what it can restore with a new identity in place: a Linux guest on the
    host's kernel (9p or SMB) and a Windows guest (disk boot, UEFI, SMB). A disk-booted Linux
    guest has no such path: the pool must not boot and throw away its guests for ever."""
    common = dict(user="agent", resolution=(1280, 800), desktop=True)
    debian = Image(name="debian", os_family="linux", project_path="/mnt/project", kernel="vmlinuz",
                   initrd="initrd.img", dir=tmp_path / "images" / "debian-1", **common)
    windows = Image(name="windows", os_family="windows", project_path="Z:\\", boot="disk", uefi=True, tpm=True,
                    share="smb", dir=tmp_path / "images" / "windows-1", **common)
    disk_linux = Image(name="ubuntu-disk", os_family="linux", project_path="/mnt/project", boot="disk",
                       uefi=True, dir=tmp_path / "images" / "ubuntu-disk-1", **common)
    assert unpoolable(debian) is None
    assert unpoolable(debian.model_copy(update={"share": "smb"})) is None
    assert unpoolable(windows) is None
    assert "serves no 'ubuntu-disk' guests yet" in unpoolable(disk_linux)
    pool = new_pool(tmp_path, size=1)
    made = []
    monkeypatch.setattr(pool, "make_slot", lambda image: made.append(image))
    # Room to spare: without the gate the pool would make a slot at once.
    pool.host = dataclasses.replace(pool.host, room=SimpleNamespace(no_room=lambda *a: None, pool_size=lambda *a: 1))
    with caplog.at_level("WARNING", logger="vmd.machines.warm_pool"):
        pool.start(lambda: disk_linux)
        threading.Event().wait(1.5)
        pool.stop()
    assert made == []
    assert "serves no 'ubuntu-disk' guests yet" in caplog.text


def test_the_restore_moves_a_uefi_guests_variable_store_and_leaves_firmware_and_tpm_as_saved():
    slot = "/state/warm/windows-aaaa/.0123456789ab.making"
    info = SlotInfo(name="vmagent-w-0123456789ab", folder=slot, share=f"{slot}/share", ssh_port=2222,
                    accel="kvm", boot_seconds=80.0, made_at=0.0)
    firmware = DiskBoot(uefi=True, tpm=True, nvram=f"{slot}/{NVRAM_FILE}")
    saved = SAVED_XML.format(slot=slot).replace("<kernel>/images/debian-1/vmlinuz</kernel>", "")
    root = ET.fromstring(saved)
    firmware.write(ET.SubElement(root, "os"))  # the loader and the nvram
    firmware.write_devices(root.find("devices"))  # the <tpm>
    workdir, project = Path("/state/sessions/s-1/machine"), Path("/state/projects/local/demo")
    restored = ET.fromstring(restore_xml(ET.tostring(root, encoding="unicode"), info, workdir, project, "s-1"))
    nvram = restored.find("os/nvram")
    assert nvram.text == f"{workdir}/{NVRAM_FILE}"
    assert nvram.get("template") == firmware.vars_template  # the firmware's own files stay where they are
    assert restored.findtext("os/loader") == firmware.loader
    assert restored.find("devices/tpm/backend").attrib == {"type": "emulator", "version": "2.0"}
    assert NVRAM_FILE in SLOT_FILES  # a hand-out moves it with the overlay
