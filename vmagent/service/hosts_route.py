"""GET /hosts: the vmd hosts this service places jobs on (vmagent/fleet/hosts.py), for the
service's operators only (`operators`: a listing names every host, its load and its
errors). By the service's executor: its one vmd (local) or the Ray cluster's vmd hosts
(ray). A host that does not answer is listed with its error; only a cluster that cannot
be reached at all is a refusal (503). Each listing asks every host, so one is served
again for `hosts_cache_s`: callers polling the page cost the hosts one listing."""

from __future__ import annotations

import threading
import time
from typing import Callable

from fastapi import FastAPI, HTTPException, Request, Security

from vmagent.fleet import hosts as fleet_hosts

from .config import ServiceConfig
from .refusals import BEARER, OPERATORS, ErrorBody

UNLISTED = {503: {"model": ErrorBody, "description": (
    "The hosts cannot be listed: the Ray cluster does not answer, or Ray is not installed.")}}


def add_host_routes(app: FastAPI, config: ServiceConfig, operator_of: Callable[[Request, str], object]) -> None:
    bearer = [Security(BEARER)]  # documents the scheme; operator_of() checks it and the caller's role
    lock = threading.Lock()  # one listing at a time: callers that come meanwhile get its result
    cached: dict = {}

    @app.get("/hosts", response_model=fleet_hosts.HostList, dependencies=bearer,
             responses={401: OPERATORS[401], 403: OPERATORS[403], **UNLISTED})
    def list_hosts(request: Request) -> dict:
        operator_of(request, "GET /hosts")
        with lock:
            if cached and time.monotonic() - cached["at"] < config.hosts_cache_s:
                return cached["listing"]
            try:
                listing = fleet_hosts.list_hosts(config).model_dump()
            except fleet_hosts.HostsUnavailable as exc:
                sentence = str(exc).rstrip(".")
                raise HTTPException(503, f"{sentence}.") from None
            cached.update(at=time.monotonic(), listing=listing)
            return listing
