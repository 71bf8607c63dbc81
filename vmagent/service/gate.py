"""What a request passes before its body is read: a known caller, and a size cap.

FastAPI reads and parses a route's body before it resolves the route's dependencies, so
a check inside the route (or a dependency) comes too late: an unauthenticated 30 MB task
was read, parsed, and echoed back in a 422. This gate is plain ASGI in front of the
routes. For every method that carries a body it authenticates from the headers alone and
answers 401 without touching the body; for every request it refuses a declared length
over `max_body_bytes` (413) and stops a chunked body as soon as it passes that; a body
that nests deeper than JSON_MAX_DEPTH is refused (400) before FastAPI parses it.
"""

from __future__ import annotations

from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vmd.contract.json_depth import MAX_DEPTH as JSON_MAX_DEPTH, TooDeep, check as json_depth_check

from .auth import authenticate
from .config import ServiceConfig

# Methods whose requests carry no body worth reading; every other one needs a caller.
BODYLESS_METHODS = ("GET", "HEAD", "OPTIONS")


def too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"The request body is larger than this service accepts "
                              f"({limit:,} bytes, `max_body_bytes`); send a shorter one.")


def too_deep() -> HTTPException:
    return HTTPException(400, f"The body nests objects and lists deeper than {JSON_MAX_DEPTH} levels; "
                              "send a flatter one (a job's fields are strings, lists and small objects).")


class BodyGate:
    def __init__(self, app: ASGIApp, config: ServiceConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)  # headers only: its body is never asked for here
        limit = self.config.max_body_bytes
        try:
            if scope["method"] not in BODYLESS_METHODS:
                # Routes take it from here instead of authenticating again.
                scope.setdefault("state", {})["caller"] = authenticate(request, self.config)
            declared = request.headers.get("content-length", "")
            # (uvicorn refuses a Content-Length that is not a number before this runs.)
            if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
                raise too_large(limit)
        except HTTPException as refusal:
            await JSONResponse({"detail": refusal.detail}, refusal.status_code,
                               headers=refusal.headers)(scope, receive, send)
            return

        body = bytearray()

        async def capped_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if len(body) > limit:
                    # FastAPI passes an HTTPException from reading the body on as it is.
                    raise too_large(limit)
                if not message.get("more_body", False):
                    # Measured before FastAPI's json.loads sees it (vmd/contract/json_depth.py says why).
                    try:
                        json_depth_check(bytes(body), JSON_MAX_DEPTH)
                    except TooDeep:
                        raise too_deep() from None
            return message

        await self.app(scope, capped_receive, send)
