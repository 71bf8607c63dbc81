"""
title: VM Agent
author: vmagent
version: 0.1.0
license: MIT
description: Hands a coding task to an autonomous agent working in a fresh virtual machine; shows its screen and terminal live, relays its questions, and returns its report.
requirements: httpx
"""

# This file is pasted into Open WebUI (Workspace -> Tools) on its own: it imports nothing
# from vmagent. It is a thin async client of the vmagent job service.

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional

import httpx
from pydantic import BaseModel, Field

EventEmitter = Optional[Callable[[dict], Awaitable[Any]]]
# Open WebUI's `__event_call__`: sends an event to the person's browser and returns their
# answer; for a "confirmation" event, True or False from the button they clicked.
EventCall = Optional[Callable[[dict], Awaitable[Any]]]

ACTIVE_STATES = ("queued", "running")
WAITING_STATES = ("needs_input", "needs_approval")
FINAL_STATES = ("done", "failed", "cancelled")


class Tools:
    class Valves(BaseModel):
        service_url: str = Field("http://vmagent:8700", description="The vmagent job service, as Open WebUI's server reaches it.")
        service_token: str = Field("", description="The job service's service token (its `service_token`).")
        default_os: str = Field("debian", description="The guest OS when the task names none: debian, ubuntu or windows.")
        poll_interval: float = Field(3.0, description="Seconds between looks at a running job.")
        max_wait_s: int = Field(3 * 3600, description="How long one tool call follows a job before handing back; the job keeps running.")
        show_preview: bool = Field(True, description="Embed the live screen and terminal in the chat.")

    class UserValves(BaseModel):
        default_project: str = Field("", description="Project (Gitea repository) used when the task names none.")
        default_os: str = Field("", description="Your preferred guest OS; empty uses the admin's default.")

    def __init__(self):
        self.valves = self.Valves()

    # --- the tool methods the chat model calls ---------------------------------------

    async def run_task_in_vm(
        self,
        task: str,
        os: str = "",
        project: str = "",
        __user__: Optional[dict] = None,
        __chat_id__: Optional[str] = None,
        __message_id__: Optional[str] = None,
        __event_emitter__: EventEmitter = None,
        __event_call__: EventCall = None,
    ) -> str:
        """
        Hand a coding or computer task to an autonomous agent that works in its own fresh virtual machine, and wait for its report. The person can watch the machine's screen and terminal live. Use it for anything that needs running code, installing software or using a desktop.
        :param task: The whole task, in the person's words, with every detail they gave.
        :param os: The guest operating system: "debian", "ubuntu" or "windows". Leave empty for the default.
        :param project: Name of the project (git repository) to work in and commit to. Leave empty for the default.
        :return: The agent's report, or its question for the person.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__, __event_call__)
        async with session:
            existing = await session.chat_job()
            if existing and existing["state"] in ACTIVE_STATES + WAITING_STATES:
                other_task = ("\n\nIf the person wants a different task instead, call "
                              "cancel_vm_job first, then run_task_in_vm again.")
                if existing["state"] == "needs_input":
                    return session.waiting_text(existing) + other_task
                if existing["state"] == "needs_approval":
                    text = await session.follow(existing)
                    return text + other_task if session.undecided else text
                await session.status(f"A job is already running in this chat; following it: {existing['task'][:80]}")
                return await session.follow(existing)
            user_valves = _user_valves(__user__)
            body = {
                "task": task,
                "os": (os or user_valves.get("default_os") or self.valves.default_os).strip().lower(),
                "project": (project or user_valves.get("default_project") or None),
                "chat_id": __chat_id__ or "",
                "message_id": __message_id__ or "",
            }
            await session.status("Starting a virtual machine for the task…")
            job = await session.request("POST", "/jobs", json=body)
            return await session.follow(job)
        return session.error

    async def answer_vm_question(
        self,
        answer: str,
        __user__: Optional[dict] = None,
        __chat_id__: Optional[str] = None,
        __event_emitter__: EventEmitter = None,
        __event_call__: EventCall = None,
    ) -> str:
        """
        Give the person's reply to the question the VM agent asked in this chat; the same machine carries on. An approval request is never decided by a reply: for one, this shows the person an approve/deny dialog instead.
        :param answer: The person's reply, in their words.
        :return: The agent's report, or its next question.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__, __event_call__)
        async with session:
            job = await session.chat_job()
            if not job or job["state"] not in WAITING_STATES + ACTIVE_STATES:
                return "There is no question from the VM agent waiting in this chat."
            if job["state"] in ACTIVE_STATES:
                await session.status("The job is running again already; following it.")
                return await session.follow(job)
            if job["state"] == "needs_approval":
                # The reply is not read at all: words like "yes, no wait, don't" must not
                # open the machine's network. Only the dialog's click decides.
                return await session.follow(job)
            job = await session.request("POST", f"/jobs/{job['id']}/answer", json={"answer": answer})
            await session.status("Answer given; the same machine carries on…")
            return await session.follow(job)
        return session.error

    async def ask_about_vm_job(
        self,
        question: str,
        __user__: Optional[dict] = None,
        __chat_id__: Optional[str] = None,
        __event_emitter__: EventEmitter = None,
    ) -> str:
        """
        Answer a question about the VM job of this chat (what it changed, why something failed) from its record, report and repository, without starting a machine.
        :param question: The person's question about the job.
        :return: The answer, from the job's record.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__)
        async with session:
            job = await session.chat_job()
            if not job:
                return "There is no VM job in this chat to ask about."
            await session.status("Looking through the job's record…")
            reply = await session.request("POST", f"/jobs/{job['id']}/ask", json={"question": question})
            return reply["answer"]
        return session.error

    async def vm_job_status(
        self,
        __user__: Optional[dict] = None,
        __chat_id__: Optional[str] = None,
        __event_emitter__: EventEmitter = None,
        __event_call__: EventCall = None,
    ) -> str:
        """
        Tell where the VM job of this chat stands; if it is still running, follow it to its report. If it waits for an approval, this shows the person the approve/deny dialog.
        :return: The job's state, status line and task list, or its report.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__, __event_call__)
        async with session:
            job = await session.chat_job()
            if not job:
                return "There is no VM job in this chat."
            if job["state"] in ACTIVE_STATES or job["state"] == "needs_approval":
                return await session.follow(job)
            return session.result_text(job)
        return session.error

    async def cancel_vm_job(
        self,
        __user__: Optional[dict] = None,
        __chat_id__: Optional[str] = None,
        __event_emitter__: EventEmitter = None,
    ) -> str:
        """
        Stop the VM job of this chat. The agent ends with a report of what it did; the project keeps what was written.
        :return: The report of the cancelled job.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__)
        async with session:
            job = await session.chat_job()
            if not job or job["state"] in FINAL_STATES:
                return "There is no running VM job in this chat to cancel."
            await session.status("Cancelling the job…")
            await session.request("POST", f"/jobs/{job['id']}/cancel")
            return await session.follow(job)
        return session.error


class ServiceError(RuntimeError):
    """The job service refused a request; the message says why."""


def _user_valves(user: Optional[dict]) -> dict:
    valves = (user or {}).get("valves")
    if valves is None:
        return {}
    if hasattr(valves, "model_dump"):
        return valves.model_dump()
    return dict(valves) if isinstance(valves, dict) else {}


class _Session:
    """One tool call: an HTTP client for the service, the chat's event emitter and, where
    Open WebUI offers it, the event caller that shows the person an approval dialog.

    Leaving it always emits a last status with done: true, also when the call is
    cancelled — the job itself keeps running and the next call re-attaches."""

    def __init__(self, valves: "Tools.Valves", user: Optional[dict], chat_id: Optional[str],
                 emitter: EventEmitter, caller: EventCall = None):
        self.valves = valves
        self.user = user or {}
        self.chat_id = chat_id or ""
        self.emitter = emitter
        self.caller = caller
        self.last_status = ""
        self.embedded = False
        self.error = ""
        # Why the last approval request was left undecided, for the text the model reads.
        self.undecided = ""
        headers = {"Authorization": f"Bearer {valves.service_token}"}
        for header, key in (("X-OpenWebUI-User-Id", "id"), ("X-OpenWebUI-User-Email", "email"),
                            ("X-OpenWebUI-User-Name", "name")):
            if self.user.get(key):
                headers[header] = str(self.user[key])
        self.client = httpx.AsyncClient(base_url=valves.service_url.rstrip("/"), headers=headers, timeout=30)

    async def __aenter__(self) -> "_Session":
        return self

    async def __aexit__(self, kind, exc, tb) -> bool:
        await self.client.aclose()
        if kind is not None and issubclass(kind, asyncio.CancelledError):
            await self.status("Stopped following the job; it keeps running. Ask about it to re-attach.", done=True)
            return False
        if kind is not None and issubclass(kind, (httpx.HTTPError, ServiceError)):
            self.error = f"The VM agent service could not do that: {exc}"
            await self.status(self.error[:200], done=True)
            return True  # the method returns self.error to the chat model instead
        await self.status(self.last_status or "Done", done=True)
        return False

    async def emit(self, event: dict) -> None:
        if self.emitter is None:
            return
        try:
            await self.emitter(event)
        except Exception:  # a view never breaks the work
            pass

    async def status(self, description: str, done: bool = False) -> None:
        self.last_status = description
        await self.emit({"type": "status", "data": {"description": description, "done": done}})

    async def request(self, method: str, path: str, **kwargs) -> dict:
        response = await self.client.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise ServiceError(f"{method} {path} answered {response.status_code}: {detail}")
        return response.json()

    async def chat_job(self) -> Optional[dict]:
        """The newest job of this chat, to re-attach to."""
        if not self.chat_id:
            return None
        jobs = (await self.request("GET", "/jobs", params={"chat_id": self.chat_id, "limit": 1}))["jobs"]
        return jobs[0] if jobs else None

    async def show_preview(self, job: dict) -> None:
        if self.embedded or not self.valves.show_preview or not job.get("preview_ready"):
            return
        self.embedded = True
        await self.emit({"type": "embeds", "data": {"embeds": [job["preview_url"]], "replace": True}})

    async def follow(self, job: dict) -> str:
        deadline = time.monotonic() + self.valves.max_wait_s
        shown = ""
        while True:
            await self.show_preview(job)
            line = job.get("status_line") or job["state"]
            if line != shown:
                shown = line
                await self.status(f"VM agent ({job['state']}): {line}"[:200])
            if job["state"] == "needs_approval":
                decided = await self.decide_by_click(job)
                if decided is not None:
                    job = decided
                    continue
            if job["state"] not in ACTIVE_STATES:
                text = self.result_text(job)
                await self.status(self._final_status(job))
                return text
            if time.monotonic() > deadline:
                await self.status("Still running; call vm_job_status later to follow it.")
                return (f"The VM job is still running (status: {line}). It carries on by itself; "
                        "call vm_job_status later to get its report.")
            await asyncio.sleep(max(0.2, float(self.valves.poll_interval)))
            job = await self._look_again(job)

    async def decide_by_click(self, job: dict) -> Optional[dict]:
        """Asks the person, in Open WebUI's confirmation dialog, whether to grant the job's
        approval request, and tells the service what they clicked: Confirm approves, Cancel
        denies. The job after the decision, or None when nothing was decided.

        Only the click decides: no text is read as consent. Anything but a boolean from the
        dialog decides nothing and leaves the job waiting: for a dialog that timed out or
        lost its browser tab, Open WebUI answers None, raises, or (newer versions) answers a
        dict such as {"error": ...}, which is truthy."""
        if self.caller is None:
            self.undecided = "this tool call cannot show the person the approval dialog"
            return None
        reason = job.get("question") or "(no reason given)"
        await self.status("The VM agent asks for approval; waiting for the person's click…")
        try:
            clicked = await self.caller({"type": "confirmation", "data": {
                "title": "Allow the VM agent network access?",
                "message": (f"The agent working in the virtual machine asks: {reason}\n\n"
                            "Confirm opens the machine's network access, which is closed by "
                            "default. Cancel denies it; the agent carries on without it."),
            }})
        except Exception as exc:  # the dialog's failure is not a decision
            self.undecided = f"the approval dialog could not be shown ({type(exc).__name__}: {exc})"
            return None
        if clicked is True:
            verb, line = "approve", "Approved by a click; the machine carries on…"
        elif clicked is False:
            verb, line = "deny", "Denied by a click; the agent carries on without it…"
        else:
            self.undecided = "the approval dialog was closed or timed out without a click"
            return None
        job = await self.request("POST", f"/jobs/{job['id']}/{verb}")
        await self.status(line)
        return job

    async def _look_again(self, job: dict) -> dict:
        """The job now; a restart of the service (a minute at most) is waited out."""
        for attempt in range(30):
            try:
                return await self.request("GET", f"/jobs/{job['id']}")
            except httpx.TransportError:
                if attempt == 0:
                    await self.status("The job service is not answering; waiting for it…")
                await asyncio.sleep(2)
        return await self.request("GET", f"/jobs/{job['id']}")

    @staticmethod
    def _final_status(job: dict) -> str:
        return {"done": "The VM agent finished.", "failed": "The VM job failed.",
                "cancelled": "The VM job was cancelled.",
                "needs_input": "The VM agent has a question.",
                "needs_approval": "The VM agent asks for approval."}.get(job["state"], job["state"])

    def result_text(self, job: dict) -> str:
        if job["state"] in WAITING_STATES:
            return self.waiting_text(job)
        if job["state"] in ACTIVE_STATES:
            return f"The VM job is {job['state']}: {job.get('status_line') or ''}"
        return job.get("report") or f"The VM job ended {job['state']} without a report."

    def waiting_text(self, job: dict) -> str:
        if job["state"] == "needs_approval":
            why = self.undecided or "the person has not decided it yet"
            return (f"The VM agent asks for approval: {job.get('question')}\n\n"
                    f"Nothing was approved or denied: {why}. An approval is given only by a click "
                    "in the approve/deny dialog, never by words typed in the chat. Tell the person; "
                    "to decide, they can ask for the job's status here (vm_job_status shows the "
                    f"dialog) or approve or deny job {job['id']} at the job service "
                    f"(POST /jobs/{job['id']}/approve or /deny). The machine waits, paused, until then.")
        return (f"The VM agent has a question: {job.get('question')}\n\n"
                "Ask the person this question, in plain words. When they reply, call "
                "answer_vm_question with their reply. The machine waits, paused, until then.")
