"""What the Ray executor's stand-in tests share (tests/vmagent/fleet/test_ray_executor.py,
tests/vmagent/fleet/test_ray_reach.py): two vmd hosts "a" and "b", each a real vmd with the stand-in
machines of tests/support/vmd_fakes.py, one scripted Ollama server and a real Ray cluster with a
node per host (tests/support/ray_harness.py); the real job service with the Ray executor and the
real worker on top; and where a session ran, read from each vmd's state folder."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from tests.support.loop_harness import running_vmd
from tests.support.ollama_server import start_ollama
from tests.support.service_harness import REAL_WORKER, ServiceProcess, real_worker_env, stop_workers


@contextlib.contextmanager
def stand_in_fleet(root: Path, default: Any) -> Iterator[tuple]:
    """(cluster, {host: vmd}, scripted Ollama server playing `default` for every request)."""
    from tests.support.ray_harness import ray_cluster  # needs ray: imported when a fleet is made

    with running_vmd(root / "a") as vmd_a, running_vmd(root / "b") as vmd_b, \
            start_ollama(default=default) as server, \
            ray_cluster({"a": vmd_a.socket, "b": vmd_b.socket}) as cluster:
        yield cluster, {"a": vmd_a, "b": vmd_b}, server


@contextlib.contextmanager
def ray_service(tmp_path: Path, fleet) -> Iterator[tuple]:
    """(service, an HTTP client of it) with executor ray on the fleet's cluster and no vmd of
    its own. VMAGENT_MAX_STEPS: a busy job works until the test ends it, not into the step
    cap; max_concurrent 8 (the harness sets 2): Ray's slots are the limit here."""
    cluster, _, server = fleet
    env = {**real_worker_env(server.url), "VMAGENT_EXECUTOR": "ray", "RAY_ADDRESS": cluster.address,
           "VMAGENT_MAX_STEPS": "2000"}
    # ray_node_verdict_s: the harness's nodes are found dead within 2 s (FAST_DEATH), so an
    # actor whose node lives 10 s on died alone.
    svc = ServiceProcess(tmp_path / "svc", worker_command=REAL_WORKER, env=env, max_concurrent=8,
                         ray_node_verdict_s=10).start()
    try:
        yield svc, svc.client()
    finally:
        svc.stop()
        stop_workers(svc)


def host_of(fleet, session_id: str) -> str:
    """The host whose vmd holds the session (its state folder is the proof)."""
    _, vmds, _ = fleet
    found = [name for name, vmd in vmds.items() if (vmd.config.sessions_dir / session_id).is_dir()]
    assert len(found) == 1, (session_id, found)
    return found[0]
