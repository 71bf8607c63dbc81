"""How the job service says no, one shape for every refusal, and the OpenAPI document's
account of it.

Every error answer is `ErrorBody`: `detail`, a sentence saying what was wrong and what to
do. A refused request body or parameter (422) also carries `errors`, one entry per field.
FastAPI's own answers are made to fit: HTTPException already sends {"detail": str}; its
validation error sends {"detail": [...]} and echoes each bad value, so `invalid_request`
replaces it; an unreadable body (not UTF-8) is its bare 400, given a sentence here.
The tables below are what each route answers besides its success, so that the document
at /openapi.json (and SDKs generated from it) lists every status code the service sends;
tests/vmagent/service/test_openapi_schemathesis.py holds the two to each other.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyQuery, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from vmd.contract.bounds import name_problem

from .job_api import PATTERN_HINTS, TOO_LONG_HINTS


class FieldProblem(BaseModel):
    """One refused field: where it is (`["body", "task"]`, `["query", "limit"]`), pydantic's
    error type, and a sentence saying what to send instead (never the value sent)."""
    loc: list[str | int]
    type: str
    msg: str


class ErrorBody(BaseModel):
    """Every refusal: `detail` says what was wrong and what to do; `errors` (422 for a
    refused body or parameter only) names each field."""
    detail: str
    errors: list[FieldProblem] | None = None


# How a caller proves who it is (the document's security schemes; auth.py checks them).
# auto_error=False: they only describe; authenticate() refuses, with its own sentences.
BEARER = HTTPBearer(scheme_name="bearer", auto_error=False, description=(
    "A user token (the service's `tokens`), or Open WebUI's service token together with the "
    "X-OpenWebUI-User-Id header naming the person."))
PREVIEW_TOKEN = APIKeyQuery(name="token", scheme_name="previewToken", auto_error=False, description=(
    "A preview link's `exp.sig` (the job's `preview_url`): opens that one job's preview, "
    "screen and events, instead of a bearer token."))


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


_UNAUTHORIZED = {"model": ErrorBody, "description": (
    "No token, an unknown token, or the service token without the user header."),
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}}}
# Every route: the gate (gate.py) refuses a declared Content-Length over max_body_bytes
# on any request before routing.
EVERY_ROUTE = {413: _error("The request body is larger than the service's max_body_bytes.")}
AUTHENTICATED = {401: _UNAUTHORIZED,
                 422: _error("A parameter does not fit its schema; `errors` names each one.")}
OPERATORS = {**AUTHENTICATED, 403: _error("The caller is not one of the service's operators (`operators`).")}
OWN_JOB = {**AUTHENTICATED, 404: _error("There is no such job for this user (another user's job too).")}
WITH_BODY = {**OWN_JOB,
             400: _error("The body is not UTF-8 text, or nests deeper than the service reads."),
             422: _error("The body or a parameter does not fit its schema; `errors` names each field.")}
WATCHED_JOB = {**OWN_JOB, 403: _error("The preview token is malformed, expired, or its job ended a while ago.")}
NOT_NOW = {409: _error("The job is not in a state that takes this (the sentence says which it is in).")}


# What a new job's id leads to (OpenAPI links: generated clients and schemathesis's
# stateful phase follow them from POST /jobs to the job's own routes).
JOB_LINKS = {name: {"operationId": name, "parameters": {"job_id": "$response.body#/id"}}
             for name in ("get_job", "events", "answer", "approve", "deny", "cancel", "ask", "screen", "preview")}


def success(media_type: str, description: str) -> dict:
    """A route's 200 that is not JSON (a page, a picture, a report). Such a route takes
    `response_class=Response`: with HTMLResponse, FastAPI would document its JSON
    refusals as text/html too."""
    return {200: {"description": description, "content": {media_type: {"schema": {
        "type": "string", **({"format": "binary"} if media_type.startswith("image/") else {})}}}}}


# One server-sent event as the events route writes it (OpenAPI 3.2's itemSchema, which
# schemathesis reads in a 3.1 document too): `id` is the event's sequence number, and
# `data` its JSON; the last one is `event: end` with {"state", "seq"}.
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string", "enum": ["message", "end"]},  # absent: "message"
    "id": {"type": "string", "pattern": "^[0-9]+$"},
    "data": {"type": "string", "contentMediaType": "application/json"}}}


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own answer echoes each bad value back ("input"); this one names the
    # field and says what to do, and sends nothing of what came in.
    problems = [(error, validation_problem(error)) for error in exc.errors()]
    return JSONResponse(status_code=422, content=ErrorBody(
        detail=" ".join(problem for _, problem in problems),
        errors=[FieldProblem(loc=[p if isinstance(p, int) else str(p) for p in error.get("loc", ())],
                             type=str(error.get("type")), msg=problem) for error, problem in problems],
    ).model_dump(exclude_none=True))


# FastAPI's sentence for a body it could not decode (json.loads on bytes that are not UTF-8).
_UNPARSED_BODY = "There was an error parsing the body"


async def refused(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail, headers = exc.detail, dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 400 and detail == _UNPARSED_BODY:
        detail = 'The body is not UTF-8 JSON; send a JSON object such as {"task": "..."} encoded as UTF-8.'
    if exc.status_code == 405:
        # Starlette's Allow names the methods of the first route on the path only:
        # `OPTIONS /jobs` answered `Allow: POST`, though GET /jobs exists too.
        allowed = set()
        for route in request.app.router.routes:
            if route.matches(request.scope)[0] != Match.NONE:
                allowed |= set(getattr(route, "methods", None) or ())
        if allowed:
            headers["Allow"] = ", ".join(sorted(allowed))
    return JSONResponse({"detail": str(detail)}, exc.status_code, headers=headers or None)


def validation_problem(error: dict) -> str:
    """One refused field as a sentence that says what to send instead."""
    kind = error.get("type", "")
    if kind == "json_invalid":
        return 'The body is not valid JSON; send a JSON object such as {"task": "..."}.'
    loc = [str(part) for part in error.get("loc", ())]
    where = loc[0] if loc else ""
    field = ".".join(loc[1:] if where in ("body", "query", "header", "path") else loc) or "the body"
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "string_too_long":
        length = f" has {len(value):,} characters," if isinstance(value, str) else " is"
        return (f"`{field}`{length} longer than the {ctx.get('max_length', 0):,} allowed; "
                f"{TOO_LONG_HINTS.get(field, 'shorten it')}.")
    if kind == "string_too_short":
        return f"`{field}` is empty; it needs at least {ctx.get('min_length', 1)} character(s)."
    if kind == "string_pattern_mismatch" and field in PATTERN_HINTS:
        # vmd's own sentence, which names the value: at most PROJECT_CHARS here, since the
        # length is checked before the pattern. It has none for a name that only our
        # stricter pattern refuses (a final newline).
        return (isinstance(value, str) and name_problem(field, value)) or f"`{field}` {PATTERN_HINTS[field]}."
    if kind == "missing":
        if field == "the body":
            return "The request has no JSON body; send a JSON object with the fields this path takes."
        return f"`{field}` is missing; send it in the {'JSON body' if where == 'body' else where}."
    return f"`{field}`: {error.get('msg', 'is not valid')}; check the API description at /docs."
