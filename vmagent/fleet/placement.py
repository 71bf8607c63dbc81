"""Ray for the shim: connecting, where a job's actor may run, and whether a host still lives.

Everything here imports Ray when called, never at import time (the "ray" extra is optional).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .host_labels import job_resources

# Every Ray node carries its id as this label (Ray 2.49+): a job's actor avoids the nodes
# found unusable by it.
NODE_ID_LABEL = "ray.io/node-id"
RAY_MISSING = ("the job service's executor is \"ray\" but Ray is not installed in its Python: "
               "pip install 'vmagent[ray]' (or set executor: local)")
# Ray swaps a loopback head address for this machine's public one (and so does its driver's
# own address); a cluster started on 127.0.0.1 is then unreachable. This setting of Ray's
# keeps loopback as loopback; it only matters for a head on this machine.
LOOPBACK_SETTING = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# One JobHost answers `read` (a long poll) while `cancel` and `where` get through.
ACTOR_THREADS = 4


class RayMissing(RuntimeError):
    pass


def keep_loopback(address: str | None) -> None:
    """For a head at 127.0.0.1/localhost: tell Ray (before it is imported) to stay on loopback."""
    host = (address or "").rpartition(":")[0]
    if host in LOOPBACK_HOSTS:
        os.environ.setdefault(LOOPBACK_SETTING, "0")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayMissing(RAY_MISSING) from None
    return ray


def connect(address: str | None) -> Any:
    """ray.init to the cluster at `address` (None: RAY_ADDRESS or a local `ray start`), quiet:
    a shim's stdout is its frames and its stderr the job's worker.log."""
    keep_loopback(address)
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address or None, log_to_driver=False, logging_level=logging.ERROR,
                 configure_logging=False, include_dashboard=False)
    return ray


def job_host_class() -> Any:
    """JobHost as a Ray actor class."""
    ray = import_ray()
    from .job_host import JobHost  # the actor's code only where an actor is made: the shim

    return ray.remote(JobHost)


def actor_options(os_name: str, node_id: str | None = None, avoid: list[str] | tuple = ()) -> dict:
    """A job's actor: one guest slot of its OS family, no CPU (the slot is the limit),
    never restarted by Ray (a restart would run the job twice; the shim re-runs it, once,
    on purpose). With `node_id`: only that node (a resume needs its suspended guest).
    `avoid`: nodes found unusable (Ray's own node-id label, which every node has)."""
    options: dict[str, Any] = {"resources": job_resources(os_name), "num_cpus": 0,
                               "max_restarts": 0, "max_task_retries": 0,
                               "max_concurrency": ACTOR_THREADS}
    if node_id:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    if avoid:
        options["label_selector"] = {NODE_ID_LABEL: f"!in({','.join(sorted(avoid))})"}
    return options


def alive_nodes() -> list[dict]:
    return [node for node in import_ray().nodes() if node.get("Alive")]


def node_alive(node_id: str | None) -> bool:
    return bool(node_id) and any(node.get("NodeID") == node_id for node in alive_nodes())


def offered_by_any(resources: dict[str, float], avoid: list[str] | tuple = ()) -> bool:
    """True when some live node (not in `avoid`) has every one of `resources` in its total
    (busy or not): else a job asking for them would wait for ever."""
    for node in alive_nodes():
        if node.get("NodeID") in avoid:
            continue
        total = node.get("Resources") or {}
        if all(total.get(name, 0) >= amount for name, amount in resources.items()):
            return True
    return False


def lost_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the actor (with its host) is gone."""
    from ray import exceptions

    names = ("RayActorError", "ActorUnschedulableError", "NodeDiedError", "WorkerCrashedError",
             "OwnerDiedError", "ObjectLostError")
    return tuple(getattr(exceptions, name) for name in names if hasattr(exceptions, name))


def is_unavailable(exc: BaseException) -> bool:
    """Ray's "the actor cannot be reached just now" (its worker restarting, or the network
    between here and its node): not a verdict on the host; its node's life decides."""
    from ray import exceptions

    kind = getattr(exceptions, "ActorUnavailableError", None)
    return kind is not None and isinstance(exc, kind)


def creation_failed(exc: BaseException) -> bool:
    """The actor died in its creation task (vmagent's code on that node could not make a
    JobHost): the host is unusable, not lost."""
    return bool(getattr(exc, "actor_init_failed", False))


def why_lost(exc: BaseException) -> str:
    """One short sentence of Ray's long message: why the actor died."""
    text = str(exc)
    if "its node has died" in text or "node died" in text.lower():
        # Ray adds the node's id and its raylet's last log lines: none of it helps a reader.
        return "its Ray node died"
    for line in text.splitlines():
        line = line.strip()
        if "died because" in line or "was terminated" in line or "marked dead" in line:
            return line[:300]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:300]
