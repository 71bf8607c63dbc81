"""The job service's HTTP API (FastAPI): jobs, their live events, answers, cancel, preview.

    POST /jobs                       start a job (owner = the authenticated user)
    GET  /jobs?chat_id=              the caller's jobs, newest first (re-attach from a chat)
    GET  /jobs/{id}                  one job
    GET  /jobs/{id}/events           server-sent events (bearer or preview token)
    POST /jobs/{id}/answer           answer the agent's question; resumes the same guest
    POST /jobs/{id}/approve | /deny  decide a request_unfreeze
    POST /jobs/{id}/cancel           SIGTERM, then SIGKILL after the grace period
    POST /jobs/{id}/ask              a question about the job, answered from its record
    GET  /jobs/{id}/screen.png       the newest screenshot (bearer or preview token)
    GET  /jobs/{id}/preview?token=   the live preview page
Another user's job answers 404, the same as a job that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, HTMLResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .ask import answer_question
from .auth import Caller, authenticate, preview_token_valid, sign_preview
from .config import ServiceConfig
from .preview import render_preview
from .store import FINAL_STATES, RESTING_STATES, Store
from .workers import WorkerPool

# An idle event stream sends a comment this often so proxies keep it open.
KEEPALIVE_S = 15.0


class JobCreate(BaseModel):
    task: str = Field(min_length=1, max_length=20000)
    os: str = "debian"
    project: str | None = None
    chat_id: str = ""
    message_id: str = ""
    model: str | None = None


class AnswerBody(BaseModel):
    answer: str = Field(min_length=1)


class DecisionBody(BaseModel):
    reason: str = ""


class AskBody(BaseModel):
    question: str = Field(min_length=1, max_length=4000)


class JobView(BaseModel):
    id: str
    owner: str
    chat_id: str
    message_id: str
    task: str
    os: str
    project: str | None
    model: str | None
    state: str
    question: str | None
    report: str | None
    session_id: str | None
    verification_passed: bool | None
    steps: int
    status_line: str
    tasks: str
    preview_ready: bool
    preview_url: str
    created: float
    updated: float


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
    config.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(config.data_dir)
    hub = EventHub()
    store.listeners.append(hub.notify)
    pool = WorkerPool(store, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await run_in_threadpool(pool.start)
        yield
        pool.close()

    app = FastAPI(title="vmagent job service", lifespan=lifespan)
    app.state.config, app.state.store, app.state.pool = config, store, pool
    # Open WebUI shows the preview in a sandboxed iframe, whose origin is "null".
    app.add_middleware(CORSMiddleware, allow_origins=["null", *config.cors_origins],
                       allow_methods=["GET", "POST"],
                       allow_headers=["Authorization", "Content-Type", "Last-Event-ID"])

    def caller_of(request: Request) -> Caller:
        return authenticate(request, config)

    def own_job(job_id: str, caller: Caller) -> dict:
        job = store.get_job(job_id)
        if job is None or job["owner"] != caller.user:
            raise HTTPException(404, f"There is no job {job_id} for this user.")
        return job

    def watched_job(request: Request, job_id: str, token: str | None) -> dict:
        """The job, for its owner's bearer token or for a valid preview token of this job."""
        job = store.get_job(job_id)
        if job is not None and token and preview_token_valid(job, token):
            return job
        if token and not request.headers.get("authorization"):
            raise HTTPException(403, "This preview link is invalid or has expired; ask for the job again.")
        return own_job(job_id, caller_of(request))

    def base_url(request: Request) -> str:
        return (config.public_url or str(request.base_url)).rstrip("/")

    def view(job: dict, request: Request) -> dict:
        token = sign_preview(job, config.preview_ttl_s)
        return JobView(
            **{k: job[k] for k in ("id", "owner", "chat_id", "message_id", "task", "os", "project",
                                   "model", "state", "question", "report", "session_id", "steps",
                                   "status_line", "created", "updated")},
            verification_passed=None if job["verification_passed"] is None else bool(job["verification_passed"]),
            tasks=job["tasks_text"], preview_ready=bool(job["preview_ready"]),
            preview_url=f"{base_url(request)}/jobs/{job['id']}/preview?token={token}",
        ).model_dump()

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True, "running": pool.running_count()}

    @app.post("/jobs", status_code=201)
    def create_job(body: JobCreate, request: Request) -> dict:
        caller = caller_of(request)
        job = store.create_job(owner=caller.user, task=body.task, os=body.os, project=body.project,
                               chat_id=body.chat_id, message_id=body.message_id, model=body.model)
        pool.submit(job)
        return view(store.get_job(job["id"]), request)

    @app.get("/jobs")
    def list_jobs(request: Request, chat_id: str | None = None, state: str | None = None,
                  limit: int = Query(50, ge=1, le=500)) -> dict:
        caller = caller_of(request)
        states = tuple(s for s in (state or "").split(",") if s) or None
        jobs = store.list_jobs(owner=caller.user, chat_id=chat_id, states=states, limit=limit)
        return {"jobs": [view(j, request) for j in jobs]}

    @app.get("/jobs/{job_id}")
    def get_job(job_id: str, request: Request) -> dict:
        return view(own_job(job_id, caller_of(request)), request)

    @app.post("/jobs/{job_id}/answer")
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

    @app.post("/jobs/{job_id}/approve")
    def approve(job_id: str, request: Request, body: DecisionBody | None = None) -> dict:
        return decide(job_id, True, body.reason if body else "", request)

    @app.post("/jobs/{job_id}/deny")
    def deny(job_id: str, request: Request, body: DecisionBody | None = None) -> dict:
        return decide(job_id, False, body.reason if body else "", request)

    @app.post("/jobs/{job_id}/cancel")
    def cancel(job_id: str, request: Request) -> dict:
        job = own_job(job_id, caller_of(request))
        if job["state"] in FINAL_STATES:
            raise HTTPException(409, f"This job is already {job['state']}.")
        pool.cancel(job_id)
        return view(store.get_job(job_id), request)

    @app.post("/jobs/{job_id}/ask")
    def ask(job_id: str, body: AskBody, request: Request) -> dict:
        job = own_job(job_id, caller_of(request))
        return {"job_id": job_id, "state": job["state"],
                **answer_question(store, job, body.question, config)}

    @app.get("/jobs/{job_id}/screen.png")
    def screen(job_id: str, request: Request, token: str | None = None):
        job = watched_job(request, job_id, token)
        path = store.job_dir(job["id"]) / "screen.png"
        if not path.exists():
            raise HTTPException(404, "This job has no screenshot yet.")
        return FileResponse(path, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/jobs/{job_id}/preview", response_class=HTMLResponse)
    def preview(job_id: str, request: Request, token: str | None = None):
        job = watched_job(request, job_id, token)
        if not token or not preview_token_valid(job, token):
            token = sign_preview(job, config.preview_ttl_s)
        return HTMLResponse(render_preview(job, token), headers={
            "Cache-Control": "no-store", "Content-Disposition": "inline"})

    @app.get("/jobs/{job_id}/events")
    async def events(job_id: str, request: Request, token: str | None = None,
                     after: int = Query(0, ge=0), follow: bool = True,
                     last_event_id: str | None = Header(None)):
        job = await run_in_threadpool(watched_job, request, job_id, token)
        if last_event_id and last_event_id.isdigit():
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
