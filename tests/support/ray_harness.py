"""A real Ray cluster on this machine for tests: `ray.cluster_utils.Cluster` on 127.0.0.1.

    with ray_cluster({"a": vmd_a.socket, "b": vmd_b.socket}) as cluster:
        cluster.address            # what RAY_ADDRESS (or ray.init(address=...)) takes
        cluster.hosts["a"].node_id # Ray's node id (hex) of host "a"
        cluster.remove_host("a")   # host "a" dies: its raylet and workers are killed
        cluster.add_host("c", socket)

Every process of the cluster runs with token authentication (RAY_AUTH_MODE and the token's
path, set for the whole test session by tests/conftest.py before Ray is imported), as
`vmagent ray-node` starts a real one.

The head offers no `vm_slot` (as in a deployment, where the head is the service's machine
and runs no guests). Each host is a node with {"vm_slot": 1, "os_linux": 1} (or the
resources given) and the labels vmagent reads on a host (vmagent/fleet/host_labels.py):
its name and its vmd's socket. Every node listens on 127.0.0.1 only; Ray otherwise picks
the machine's public address. Each cluster keeps its files in its own short temp folder,
so clusters of several test runs on one machine do not share /tmp/ray's session links.

ray_cluster() tells Ray to keep a loopback address (vmagent/fleet/placement.py
keep_loopback) before Ray is imported, so a test may also ray.init(address=cluster.address)
itself (Ray must not have been imported earlier in that process for this to hold).

Node death is noticed fast here (GCS health checks every 0.5 s, 3 misses): a test that
removes a host waits seconds, not the default half minute.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator

from vmagent.fleet.host_labels import HOST_LABEL, SLOT_RESOURCE, VMD_SOCKET_LABEL, os_resource

# GCS's node health checks, fast enough for a test to see a removed host die in seconds.
FAST_DEATH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
              "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}


def host_resources(slots: int = 1, family: str = "linux") -> dict[str, float]:
    """What a vmd host offers Ray: its guest slots and the OS family its images are."""
    return {SLOT_RESOURCE: float(slots), os_resource(family): float(slots)}


@dataclass
class RayHost:
    name: str
    vmd_socket: str
    node: Any  # ray._private.node.Node
    node_id: str


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    temp_dir: str
    hosts: dict[str, RayHost] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_host(self, name: str, vmd_socket: str, resources: dict[str, float] | None = None,
                 num_cpus: int = 1, env: dict[str, str] | None = None) -> RayHost:
        """A node for vmd host `name`; it is alive in Ray when this returns. `env`: set in
        the node's environment (its raylet and workers inherit it), as in `ray start`'s on a
        host (PYTHONPATH: what that host has installed)."""
        before = {key: os.environ.get(key) for key in env or {}}
        os.environ.update(env or {})
        try:
            node = self.cluster.add_node(
                num_cpus=num_cpus, node_ip_address="127.0.0.1",
                resources=host_resources() if resources is None else resources,
                labels={HOST_LABEL: name, VMD_SOCKET_LABEL: str(vmd_socket)})
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        host = RayHost(name, str(vmd_socket), node, node.node_id)
        self.hosts[name] = host
        return host

    def remove_host(self, name: str, graceful: bool = False) -> None:
        """Kills host `name`'s node (raylet, workers, actors): a host lost. Not graceful by
        default: a lost machine says no goodbye."""
        host = self.hosts.pop(name)
        self.cluster.remove_node(host.node, allow_graceful=graceful)

    def shutdown(self) -> None:
        import ray

        try:
            if ray.is_initialized():  # a test that connected: Ray refuses to remove its node
                ray.shutdown()
            self.cluster.shutdown()
        finally:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


@contextlib.contextmanager
def ray_cluster(hosts: dict[str, str], head_cpus: int = 1) -> Iterator[RayCluster]:
    """A head (no vm_slot) and one node per entry of `hosts` (name -> vmd socket)."""
    from vmagent.fleet.placement import keep_loopback

    keep_loopback("127.0.0.1:0")  # before Ray is imported: a driver here stays on loopback
    from ray.cluster_utils import Cluster

    # Short: Ray's Unix sockets live under it, and a socket's path has ~107 bytes at most.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # Cluster writes the head's address to ray_current_cluster in Ray's default temp folder
    # (ray._common.utils.get_ray_address_file: $RAY_TMPDIR/ray, else /tmp/ray), whatever the
    # head's temp_dir, and fails where that folder does not exist: on a new machine every
    # cluster failed so. It goes into this cluster's own folder instead, with the rest.
    os.makedirs(os.path.join(temp_dir, "ray"))
    ray_tmpdir_before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir
    try:
        cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args={
            "num_cpus": head_cpus, "node_ip_address": "127.0.0.1", "temp_dir": temp_dir,
            "include_dashboard": False, "_system_config": FAST_DEATH})
        handle = RayCluster(cluster, temp_dir)
        try:
            for name, socket in hosts.items():
                handle.add_host(name, socket)
            yield handle
        finally:
            handle.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)  # also when the head never came up
        if ray_tmpdir_before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = ray_tmpdir_before
