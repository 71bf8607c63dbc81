"""The job service's HTTP API (FastAPI): jobs, their live events, answers, cancel, preview.

    POST /jobs                       start a job (owner = the authenticated user); from Open
                                     WebUI, refused (409) while the chat has a job unfinished
    GET  /jobs?chat_id=              the caller's jobs, newest first (re-attach from a chat)
    GET  /jobs/{id}                  one job
    GET  /jobs/{id}/events           server-sent events (bearer or preview token)
    POST /jobs/{id}/answer           answer the agent's question; resumes the same guest
    POST /jobs/{id}/approve | /deny  decide a request_unfreeze
    POST /jobs/{id}/cancel           SIGTERM, then SIGKILL after the grace period
    POST /jobs/{id}/ask              a question about the job, answered from its record
    GET  /jobs/{id}/screen.png       the newest screenshot (bearer or preview token)
    GET  /jobs/{id}/preview?token=   the live preview page
    GET  /hosts                      the vmd hosts jobs run on (hosts_route.py)
Another user's job answers 404, the same as a job that does not exist. A request with a
body is authenticated before its body is read (gate.py); every body field has a length
limit, and a refusal says which field and what to do, without echoing what was sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI, Header, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from vmd.contract.bounds import name_problem

from .ask import answer_question
from .auth import Caller, authenticate, preview_token_valid, redact_access_log, require_operator, sign_preview
from .config import ServiceConfig
from .eval_pages import add_eval_routes
from .gate import BodyGate
from .hosts_route import add_host_routes
from .job_api import (ID_CHARS, AnswerBody, AskBody, AskView, DecisionBody, Health, JobCreate, JobList,
                      JobView, MachineView, PushView, VerificationView)
from .job_vmd import job_vmd
from .preview import render_preview
from .private_files import private_dir
from .refusals import (AUTHENTICATED, BEARER, EVERY_ROUTE, JOB_LINKS, NOT_NOW, OWN_JOB, PREVIEW_TOKEN,
                       SSE_EVENT, WATCHED_JOB, WITH_BODY, invalid_request, refused, success)
from .store import FINAL_STATES, RESTING_STATES, Store
from .workers import WorkerPool, push_status

# How often the service asks vmd about a push it still retries (per job): a watcher polls
# the job every second or two, and vmd's retries are minutes apart.
PUSH_CHECK_S = 15.0

# A job that holds its Open WebUI chat: one that runs, waits in the queue, or waits for a person.
UNFINISHED_STATES = ("queued", "running", "needs_input", "needs_approval")

# An idle event stream sends a comment this often so proxies keep it open.
KEEPALIVE_S = 15.0
# Event sequence numbers fit SQLite's integer; a larger `after` asks for nothing real.
MAX_SEQ = 2**62

class EventHub:
    """Wakes the event streams of a job when its worker reader stores an event (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)

    def subscribe(self, job_id: str) -> tuple[asyncio.AbstractEventLoop, asyncio.Event]:
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._subscribers[job_id].add(entry)
        return entry

    def unsubscribe(self, job_id: str, entry) -> None:
        with self._lock:
            self._subscribers[job_id].discard(entry)
            if not self._subscribers[job_id]:
                del self._subscribers[job_id]

    def notify(self, job_id: str, seq: int) -> None:
        with self._lock:
            entries = list(self._subscribers.get(job_id, ()))
        for loop, event in entries:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed
                pass


def create_app(config: ServiceConfig) -> FastAPI:
    # 0700 and its files 0600 (private_files.py): the database holds every preview secret.
    if config.executor == "ray":
        # The service's own Ray calls (GET /hosts, a job's vmd on its host) with token auth,
        # set before Ray is first imported here (vmagent/fleet/cluster_auth.py).
        os.environ.update(config.ray_auth_env())
    store = Store(private_dir(config.data_dir))
    hub = EventHub()
    store.listeners.append(hub.notify)
    pool = WorkerPool(store, config)
    # Held from "does this chat have an unfinished job" to the new job's row, so that two
    # calls in one chat at once (a model may call a tool twice in one turn) start one job.
    chat_lock = threading.Lock()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await run_in_threadpool(pool.start)
        yield
        pool.close()

    # The document at /openapi.json lists every answer of every route (refusals.py); each
    # operation's id is its function's name (get_job, cancel), the names SDKs get.
    app = FastAPI(title="vmagent job service", lifespan=lifespan, responses=EVERY_ROUTE,
                  generate_unique_id_function=lambda route: route.name)
    app.state.config, app.state.store, app.state.pool = config, store, pool
    app.add_middleware(BodyGate, config=config)
    # Added last, so outermost: refusals from the gate carry CORS headers too.
    # Open WebUI shows the preview in a sandboxed iframe, whose origin is "null".
    app.add_middleware(CORSMiddleware, allow_origins=["null", *config.cors_origins],
                       allow_methods=["GET", "POST"],
                       allow_headers=["Authorization", "Content-Type", "Last-Event-ID"])
    redact_access_log()

    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, refused)
    bearer = [Security(BEARER)]  # documents the scheme; caller_of() checks it

    def caller_of(request: Request) -> Caller:
        # The gate authenticated every request with a body before reading it.
        caller = getattr(request.state, "caller", None)
        return caller if isinstance(caller, Caller) else authenticate(request, config)

    def operator_of(request: Request, what: str) -> Caller:
        return require_operator(caller_of(request), config, what)

    add_eval_routes(app, config.eval_runs_dir, operator_of)
    add_host_routes(app, config, operator_of)

    def own_job(job_id: str, caller: Caller) -> dict:
        job = store.get_job(job_id)
        if job is None or job["owner"] != caller.user:
            raise HTTPException(404, f"There is no job {job_id} for this user.")
        return job

    def watched_job(request: Request, job_id: str, token: str | None) -> dict:
        """The job, for its owner's bearer token or for a valid preview token of this job."""
        job = store.get_job(job_id)
        if job is not None and token and preview_token_valid(job, token, config.preview_grace_s):
            return job
        if token and not request.headers.get("authorization"):
            raise HTTPException(403, "This preview link is not valid: it is malformed, it expired, or "
                                "its job ended a while ago. The job's owner still sees its report.")
        return own_job(job_id, caller_of(request))

    def base_url(request: Request) -> str:
        return (config.public_url or str(request.base_url)).rstrip("/")

    push_checked: dict[str, float] = {}

    def push_of(job: dict) -> PushView | None:
        """The job's push as last known; a pending one is asked of vmd again (throttled),
        so the owner sees when a push retried after the job's end lands."""
        try:
            push = json.loads(job.get("push_json") or "null")
        except ValueError:
            push = None
        if not isinstance(push, dict):
            return None
        now = time.monotonic()
        if push.get("state") == "pending" and job.get("session_id") and \
                now - push_checked.get(job["id"], -PUSH_CHECK_S) >= PUSH_CHECK_S:
            push_checked[job["id"]] = now
            fresh = push_status(job_vmd(config, store.job_dir(job["id"])), job["session_id"])
            if fresh is not None and fresh != push:
                store.update_job(job["id"], push_json=json.dumps(fresh))
                push = fresh
        try:
            return PushView.model_validate(push)
        except ValueError:
            return None

    def view(job: dict, request: Request) -> dict:
        token = sign_preview(job, config.preview_ttl_s)
        return JobView(
            **{k: job[k] for k in ("id", "owner", "chat_id", "message_id", "task", "os", "project",
                                   "model", "state", "question", "report", "session_id", "steps",
                                   "status_line", "created", "updated")},
            web=bool(job.get("web", 1)), turns=job["steps"], tool_calls=job.get("tool_calls") or 0,
            verification_passed=_flag(job["verification_passed"]),
            verification=VerificationView(passed=_flag(job["verification_passed"]),
                                          proven=_flag(job["verification_proven"]),
                                          attempts=job["verification_attempts"] or 0),
            push=push_of(job),
            machine=MachineView(came=job["machine_came"], seconds=job["machine_seconds"])
            if job.get("machine_came") else None,
            tasks=job["tasks_text"], preview_ready=bool(job["preview_ready"]),
            preview_url=f"{base_url(request)}/jobs/{job['id']}/preview?token={token}",
        ).model_dump()

    @app.get("/healthz", response_model=Health)
    def healthz() -> dict:
        return {"ok": True, "running": pool.running_count()}

    @app.post("/jobs", status_code=201, response_model=JobView, dependencies=bearer,
              responses={**WITH_BODY, 201: {"description": "The job, queued.", "links": JOB_LINKS},
                         409: NOT_NOW[409] | {"description": (
                             "From Open WebUI: this chat already has an unfinished job; the sentence names it.")}})
    def create_job(body: JobCreate, request: Request) -> dict:
        caller = caller_of(request)
        project = body.project or None
        # vmd refuses these at session_open; here the person hears it at once, and /ask can
        # trust that a job's owner and project name exactly one of vmd's repositories.
        problem = name_problem("project", project) if project else None
        if problem is None and (owner_problem := name_problem("owner", caller.user)):
            problem = (f"{owner_problem} A job's owner is the user its token names; ask the "
                       "service's administrator for a user name that fits.")
        if problem:
            raise HTTPException(422, problem)
        with chat_lock:
            if caller.via_service and body.chat_id:
                refuse_second_job(caller, body.chat_id)
            job = store.create_job(owner=caller.user, task=body.task, os=body.os, project=project,
                                   chat_id=body.chat_id, message_id=body.message_id, model=body.model,
                                   web=body.web)
        # The answer describes the job as created (the store's read, before any pump could
        # start it): read later, a fast worker may already have finished it (a test saw its
        # verification filled in the 201).
        pool.submit(job)
        return view(job, request)

    def refuse_second_job(caller: Caller, chat_id: str) -> None:
        """An Open WebUI chat runs one job at a time: a new task there while another is
        unfinished would leave the chat following the other job (or two machines on one
        conversation), so it is refused with the job that holds the chat."""
        unfinished = store.list_jobs(owner=caller.user, chat_id=chat_id, states=UNFINISHED_STATES, limit=1)
        if unfinished:
            holder = unfinished[0]
            raise HTTPException(409, (
                f"This chat already has an unfinished job, {holder['id']} ({holder['task'][:200]!r}, "
                f"{holder['state']}); a chat runs one job at a time. Follow it (GET /jobs/{holder['id']}), "
                f"answer it, or cancel it (POST /jobs/{holder['id']}/cancel) before starting another."))

    @app.get("/jobs", response_model=JobList, dependencies=bearer, responses=AUTHENTICATED)
    def list_jobs(request: Request, chat_id: str | None = Query(None, max_length=ID_CHARS),
                  state: str | None = Query(None, max_length=200),
                  limit: int = Query(50, ge=1, le=500)) -> dict:
        caller = caller_of(request)
        states = tuple(s for s in (state or "").split(",") if s) or None
        jobs = store.list_jobs(owner=caller.user, chat_id=chat_id, states=states, limit=limit)
        return {"jobs": [view(j, request) for j in jobs]}

    @app.get("/jobs/{job_id}", response_model=JobView, dependencies=bearer, responses=OWN_JOB)
    def get_job(job_id: str, request: Request) -> dict:
        return view(own_job(job_id, caller_of(request)), request)

    @app.post("/jobs/{job_id}/answer", response_model=JobView, dependencies=bearer,
              responses={**WITH_BODY, **NOT_NOW})
    def answer(job_id: str, body: AnswerBody, request: Request) -> dict:
        job = own_job(job_id, caller_of(request))
        if job["state"] == "needs_approval":
            raise HTTPException(409, "This job waits for approval, not an answer: "
                                "POST /approve or /deny.")
        if job["state"] != "needs_input":
            raise HTTPException(409, f"This job is {job['state']} and asks nothing now.")
        store.add_event(job_id, {"type": "answer", "text": body.answer})
        pool.submit(job, resume=True, answer=body.answer)
        return view(store.get_job(job_id), request)

    def decide(job_id: str, approved: bool, reason: str, request: Request) -> dict:
        job = own_job(job_id, caller_of(request))
        if job["state"] != "needs_approval":
            raise HTTPException(409, f"This job is {job['state']} and waits for no approval.")
        store.add_event(job_id, {"type": "decision", "approved": approved, "text": reason})
        pool.submit(job, resume=True, approved=approved, answer=reason or None)
        return view(store.get_job(job_id), request)

    @app.post("/jobs/{job_id}/approve", response_model=JobView, dependencies=bearer,
              responses={**WITH_BODY, **NOT_NOW})
    def approve(job_id: str, request: Request, body: DecisionBody | None = None) -> dict:
        return decide(job_id, True, body.reason if body else "", request)

    @app.post("/jobs/{job_id}/deny", response_model=JobView, dependencies=bearer,
              responses={**WITH_BODY, **NOT_NOW})
    def deny(job_id: str, request: Request, body: DecisionBody | None = None) -> dict:
        return decide(job_id, False, body.reason if body else "", request)

    @app.post("/jobs/{job_id}/cancel", response_model=JobView, dependencies=bearer,
              responses={**OWN_JOB, **NOT_NOW})
    def cancel(job_id: str, request: Request) -> dict:
        job = own_job(job_id, caller_of(request))
        if job["state"] in FINAL_STATES:
            raise HTTPException(409, f"This job is already {job['state']}.")
        pool.cancel(job_id)
        return view(store.get_job(job_id), request)

    # Documented, not filtered through AskView: ask.py's answer goes out as it comes.
    @app.post("/jobs/{job_id}/ask", dependencies=bearer,
              responses={**WITH_BODY, 200: {"model": AskView, "description": "The answer."}})
    def ask(job_id: str, body: AskBody, request: Request) -> dict:
        job = own_job(job_id, caller_of(request))
        return {"job_id": job_id, "state": job["state"],
                **answer_question(store, job, body.question, config)}

    @app.get("/jobs/{job_id}/screen.png", response_class=Response, dependencies=bearer, responses={
        **WATCHED_JOB, 404: WATCHED_JOB[404] | {"description": "No such job for this user, or no screenshot yet."},
        **success("image/png", "The newest screenshot.")})
    def screen(job_id: str, request: Request, token: str | None = Security(PREVIEW_TOKEN)):
        job = watched_job(request, job_id, token)
        path = store.job_dir(job["id"]) / "screen.png"
        if not path.exists():
            raise HTTPException(404, "This job has no screenshot yet.")
        return FileResponse(path, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/jobs/{job_id}/preview", response_class=Response, dependencies=bearer,
             responses={**WATCHED_JOB, **success("text/html", "The live preview page.")})
    def preview(job_id: str, request: Request, token: str | None = Security(PREVIEW_TOKEN)):
        job = watched_job(request, job_id, token)
        if not token or not preview_token_valid(job, token, config.preview_grace_s):
            token = sign_preview(job, config.preview_ttl_s)
        return HTMLResponse(render_preview(job, token), headers={
            "Cache-Control": "no-store", "Content-Disposition": "inline"})

    @app.get("/jobs/{job_id}/events", response_class=StreamingResponse, dependencies=bearer, responses={
        **WATCHED_JOB, 200: {"description": "Server-sent events: `id: seq` and `data: <event JSON>` each, "
                                            "then `event: end` once the job rests (or at once with follow=false).",
                             "content": {"text/event-stream": {"itemSchema": SSE_EVENT}}}})
    async def events(job_id: str, request: Request, token: str | None = Security(PREVIEW_TOKEN),
                     after: int = Query(0, ge=0, le=MAX_SEQ), follow: bool = True,
                     last_event_id: str | None = Header(None)):
        job = await run_in_threadpool(watched_job, request, job_id, token)
        # A browser sends back the id it saw; anything else ('²', 5,000 digits) is ignored.
        if last_event_id and last_event_id.isascii() and last_event_id.isdigit() and len(last_event_id) < 19:
            after = max(after, int(last_event_id))
        return StreamingResponse(
            _event_stream(request, job["id"], after, follow),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _event_stream(request: Request, job_id: str, after: int, follow: bool) -> AsyncIterator[str]:
        entry = hub.subscribe(job_id)
        _, wake = entry
        try:
            while True:
                wake.clear()
                batch = await run_in_threadpool(store.events, job_id, after, 500)
                for seq, event in batch:
                    yield f"id: {seq}\ndata: {json.dumps(event)}\n\n"
                    after = seq
                if batch:
                    continue
                job = await run_in_threadpool(store.get_job, job_id)
                if not follow or job is None or job["state"] in RESTING_STATES:
                    state = job["state"] if job else "gone"
                    yield f"event: end\ndata: {json.dumps({'state': state, 'seq': after})}\n\n"
                    return
                if await request.is_disconnected():
                    return
                try:
                    await asyncio.wait_for(wake.wait(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield ": keepalive\n\n"
        finally:
            hub.unsubscribe(job_id, entry)

    return app


def _flag(value: int | None) -> bool | None:
    return None if value is None else bool(value)
