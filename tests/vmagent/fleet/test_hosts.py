"""Listing the hosts jobs run on (vmagent/fleet/hosts.py, vmd's host_info verb, GET /hosts,
`vmagent hosts`). Real vmd servers on their sockets (stand-in machines, tests/support/vmd_fakes.py),
an image and a warm slot laid out on disk as vmd makes them, a real Ray cluster of a head
and two vmd hosts (tests/support/ray_harness.py), and the real job service over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service_harness import ALICE, BOB, REPO, ServiceProcess
from tests.support.vmd_fakes import RpcClient, SilentVmd, local_vmd, short_socket_dir
from vmagent.fleet.host_labels import vmagent_version
from vmagent.fleet.hosts import RayHosts, local_hosts, render
from vmagent.fleet.placement import keep_loopback
from vmd.contract.results import result_problem

# The driver in this process talks to a cluster on 127.0.0.1: Ray must not swap it for the
# machine's public address (it reads this when it is first imported).
keep_loopback("127.0.0.1:6379")

MANIFEST = {"name": "debian", "os_family": "linux", "user": "agent", "project_path": "/mnt/project",
            "resolution": [1280, 800], "desktop": True}


def lay_out_image_and_slots(config, ready: int = 1) -> None:
    """A built image and its warm pool as vmd leaves them: <images>/<name>-<hash>/manifest.json,
    <state>/warm/<image dir>/<slot>/slot.json, and a slot still being made (not ready)."""
    image = config.images_dir / "debian-0123456789abcdef"
    image.mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps(MANIFEST))
    pool = config.state_dir / "warm" / image.name
    for n in range(ready):
        (pool / f"slot{n}").mkdir(parents=True)
        (pool / f"slot{n}" / "slot.json").write_text("{}")
    (pool / ".half.making").mkdir(parents=True)
    (pool / ".half.making" / "slot.json").write_text("{}")


@contextlib.contextmanager
def vmd_with_session(tmp_path: Path, task: str = "list me"):
    """A vmd with an image, one warm slot and one open session (its client connection held)."""
    with local_vmd(tmp_path) as (_, _, config):
        lay_out_image_and_slots(config)
        with RpcClient(config.socket) as client:
            client.call("session_open", project="hosts", task=task)
            yield config


def test_a_listing_is_served_again_for_hosts_cache_s_so_polling_asks_the_hosts_once(tmp_path):
    cached = fresh = None
    try:
        with vmd_with_session(tmp_path / "vmd") as config:
            cached = ServiceProcess(tmp_path / "cached", vmd_socket=str(config.socket), hosts_cache_s=300).start()
            fresh = ServiceProcess(tmp_path / "fresh", vmd_socket=str(config.socket), hosts_cache_s=0).start()
            first = cached.client(ALICE).get("/hosts").json()
            assert first["hosts"][0]["alive"] and fresh.client(ALICE).get("/hosts").json()["hosts"][0]["alive"]
        # vmd has stopped: the cached service answers from its listing, the other asks again.
        assert cached.client(ALICE).get("/hosts").json() == first
        assert not fresh.client(ALICE).get("/hosts", timeout=60).json()["hosts"][0]["alive"]
    finally:
        for svc in (cached, fresh):
            if svc is not None:
                svc.stop()


# --- vmd's host_info ------------------------------------------------------------------

def test_host_info_tells_sessions_warm_guests_images_and_capacity_on_a_connection_without_a_session(tmp_path):
    with vmd_with_session(tmp_path) as config:
        with RpcClient(config.socket) as fresh:  # bound to no session
            info = fresh.call("host_info")
            assert result_problem("host_info", info) is None
            assert info["sessions"] == 1 and sum(info["states"].values()) == 1
            assert set(info["states"]) <= {"booting", "ready"}
            assert info["warm_slots"] == 1  # the slot being made is not ready
            assert info["images"] == [{"name": "debian", "os_family": "linux", "warm_slots": 1}]
            assert info["cpus"] >= 1 and info["memory_mib"] > 0 and info["guest_memory_mib"] == config.guest_memory_mib
            assert "1 session(s) open" in info["text"] and "debian (linux)" in info["text"]
        with RpcClient(config.socket) as closer:
            sid = next(p.name for p in config.sessions_dir.iterdir())
            closer.call("session_attach", session_id=sid)
            closer.call("session_close")
            assert closer.call("host_info")["sessions"] == 0


def test_a_parked_warm_guest_counts_as_ready_once_it_is_paused(tmp_path):
    # vmd/machines/parked_slot.py: <id>.parked gets parked.json when its guest is paused.
    with local_vmd(tmp_path) as (_, _, config):
        lay_out_image_and_slots(config)
        pool = config.state_dir / "warm" / "debian-0123456789abcdef"
        (pool / "p1.parked").mkdir()
        (pool / "p1.parked" / "parked.json").write_text("{}")
        (pool / "p2.parked").mkdir()  # still being restored and woken
        with RpcClient(config.socket) as c:
            info = c.call("host_info")
    assert info["warm_slots"] == 2, info
    assert info["images"] == [{"name": "debian", "os_family": "linux", "warm_slots": 2}]


def test_host_info_of_a_vmd_with_no_images_and_no_pool_says_so(tmp_path):
    with local_vmd(tmp_path) as (_, _, config):
        with RpcClient(config.socket) as c:
            info = c.call("host_info")
    assert info["images"] == [] and info["warm_slots"] == 0 and info["sessions"] == 0
    assert "images: none built" in info["text"]


# --- the local executor's one host -------------------------------------------------------

def test_the_local_lister_shows_the_services_vmd_with_its_session_in_a_slot(tmp_path):
    with vmd_with_session(tmp_path) as config:
        [host] = local_hosts(str(config.socket), slots_total=2)
    assert host.name == "local" and host.alive and host.error is None
    assert (host.slots_total, host.slots_used, host.slots_free) == (2, 1, 1)
    assert host.sessions == 1 and host.warm_slots == 1 and host.images == ["linux"]
    assert host.last_seen is not None and abs(time.time() - host.last_seen) < 30


def test_the_local_lister_names_a_vmd_that_does_not_answer_without_waiting(tmp_path):
    missing = short_socket_dir() / "vmd.sock"
    started = time.monotonic()
    [host] = local_hosts(str(missing), slots_total=2)
    assert time.monotonic() - started < 5
    assert not host.alive and host.sessions is None and str(missing) in host.error
    assert (host.slots_used, host.slots_free) == (0, 2)


# --- the job service: GET /hosts and `vmagent hosts` ----------------------------------------

def test_get_hosts_lists_the_local_vmd_for_an_operator_only(tmp_path):
    with vmd_with_session(tmp_path / "vmd") as config:
        svc = ServiceProcess(tmp_path / "svc", vmd_socket=str(config.socket)).start()
        try:
            assert httpx.get(svc.url + "/hosts", timeout=15).status_code == 401
            refused = svc.client(BOB).get("/hosts")  # a user with a token, not an operator
            assert refused.status_code == 403 and "operators" in refused.json()["detail"]
            reply = svc.client(ALICE).get("/hosts")
            assert reply.status_code == 200, reply.text
            listing = reply.json()
            assert listing["executor"] == "local"
            [host] = listing["hosts"]
            assert host["name"] == "local" and host["alive"] and host["sessions"] == 1
            assert (host["slots_total"], host["slots_used"]) == (2, 1)
            document = httpx.get(svc.url + "/openapi.json", timeout=15).json()
            operation = document["paths"]["/hosts"]["get"]
            assert {"200", "401", "403", "503"} <= set(operation["responses"]) and operation["operationId"] == "list_hosts"

            cli = subprocess.run([sys.executable, "-m", "vmagent.cli", "hosts", "--config",
                                  str(svc.data_dir / "service.json")], cwd=REPO, capture_output=True, text=True,
                                 timeout=60, env=_env_without_settings())
            assert cli.returncode == 0, cli.stderr
            header, row = cli.stdout.splitlines()[1:3]
            assert header.split()[:3] == ["HOST", "ALIVE", "USABLE"]
            assert row.split()[:6] == ["local", "yes", "yes", "1/2", "1", "1"]
        finally:
            svc.stop()


def test_vmagent_hosts_says_what_to_do_when_the_settings_do_not_load(tmp_path):
    bad = tmp_path / "service.json"
    bad.write_text(json.dumps({"max_concurrent": 0}))
    cli = subprocess.run([sys.executable, "-m", "vmagent.cli", "hosts", "--config", str(bad)], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env=_env_without_settings())
    assert cli.returncode == 2 and "vmagent hosts:" in cli.stderr and "max_concurrent" in cli.stderr


def _env_without_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "VMD_", "RAY_ADDRESS"))}


# --- the Ray executor: a head and two vmd hosts ----------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two vmd hosts, a and b, each a real vmd with one image; a session open on b."""
    ray_harness = pytest.importorskip("tests.support.ray_harness")
    import ray

    with contextlib.ExitStack() as stack:
        config_a = stack.enter_context(local_vmd(tmp_path_factory.mktemp("vmd-a")))[2]
        config_b = stack.enter_context(local_vmd(tmp_path_factory.mktemp("vmd-b")))[2]
        for config in (config_a, config_b):
            lay_out_image_and_slots(config, ready=0)
        client_b = stack.enter_context(RpcClient(config_b.socket))
        client_b.call("session_open", project="on-b", task="hold a guest on b")
        cluster = stack.enter_context(ray_harness.ray_cluster({"a": str(config_a.socket), "b": str(config_b.socket)}))
        stack.callback(ray.shutdown)
        yield cluster


def by_name(hosts) -> dict:
    return {h.name: h for h in hosts}


@pytest.mark.ray
def test_ray_lists_each_vmd_host_with_its_slots_and_its_own_vmds_sessions(fleet):
    import ray

    lister = RayHosts(fleet.address, wait_s=20)
    listing = lister.listing()
    hosts = by_name(listing.hosts)
    assert set(hosts) == {"a", "b"}  # the head offers no guest slots and is no host
    for name in ("a", "b"):
        host = hosts[name]
        assert host.alive and host.error is None and host.node_id == fleet.hosts[name].node_id
        assert (host.slots_total, host.slots_used, host.slots_free) == (1, 0, 1)
        assert host.images == ["linux"] and host.warm_slots == 0 and host.last_seen is not None
        # Each host's own word on its vmagent and its Ray node's auth; the same version: usable.
        assert (host.vmagent_version, host.ray_auth, host.usable) == (vmagent_version(), "token", True)
    # The cluster turns away a driver without the token (tests/conftest.py runs every test
    # cluster with token auth, as ray_node does a real one).
    assert (listing.cluster_auth, listing.version) == ("token", vmagent_version())
    assert "cluster auth: token" in render(listing)
    assert (hosts["a"].sessions, hosts["b"].sessions) == (0, 1)

    # A job's hold on a slot, as the shim's JobHost actor takes it: Ray counts it on that host.
    @ray.remote(num_cpus=0, resources={"vm_slot": 1, "os_linux": 1})
    class Holder:
        def where(self):
            return ray.get_runtime_context().get_node_id()

    holder = Holder.remote()
    held_on = ray.get(holder.where.remote(), timeout=60)
    name = next(n for n, h in fleet.hosts.items() if h.node_id == held_on)
    deadline = time.monotonic() + 20
    while (host := by_name(lister.list())[name]).slots_free != 0 and time.monotonic() < deadline:
        time.sleep(0.5)  # Ray's free counts reach the GCS a moment after the placement
    assert (host.slots_used, host.slots_free) == (1, 0)
    ray.kill(holder)


@pytest.mark.ray
def test_a_host_whose_vmd_is_stuck_or_absent_is_listed_with_its_error_in_bounded_time(fleet):
    stuck = SilentVmd()
    try:
        fleet.add_host("stuck", str(stuck.path))
        fleet.add_host("novmd", str(short_socket_dir() / "nothing.sock"))
        lister = RayHosts(fleet.address, wait_s=20, vmd_wait_s=2)
        started = time.monotonic()
        hosts = by_name(lister.list())
        took = time.monotonic() - started
        assert took < 20, took  # the stuck vmd held nothing up past the wait
        assert hosts["a"].alive and hosts["a"].error is None and hosts["b"].sessions == 1
        assert hosts["stuck"].alive and hosts["stuck"].sessions is None and "timed out" in hosts["stuck"].error
        assert hosts["novmd"].sessions is None and "nothing.sock" in hosts["novmd"].error
        # Both listed unusable, with the reason; the hosts whose vmd answers are usable.
        for name in ("stuck", "novmd"):
            assert not hosts[name].usable and hosts[name].problem == hosts[name].error
        assert hosts["a"].usable and hosts["b"].usable
    finally:
        for name in ("stuck", "novmd"):
            if name in fleet.hosts:
                fleet.remove_host(name, graceful=True)
        stuck.close()


@pytest.mark.ray
def test_get_hosts_through_a_ray_service_and_a_lost_host(fleet, tmp_path):
    # Every listing fresh (no hosts_cache_s): this test watches a host die through the service.
    svc = ServiceProcess(tmp_path / "svc", executor="ray", ray_address=fleet.address, hosts_cache_s=0).start()
    try:
        listing = svc.client(ALICE).get("/hosts", timeout=60).json()
        assert listing["executor"] == "ray"
        alive = {h["name"]: h["sessions"] for h in listing["hosts"] if h["alive"]}
        assert alive.items() >= {"a": 0, "b": 1}.items(), listing

        lister = RayHosts(fleet.address, wait_s=20)
        assert by_name(lister.list())["b"].alive
        node_b = fleet.hosts["b"].node_id
        fleet.remove_host("b")  # the host dies
        deadline = time.monotonic() + 30
        while True:
            started = time.monotonic()
            hosts = by_name(lister.list())
            assert time.monotonic() - started < 20  # a dead node never holds the listing up
            b = hosts.get("b")
            if b is None or not b.alive or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert b is None or (not b.alive and b.node_id == node_b and b.error and b.slots_free == 0)
        assert b is None or b.last_seen is not None  # when its vmd last answered, kept
        assert hosts["a"].alive and hosts["a"].sessions == 0
        through_service = svc.client(ALICE).get("/hosts", timeout=60).json()["hosts"]
        assert [h["name"] for h in through_service if h["alive"]] == ["a"]
    finally:
        svc.stop()
