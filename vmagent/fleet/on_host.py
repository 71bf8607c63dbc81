"""A few vmd calls on one host's own vmd, from the job service (issue 25).

With the Ray executor a job's vmd is its host's: its socket exists on that machine only.
`call_on_host(node_id, calls, timeout)` runs a short list of verb calls there through a
small Ray task pinned to that node (hard node affinity, no CPU: it must run there or not
at all), which opens the node's vmd (HostLabels: its socket label, else the node's
VMD_SOCKET, else the default) and answers plain dicts. `run_calls` is the same list on a
socket of this machine: the local executor's path, so both read alike.

Each call answers {"result": {...}} or {"error": "<vmd's refusal>"}; a host that cannot be
reached at all (gone from Ray, its vmd away, no answer in time) raises HostUnreachable.
Ray is imported only by call_on_host.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel

from vmagent.client import Vmd, VmdError, VmdUnavailable

# The first task on a node starts a Ray worker process there (seconds on a busy host):
# Ray's wait is the calls' own timeout plus this.
START_GRACE_S = 30.0


class VmdCall(BaseModel):
    verb: str
    params: dict[str, Any] = {}


class CallAnswer(BaseModel):
    result: dict[str, Any] | None = None
    error: str | None = None  # vmd refused the call (VmdError)


class HostUnreachable(ConnectionError):
    """The host's vmd could not be asked: the node is gone, vmd is away, or no answer in time."""


def run_calls(vmd_socket: str | None, calls: list[VmdCall], timeout: float,
              stop_at_error: bool = False) -> list[CallAnswer]:
    """`calls` in order on one connection to the vmd at `vmd_socket`. A refusal is that
    call's error (and, with stop_at_error, the last call made); vmd away raises VmdUnavailable."""
    answers: list[CallAnswer] = []
    with Vmd(vmd_socket, timeout=timeout) as vmd:
        for call in calls:
            try:
                result = vmd.call(call.verb, **call.params)
            except VmdError as exc:
                answers.append(CallAnswer(error=str(exc)))
                if stop_at_error:
                    break
                continue
            answers.append(CallAnswer(result=result.model_dump() if isinstance(result, BaseModel) else
                                      {"value": result}))
    return answers


def _on_node(calls: list[dict], timeout: float, stop_at_error: bool) -> list[dict] | str:
    """Runs on the host as a Ray task: the calls on its own vmd; a string when vmd is away
    (a plain value crosses Ray more plainly than our exception would)."""
    from .host_labels import HostLabels

    socket = HostLabels.of_this_node().vmd_socket
    try:
        answers = run_calls(socket, [VmdCall.model_validate(c) for c in calls], timeout, stop_at_error)
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
    from . import placement

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
