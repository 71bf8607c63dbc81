"""One seam per host (vmd/machines/host.py): what differs between two hosts is read from
a `Host` value - the libvirt it makes guests with, where vmd reaches a guest's SSH, where
screen dumps land, its room for warm slots - and a session keeps its host's name. And
the tunables that lived in code (the guest's memory and vCPUs, the warm slot's bounds,
what a command returns of its output) are vmd's settings, obeyed where they take effect.

Guests here are libvirt's test driver's (no QEMU) and a real SSH server on loopback
(tests/support/hostile_sshd.py); the boots on real guests are tests/vmd/machines/test_machine_vm.py and
tests/vmd/machines/test_warm_pool_vm.py."""

from __future__ import annotations

import json
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.hostile_sshd import HostileSshd
from tests.support.vmd_fakes import LocalMachines, RpcClient, local_vmd, make_config
from vmd.config import VmdConfig
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.output import OutputBounds
from vmd.guests.ssh import SshConnection
from vmd.machines.host import LOCAL, Host, local_host
from vmd.machines.images import Image, find_image
from vmd.machines.port import MachineError, MachineSpec
from vmd.session.state import SessionState

TEST_URI = "test:///default"  # libvirt's test driver: domains without QEMU


@pytest.fixture
def image(tmp_path) -> Image:
    """An image whose files exist but boot nothing (the test driver runs no QEMU)."""
    folder = tmp_path / "images" / "debian-test"
    folder.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "disk.qcow2"), "64M"], check=True)
    for name in ("vmlinuz", "initrd.img"):
        (folder / name).write_text("")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_ed25519")], check=True)
    manifest = dict(name="debian", os_family="linux", user="agent", project_path="/mnt/project",
                    resolution=[1024, 768], desktop=True, kernel="vmlinuz", initrd="initrd.img",
                    kernel_args="root=/dev/vda")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return find_image("debian", tmp_path / "images")


@dataclass(frozen=True)
class CountedRoom:
    """A host's room that answers a fixed size and records what it was asked."""
    slots: int
    asked: list = field(default_factory=list, compare=False)

    def pool_size(self, guest_mib: int) -> int:
        self.asked.append(guest_mib)
        return self.slots

    def no_room(self, folder: Path, guest_mib: int) -> str | None:
        return None


def spec(tmp_path: Path, name: str, host: Host | None = None) -> MachineSpec:
    return MachineSpec(session_id="s-20260101-000000-abcdef", os="debian", name=name,
                       workdir=tmp_path / name, project_dir=None, host=host)


def domain_of(made) -> ET.Element:
    return ET.fromstring(made.machine.domain.XMLDesc(0))


def test_a_session_json_from_before_hosts_loads_on_the_local_host(tmp_path):
    old = {"id": "s-20250101-000000-abcdef", "os": "debian", "state": "ready",
           "machine_name": "vmagent-s-20250101-000000-abcdef", "machine_created": True}
    state = SessionState.model_validate_json(json.dumps(old))
    assert state.host == LOCAL
    # A new session records the host its factory put it on, and a restarted vmd finds it.
    with local_vmd(tmp_path) as (_, machines, config):
        client = RpcClient(config.socket)
        try:
            sid = client.call("session_open", task="hosts", wait=True)["session_id"]
            client.call("session_close")
        finally:
            client.close()
    kept = json.loads((config.sessions_dir / sid / "session.json").read_text())
    assert kept["host"] == "local"
    assert LocalMachines().host(kept["host"]) == local_host(TEST_URI)
    with pytest.raises(MachineError, match="no host named 'gone'"):
        LocalMachines().host("gone")


def test_each_guest_is_made_on_its_hosts_libvirt_and_reached_where_its_host_says(image, tmp_path):
    config = make_config(tmp_path, images_dir=str(tmp_path / "images"), libvirt_uri=TEST_URI,
                         share_user="nobody", accel="qemu")
    second = Host(name="second", libvirt_uri=TEST_URI, ssh_address="127.0.0.2", local_files=False,
                  room=CountedRoom(0))
    from vmd.machines.libvirt_machines import LibvirtMachines
    machines = LibvirtMachines(config, hosts=[local_host(TEST_URI), second])
    assert machines.host() == local_host(TEST_URI), "new sessions go to the first host"
    assert machines.host("second") is second
    with pytest.raises(MachineError, match="no host named 'third' .*add the host back, or close the session"):
        machines.host("third")
    here = machines.create(spec(tmp_path, "on-local"))
    there = machines.create(spec(tmp_path, "on-second", second))
    try:
        assert here.machine.host.name == LOCAL and here.machine.ssh.host == "127.0.0.1"
        assert here.machine.screen.dump_path == tmp_path / "on-local" / "screen" / "frame.ppm"
        assert (tmp_path / "on-local" / "screen").is_dir()
        # The second host's guest: SSH at its address, no screen dump vmd cannot read back.
        assert there.machine.host is second and there.machine.ssh.host == "127.0.0.2"
        assert there.machine.screen.dump_path is None and not (tmp_path / "on-second" / "screen").exists()
        assert machines.attach(spec(tmp_path, "on-second", second)).machine.ssh.host == "127.0.0.2"
    finally:
        here.destroy()
        there.destroy()
    assert not machines.discard(spec(tmp_path, "on-second", second)), "destroyed on its host already"


def test_one_warm_pool_per_host_each_sized_by_its_own_room(tmp_path, monkeypatch):
    from vmd.machines.libvirt_machines import LibvirtMachines
    from vmd.machines.warm_pool import WarmPool

    monkeypatch.setattr(WarmPool, "start", lambda pool, find_image: pool)  # no slot made here
    config = make_config(tmp_path, libvirt_uri=TEST_URI, warm_pool_size="auto", guest_memory_mib=1024)
    first, second = CountedRoom(2), CountedRoom(1)
    machines = LibvirtMachines(config, hosts=[Host("local", TEST_URI, room=first),
                                              Host("second", TEST_URI, room=second)])
    machines.start_pool()
    assert {name: pool.size for name, pool in machines.pools.items()} == {"local": 2, "second": 1}
    assert first.asked == [1024] and second.asked == [1024], "each room asked with the configured guest memory"
    assert machines.pool is machines.pools["local"]
    # The local host's slots stay where they were; another host's lie beside them.
    assert machines.pools["local"].dir == config.state_dir / "warm"
    assert machines.pools["second"].dir == config.state_dir / "warm-second"
    assert machines.pools["second"].host.name == "second"


def test_by_default_one_local_host_from_the_config(tmp_path):
    from vmd.machines.libvirt_machines import LibvirtMachines

    config = VmdConfig.load(env={"VMD_LIBVIRT_URI": "qemu+ssh://example.invalid/system"},
                            state_dir=str(tmp_path / "state"))
    machines = LibvirtMachines(config)
    assert list(machines.hosts) == [LOCAL]
    assert machines.host().libvirt_uri == "qemu+ssh://example.invalid/system", "the setting flows into the Host"


def test_the_guest_gets_the_memory_and_vcpus_vmds_config_file_says(image, tmp_path, monkeypatch):
    from vmd.machines.libvirt_machines import LibvirtMachines

    monkeypatch.delenv("VMD_CONFIG", raising=False)
    (tmp_path / "vmd.toml").write_text('guest_memory_mib = 1536\nguest_vcpus = 3\naccel = "qemu"\n')
    config = VmdConfig.load(tmp_path / "vmd.toml", env={}, state_dir=str(tmp_path / "state"),
                            images_dir=str(tmp_path / "images"), libvirt_uri=TEST_URI, share_user="nobody")
    made = LibvirtMachines(config).create(spec(tmp_path, "sized"))
    try:
        root = domain_of(made)
        memory = root.find("memory")
        scale = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[memory.get("unit", "KiB")]
        assert int(memory.text) * scale == 1536
        assert root.findtext("vcpu") == "3"
    finally:
        made.destroy()
    defaults = VmdConfig.load(env={})
    assert (defaults.guest_memory_mib, defaults.guest_vcpus) == (2048, 2)
    assert VmdConfig.load(env={"VMD_GUEST_MEMORY_MIB": "4096"}).guest_memory_mib == 4096
    with pytest.raises(ValueError, match="VMD_GUEST_VCPUS"):
        VmdConfig.load(env={"VMD_GUEST_VCPUS": "0"})


def test_a_slot_that_does_not_answer_within_the_configured_bound_is_given_up(image, tmp_path):
    from vmd.machines.warm_pool import WarmPool

    # 0.5 KVM seconds, x4 under TCG: the slot's guest (the test driver's: no SSH ever
    # answers) is given up after 2 s, not after the default's 300.
    config = make_config(tmp_path, images_dir=str(tmp_path / "images"), libvirt_uri=TEST_URI,
                         share_user="nobody", accel="qemu", slot_ready_s=0.5)
    pool = WarmPool(config, local_host(TEST_URI), size=1)
    started = time.monotonic()
    with pytest.raises(MachineError, match="did not answer over SSH within 2 s"):
        pool.make_slot(image)
    assert time.monotonic() - started < 15
    assert pool.ready_slots(image) == [] and not list((pool.dir / image.dir.name).iterdir())


def test_a_command_returns_the_head_and_tail_vmds_config_file_says(image, tmp_path, monkeypatch):
    from vmd.machines.machine import Machine

    monkeypatch.delenv("VMD_CONFIG", raising=False)
    (tmp_path / "vmd.toml").write_text("output_head_bytes = 1000\noutput_tail_bytes = 300\n")
    config = VmdConfig.load(tmp_path / "vmd.toml", env={}, accel="qemu")
    machine = Machine.create(image, name="bounded", workdir=tmp_path / "w", project_dir=None, uri=TEST_URI,
                             qemu_user="nobody", config=config)
    try:
        assert machine.guest.output == OutputBounds(1000, 300)
        bounds = machine.guest.output
    finally:
        machine.destroy()
    # What those bounds do to a real command's output: a guest (an SSH server on loopback)
    # prints 5000 "a" then 5000 "b".
    (tmp_path / "sshd").mkdir()
    sshd = HostileSshd(tmp_path / "sshd")

    def prints(command, channel):
        channel.sendall(b"a" * 5000 + b"b" * 5000)
        channel.send_exit_status(0)
        channel.close()

    sshd.exec_handler = prints
    try:
        guest = LinuxGuest(SshConnection("127.0.0.1", sshd.port, "agent", str(sshd.key_path)), use_runner=False)
        guest.output = bounds
        result = guest.run("yes", timeout=30)
        guest.close()
    finally:
        sshd.close()
    head, _, tail = result.stdout.partition("\n[... 8700 bytes of output cut here")
    assert head == "a" * 1000 and tail.endswith("\n" + "b" * 300), result.stdout[:200]
    assert result.truncated
