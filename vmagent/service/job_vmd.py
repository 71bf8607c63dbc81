"""The vmd a job's session lives in, for the service's own calls about a finished or dead job:
closing the session of a worker that died without a report (workers.py), the refresh of a
pending push (app.py) and the project's history for /ask (ask.py).

Local executor: the service's one vmd (config.vmd_socket), as always. Ray executor: no vmd
is the service's; the job's is the vmd of the host it last ran on (DIR/host.json, written
by the shim: vmagent/service/host_record.py HostRecord), reached through a Ray task pinned
to that node. Both are a transport of one interface (vmagent/link/calls.py `VmdCalls`: the
socket's `SocketCalls`, Ray's vmagent/fleet/on_host.py `HostCalls`). A job that never
reached a host, or whose host is gone, raises VmdUnavailable like a vmd that is not
running, so each path keeps its own "vmd could not be reached" behaviour.
"""

from __future__ import annotations

from pathlib import Path

from vmagent.fleet.on_host import HostCalls
from vmagent.link import CallAnswer, SocketCalls, VmdCall, VmdCalls, VmdUnavailable

from .config import ServiceConfig
from .host_record import HostRecord  # the shim's own reader of host.json

# (calls, timeout, stop_at_error) -> one answer per call made; VmdUnavailable when the
# job's vmd cannot be asked at all.
JobVmd = VmdCalls


def local_vmd(vmd_socket: str | None) -> JobVmd:
    return SocketCalls(vmd_socket)


def job_vmd(config: ServiceConfig, job_dir: Path) -> JobVmd:
    """The calls to the vmd of the job whose folder is `job_dir`."""
    if getattr(config, "executor", "local") != "ray":
        return local_vmd(config.vmd_socket)

    def call(calls: list[VmdCall], timeout: float, stop_at_error: bool = False) -> list[CallAnswer]:
        record = HostRecord.load(Path(job_dir))
        if not record.node_id:
            raise VmdUnavailable("the job has not run on any host of the Ray cluster, so no host's "
                                 "vmd holds its session or project")
        host = HostCalls(record.node_id, host=record.host, ray_address=getattr(config, "ray_address", "") or None)
        return host(calls, timeout, stop_at_error)
    return call
