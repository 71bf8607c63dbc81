"""The small interface every way to a vmd offers: a short list of verb calls on one vmd,
each answered plainly. Two transports implement it, one module each, as testinfra has one
backend per transport: the socket of this machine (vmagent/link/unix_socket.py
`SocketCalls`) and a Ray host's own vmd through a task pinned to that node
(vmagent/fleet/on_host.py `HostCalls`). The job service asks a job's vmd through it
(vmagent/service/job_vmd.py), whichever executor ran the job.

The turn loop needs more than a list of calls (one connection bound to its session, the
output of a running command as it comes, a vmd restart ridden out): it holds a `Vmd`
connection of its own (unix_socket.py) through a `SessionLink` (session_link.py), and its
worker always runs beside its vmd, so the socket is its only transport.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel


class VmdCall(BaseModel):
    verb: str
    params: dict[str, Any] = {}


class CallAnswer(BaseModel):
    result: dict[str, Any] | None = None  # the verb's result, as its model dumps it
    error: str | None = None  # vmd refused the call (VmdError)


class VmdCalls(Protocol):
    def __call__(self, calls: list[VmdCall], timeout: float, stop_at_error: bool = False) -> list[CallAnswer]:
        """`calls` in order on one vmd, within `timeout` seconds each: one answer per call
        made; with stop_at_error, none after the first refusal. Raises VmdUnavailable
        (vmagent/link/errors.py) when that vmd cannot be asked at all."""
        ...
