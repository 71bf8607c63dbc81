"""The sweep of guests no session owns (vmd/server/lifecycle.py `_sweep`, vmd/machines/libvirt_machines.py
`sweep`) on libvirt's test:///default driver: a guest is this vmd's when its <metadata>
names this vmd's state dir exactly and a session of it (vmd/machines/domain_xml.py `VmdOwner`),
and it is kept while that session is open on disk, whatever the guest is named."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt
import pytest

from tests.support.vmd_fakes import make_config
from vmd.machines.domain_xml import (DirectKernel, Disk, Domain, UserNetwork, VmdOwner, nic_macs, set_session,
                            vmd_owner)
from vmd.server.lifecycle import Lifecycle
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.session.state import SessionState
from vmd.session.registry import Sessions

TEST_URI = "test:///default"


def define(conn, name: str, disk: str, owner: VmdOwner | None) -> None:
    ssh, egress = nic_macs(name)
    spec = Domain(name=name, memory_mib=256, vcpus=1, accel="qemu",
                  boot=DirectKernel("/img/vmlinuz", "/img/initrd.img", "root=/dev/vda"),
                  disk=Disk(disk), network=UserNetwork(ssh_port=40022, ssh_mac=ssh, egress_mac=egress),
                  owner=owner)
    conn.defineXML(spec.to_xml()).create()


def open_on_disk(config, sid: str, state: str = "ready") -> None:
    folder = config.sessions_dir / sid
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "session.json").write_text(SessionState(id=sid, os="debian", state=state).model_dump_json())


def _remove_ours(conn) -> None:
    for domain in conn.listAllDomains():
        if domain.name().startswith("vmagent-"):
            if domain.isActive():
                domain.destroy()
            domain.undefine()


@pytest.fixture
def conn():
    # test:///default is one in-memory host per process, shared by every test the worker
    # runs: a guest another test left there (CI once saw a parked room's) is not this test's.
    conn = libvirt.open(TEST_URI)
    _remove_ours(conn)
    yield conn
    _remove_ours(conn)
    conn.close()


def names(conn) -> set[str]:
    return {d.name() for d in conn.listAllDomains() if d.name().startswith("vmagent-")}


def test_the_sweep_matches_its_own_state_dir_exactly_and_finds_warm_sessions_by_id(tmp_path, conn):
    ours = make_config(tmp_path / "srv" / "x", libvirt_uri=TEST_URI)
    # Another vmd whose state dir holds ours as a substring, as /data/srv/x holds /srv/x.
    theirs = make_config(tmp_path / "data" / str(tmp_path / "srv" / "x").lstrip("/"), libvirt_uri=TEST_URI)
    assert str(ours.state_dir) in str(theirs.state_dir)
    sessions = Sessions(ours, LibvirtMachines(ours))
    open_sid, closed_sid, warm_sid = "s-20250101-000000-aaaaaa", "s-20250101-000000-bbbbbb", "s-20250101-000000-cccccc"
    open_on_disk(ours, open_sid)
    open_on_disk(ours, closed_sid, state="closed")
    open_on_disk(ours, warm_sid)  # being opened: not among the live sessions yet
    me = str(ours.state_dir)
    define(conn, f"vmagent-{open_sid}", f"{ours.sessions_dir}/{open_sid}/machine/overlay.qcow2", VmdOwner(me, open_sid))
    define(conn, f"vmagent-{closed_sid}", f"{ours.sessions_dir}/{closed_sid}/machine/overlay.qcow2",
           VmdOwner(me, closed_sid))
    # A warm machine keeps its slot's name; its session is in the metadata only.
    define(conn, "vmagent-w-0123456789ab", f"{ours.sessions_dir}/{warm_sid}/machine/overlay.qcow2",
           VmdOwner(me, warm_sid))
    # A slot being made: no session yet, the pool's own.
    define(conn, "vmagent-w-ba9876543210", f"{ours.state_dir}/warm/debian-1/.ba9876543210.making/overlay.qcow2",
           VmdOwner(me, None))
    # The other vmd's guest of a session this vmd does not have: not this vmd's to touch.
    define(conn, "vmagent-s-20250101-000000-dddddd",
           f"{theirs.sessions_dir}/s-20250101-000000-dddddd/machine/overlay.qcow2",
           VmdOwner(str(theirs.state_dir), "s-20250101-000000-dddddd"))

    Lifecycle(sessions, ours)._sweep()

    assert names(conn) == {f"vmagent-{open_sid}", "vmagent-w-0123456789ab", "vmagent-w-ba9876543210",
                           "vmagent-s-20250101-000000-dddddd"}


def test_a_guest_of_an_older_vmd_is_matched_by_its_disk_path_by_parts(tmp_path, conn):
    ours = make_config(tmp_path / "srv" / "x", libvirt_uri=TEST_URI)
    theirs = make_config(tmp_path / "data" / str(tmp_path / "srv" / "x").lstrip("/"), libvirt_uri=TEST_URI)
    sessions = Sessions(ours, LibvirtMachines(ours))
    gone, other = "s-20250101-000000-eeeeee", "s-20250101-000000-ffffff"
    define(conn, f"vmagent-{gone}", f"{ours.sessions_dir}/{gone}/machine/overlay.qcow2", None)
    define(conn, f"vmagent-{other}", f"{theirs.sessions_dir}/{other}/machine/overlay.qcow2", None)
    Lifecycle(sessions, ours)._sweep()
    assert names(conn) == {f"vmagent-{other}"}


def test_the_metadata_names_the_vmd_and_the_session_and_a_hand_out_can_rename_the_session():
    ssh, egress = nic_macs("vmagent-w-1")
    xml = Domain(name="vmagent-w-1", memory_mib=256, vcpus=1, accel="qemu",
                 boot=DirectKernel("/k", "/i", ""), disk=Disk("/d"),
                 network=UserNetwork(ssh_port=40022, ssh_mac=ssh, egress_mac=egress),
                 owner=VmdOwner("/var/lib/vmagent/state", None)).to_xml()
    assert vmd_owner(xml) == VmdOwner("/var/lib/vmagent/state", None)
    root = ET.fromstring(xml)
    set_session(root, "s-20250101-000000-abcdef")
    assert vmd_owner(root) == VmdOwner("/var/lib/vmagent/state", "s-20250101-000000-abcdef")
    assert 'ssh-port="40022"' in xml  # what a restarted vmd re-binds by (Machine.attach)
