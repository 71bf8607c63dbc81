"""GET /hosts: the vmd hosts this service places jobs on (vmagent/fleet/hosts.py), for any
caller with a token, as the other read routes. By the service's executor: its one vmd
(local) or the Ray cluster's vmd hosts (ray). A host that does not answer is listed with
its error; only a cluster that cannot be reached at all is a refusal (503)."""

from __future__ import annotations

from typing import Callable

from fastapi import FastAPI, HTTPException, Request, Security

from vmagent.fleet import hosts as fleet_hosts

from .config import ServiceConfig
from .refusals import AUTHENTICATED, BEARER, ErrorBody

UNLISTED = {503: {"model": ErrorBody, "description": (
    "The hosts cannot be listed: the Ray cluster does not answer, or Ray is not installed.")}}


def add_host_routes(app: FastAPI, config: ServiceConfig, caller_of: Callable[[Request], object]) -> None:
    bearer = [Security(BEARER)]  # documents the scheme; caller_of() checks it

    @app.get("/hosts", response_model=fleet_hosts.HostList, dependencies=bearer,
             responses={401: AUTHENTICATED[401], **UNLISTED})
    def list_hosts(request: Request) -> dict:
        caller_of(request)
        try:
            return fleet_hosts.list_hosts(config).model_dump()
        except fleet_hosts.HostsUnavailable as exc:
            sentence = str(exc).rstrip(".")
            raise HTTPException(503, f"{sentence}.") from None
