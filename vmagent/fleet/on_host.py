"""The Ray transport to a vmd: a few vmd calls on one host's own vmd, from the job service
(issue 25), behind the interface of vmagent/link/calls.py (`HostCalls`), as the socket
transport (vmagent/link/unix_socket.py `SocketCalls`) is.

With the Ray executor a job's vmd is its host's: its socket exists on that machine only.
`call_on_host(node_id, calls, timeout)` runs a short list of verb calls there through a
small Ray task pinned to that node (hard node affinity, no CPU: it must run there or not
at all), which opens the node's vmd (HostLabels: its socket label, else the node's
VMD_SOCKET, else the default) through the socket transport and answers plain dicts.

Each call answers {"result": {...}} or {"error": "<vmd's refusal>"}; a host that cannot be
reached at all (gone from Ray, its vmd away, no answer in time) raises HostUnreachable,
which `HostCalls` says as VmdUnavailable, the interface's word. Ray is imported only by
call_on_host.
"""

from __future__ import annotations

import threading

from vmagent.link import CallAnswer, SocketCalls, VmdCall, VmdUnavailable

from . import placement
from .host_labels import HostLabels

# The first task on a node starts a Ray worker process there (seconds on a busy host):
# Ray's wait is the calls' own timeout plus this.
START_GRACE_S = 30.0


class HostUnreachable(ConnectionError):
    """The host's vmd could not be asked: the node is gone, vmd is away, or no answer in time."""


def _on_node(calls: list[dict], timeout: float, stop_at_error: bool) -> list[dict] | str:
    """Runs on the host as a Ray task: the calls on its own vmd; a string when vmd is away
    (a plain value crosses Ray more plainly than our exception would)."""
    socket = HostLabels.of_this_node().vmd_socket
    try:
        answers = SocketCalls(socket)([VmdCall.model_validate(c) for c in calls], timeout, stop_at_error)
    except (VmdUnavailable, OSError) as exc:
        return f"its vmd at {socket} did not answer: {exc}"
    return [a.model_dump() for a in answers]


_task = None  # the Ray task, made once: each ray.remote() exports the function to the cluster anew
_task_lock = threading.Lock()


def pinned(node_id: str):
    """Ray's scheduling strategy for "on this node only"."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def call_on_host(node_id: str, calls: list[VmdCall], timeout: float, *, host: str | None = None,
                 ray_address: str | None = None, stop_at_error: bool = False) -> list[CallAnswer]:
    """`calls` on the vmd of Ray node `node_id` (host name `host`, for the sentences)."""
    global _task
    name = f"host {host or node_id[:12]}"
    try:
        ray = placement.connect(ray_address)
    except placement.RayMissing as exc:
        raise HostUnreachable(str(exc)) from None
    except Exception as exc:  # Ray's ConnectionError, a timeout, a bad address
        raise HostUnreachable(f"the Ray cluster did not answer ({type(exc).__name__}: {exc})") from None
    if not placement.node_alive(node_id):
        # A hard affinity to a dead node would wait or fail in Ray's words: say it plainly.
        raise HostUnreachable(f"{name} is gone from the Ray cluster")
    with _task_lock:
        if _task is None:
            _task = ray.remote(num_cpus=0, max_retries=0)(_on_node)
    ref = _task.options(scheduling_strategy=pinned(node_id)).remote(
        [c.model_dump() for c in calls], timeout, stop_at_error)
    try:
        answer = ray.get(ref, timeout=timeout + START_GRACE_S)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref)
        raise HostUnreachable(f"{name} did not answer within {timeout + START_GRACE_S:g} s") from None
    except Exception as exc:  # the node died meanwhile (Ray's own words name ids), the task failed there
        if not placement.node_alive(node_id) or isinstance(exc, placement.lost_errors()) or \
                type(exc).__name__ == "TaskUnschedulableError":
            raise HostUnreachable(f"{name} is gone from the Ray cluster") from None
        raise HostUnreachable(f"{name} could not be asked: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]}") from None
    if isinstance(answer, str):
        raise HostUnreachable(f"on {name}, {answer}")
    return [CallAnswer.model_validate(a) for a in answer]


class HostCalls:
    """The calls on the vmd of Ray node `node_id` (host name `host`, for the sentences): the
    Ray transport of vmagent/link/calls.py's interface."""

    def __init__(self, node_id: str, *, host: str | None = None, ray_address: str | None = None):
        self.node_id, self.host, self.ray_address = node_id, host, ray_address

    def __call__(self, calls: list[VmdCall], timeout: float, stop_at_error: bool = False) -> list[CallAnswer]:
        try:
            return call_on_host(self.node_id, calls, timeout, host=self.host, ray_address=self.ray_address,
                                stop_at_error=stop_at_error)
        except HostUnreachable as exc:
            raise VmdUnavailable(f"the vmd of the job's host could not be reached: {exc}") from None
