"""The vmd a job's session lives in, for the service's own calls about a finished or dead job:
closing the session of a worker that died without a report (workers.py), the refresh of a
pending push (app.py) and the project's history for /ask (ask.py).

Local executor: the service's one vmd (config.vmd_socket), as always. Ray executor: no vmd
is the service's; the job's is the vmd of the host it last ran on (DIR/host.json, written
by the shim: vmagent/service/ray_worker.py HostRecord), reached through a Ray task pinned
to that node (vmagent/fleet/on_host.py). A job that never reached a host, or whose host is
gone, raises VmdUnavailable like a vmd that is not running, so each path keeps its own
"vmd could not be reached" behaviour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from vmagent.client import VmdUnavailable
from vmagent.fleet.on_host import CallAnswer, HostUnreachable, VmdCall, run_calls

from .config import ServiceConfig
from .host_record import HostRecord  # the shim's own reader of host.json

# (calls, timeout, stop_at_error) -> one answer per call made; VmdUnavailable when the
# job's vmd cannot be asked at all.
JobVmd = Callable[[list[VmdCall], float, bool], list[CallAnswer]]


def local_vmd(vmd_socket: str | None) -> JobVmd:
    def call(calls: list[VmdCall], timeout: float, stop_at_error: bool = False) -> list[CallAnswer]:
        return run_calls(vmd_socket, calls, timeout, stop_at_error)
    return call


def job_vmd(config: ServiceConfig, job_dir: Path) -> JobVmd:
    """The calls to the vmd of the job whose folder is `job_dir`."""
    if getattr(config, "executor", "local") != "ray":
        return local_vmd(config.vmd_socket)

    def call(calls: list[VmdCall], timeout: float, stop_at_error: bool = False) -> list[CallAnswer]:
        from vmagent.fleet.on_host import call_on_host


        record = HostRecord.load(Path(job_dir))
        if not record.node_id:
            raise VmdUnavailable("the job has not run on any host of the Ray cluster, so no host's "
                                 "vmd holds its session or project")
        try:
            return call_on_host(record.node_id, calls, timeout, host=record.host,
                                ray_address=getattr(config, "ray_address", "") or None,
                                stop_at_error=stop_at_error)
        except HostUnreachable as exc:
            raise VmdUnavailable(f"the vmd of the job's host could not be reached: {exc}") from None
    return call
