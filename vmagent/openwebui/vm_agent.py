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
import re
import time
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field

EventEmitter = Optional[Callable[[dict], Awaitable[Any]]]
# Open WebUI's `__event_call__`: sends an event to the person's browser and returns their
# answer; for a "confirmation" event, True or False from the button they clicked.
EventCall = Optional[Callable[[dict], Awaitable[Any]]]

ACTIVE_STATES = ("queued", "running")
WAITING_STATES = ("needs_input", "needs_approval")
FINAL_STATES = ("done", "failed", "cancelled")

# The approval dialog speaks in the product's words; the agent's reason is shown inside it
# as a quote, labelled as the agent's. The reason is the model's text (and the model
# repeats what the guest printed), so it must not read as the product's own sentence.
APPROVAL_TITLE = "Open network access for the VM agent's machine?"
APPROVAL_MESSAGE = ("The agent asks to open network access for its machine. Approve only if you "
                    "expect it.\n\nThe agent's reason, in its own words: “{reason}”\n\nConfirm opens "
                    "the machine's network access, which is closed by default. Cancel denies it; the "
                    "agent carries on without it.")
# Enough for a sentence or two about a package index; a longer reason is cut.
MAX_REASON_CHARS = 300
# Escape sequences and C0/C1 controls (this file cannot import vmd's `printable`, the same rule).
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?"
                      r"|\x9b[0-?]*[ -/]*[@-~]|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x9c|\x1b\\)?")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Open WebUI renders the dialog's message as markdown: a backslash before each ASCII
# punctuation mark (CommonMark's escape) keeps links, images, emphasis and HTML as text.
_MARKDOWN = re.compile(r"([!-/:-@\[-`{-~])")


def agent_words(text: str) -> str:
    """The agent's reason as it may appear inside the approval dialog: one line, without
    escape sequences or control characters, at most MAX_REASON_CHARS, markdown as text,
    and no quote mark that could end the quote around it."""
    text = " ".join(_CONTROLS.sub(" ", _ESCAPES.sub("", str(text))).split())
    text = text.replace("“", '"').replace("”", '"')
    if len(text) > MAX_REASON_CHARS:
        text = text[:MAX_REASON_CHARS].rstrip() + " …"
    return _MARKDOWN.sub(r"\\\1", text) or "(no reason given)"


class Tools:
    class Valves(BaseModel):
        service_url: str = Field("http://vmagent:8700", description="The vmagent job service, as Open WebUI's server reaches it.")
        service_token: str = Field("", description="The job service's service token (its `service_token`).")
        default_os: str = Field("debian", description="The guest OS when the task names none: debian, ubuntu or windows.")
        poll_interval: float = Field(3.0, description="Seconds between looks at a running job.")
        max_wait_s: int = Field(3 * 3600, description="How long one tool call follows a job before handing back; the job keeps running.")
        service_wait_s: int = Field(60, description="How long a followed job's service may stay silent (a restart takes well under a minute) before the call hands back; the job keeps running.")
        show_preview: bool = Field(True, description="Embed the live screen and terminal in the chat.")

    class UserValves(BaseModel):
        default_project: str = Field("", description="Project (Gitea repository) used when the task names none.")
        default_os: str = Field("", description="Your preferred guest OS; empty uses the admin's default.")
        web_tools: bool = Field(True, description="Let the agent search the web and read documentation pages (on the server; the machine stays offline), where the admin has set up a search engine.")

    def __init__(self):
        self.valves = self.Valves()

    # --- the tool methods the chat model calls ---------------------------------------
    # Open WebUI 0.12 offers the chat model about 28 built-in tools beside these (ask_user,
    # execute_code, create_tasks, delegate_task, ...): each description says when to use
    # this tool and which built-in not to use for the job's part of the work.

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
        Start a NEW job: an autonomous agent gets its own fresh virtual machine (Linux or Windows), does the task there, commits the project to git and reports what it did and whether a check proved it; the person can watch the machine's screen and terminal live.
        Use it when the person wants something built, changed, installed, run or tested on a real machine, a desktop program used, or work done in a git project; not for code you can answer in chat, and never execute_code (the built-in code interpreter) for such work.
        One job per chat: while a job runs or waits, do not call this again; use vm_job_status, answer_vm_question or cancel_vm_job instead. Do not plan the job with create_tasks or hand it to delegate_task: the VM agent plans its own work.
        :param task: The whole task, in the person's words, with every detail they gave.
        :param os: The guest operating system: "debian", "ubuntu" or "windows". Leave empty for the default.
        :param project: Name of the project (git repository) to work in and commit to. Leave empty for the default.
        :return: The agent's report (its first line says whether the result was verified), its question for the person, or why nothing was started.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__, __event_call__)
        async with session:
            existing = await session.chat_job()
            if existing and existing["state"] in ACTIVE_STATES + WAITING_STATES:
                if not _same_task(existing["task"], task):
                    return await session.refuse_second_job(existing, task)
                # The same words again (after the Stop button, say): follow that job.
                if existing["state"] == "needs_input":
                    return session.waiting_text(existing)
                if existing["state"] in ACTIVE_STATES:
                    await session.status(f"A job is already running in this chat; following it: {existing['task'][:80]}")
                return await session.follow(existing)
            user_valves = _user_valves(__user__)
            body = {
                "task": task,
                "os": (os or user_valves.get("default_os") or self.valves.default_os).strip().lower(),
                "project": (project or user_valves.get("default_project") or None),
                "chat_id": __chat_id__ or "",
                "message_id": __message_id__ or "",
                "web": user_valves.get("web_tools") is not False,
            }
            await session.status("Starting a virtual machine for the task…")
            try:
                job = await session.request("POST", "/jobs", json=body)
            except ServiceError as refused:
                # The service refuses a second job of a chat itself (a parallel call, an
                # older copy of this file): say which job holds the chat.
                if refused.status == 409 and (holder := await session.chat_job()):
                    return await session.refuse_second_job(holder, task)
                raise
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
        Pass the person's reply to the question the VM agent of this chat asked; the same machine carries on, and this follows the job to its report or its next question.
        Use it only with words the person wrote (or chose in ask_user) in reply to the agent's question; never answer the agent's question yourself. An approval request (network access) is never decided by a reply: for one, this shows the person an approve/deny dialog instead.
        :param answer: The person's reply, in their words.
        :return: The agent's report, or its next question.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__, __event_call__)
        async with session:
            job = await session.chat_job()
            if not job or job["state"] not in WAITING_STATES + ACTIVE_STATES:
                return ("There is no question from the VM agent waiting in this chat, so the reply was "
                        "not passed on. If the person wants new work done, call run_task_in_vm.")
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
        Answer the person's question about the VM job of this chat (what it changed, which files, why something failed) from its record, report and repository, without starting a machine.
        Use it instead of guessing or searching chats when the person asks what the job did; to see whether it is still running, use vm_job_status.
        :param question: The person's question about the job.
        :return: The answer, from the job's record.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__)
        async with session:
            job = await session.chat_job()
            if not job:
                return "There is no VM job in this chat to ask about; run_task_in_vm starts one."
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
        Tell where the VM job of this chat stands (state, status line, the agent's task list), and if it is still running, follow it to its report. If it waits for an approval, this shows the person the approve/deny dialog.
        Use it when the person asks how the job is going, after the Stop button, or to pick a job up again; not create_tasks or a timer, which know nothing of the VM job.
        :return: The job's state, status line and task list, or its report.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__, __event_call__)
        async with session:
            job = await session.chat_job()
            if not job:
                return "There is no VM job in this chat; run_task_in_vm starts one."
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
        Stop the VM job of this chat, also one that waits for an answer or an approval. The agent ends with a report of what it did; the project keeps what was written.
        Use it only when the person asks to stop the job, or agrees to replace it with a new task (then call run_task_in_vm afterwards).
        :return: The report of the cancelled job.
        """
        session = _Session(self.valves, __user__, __chat_id__, __event_emitter__)
        async with session:
            job = await session.chat_job()
            if not job or job["state"] in FINAL_STATES:
                ended = f" (the last one ended {job['state']})" if job else ""
                return f"There is no running VM job in this chat to cancel{ended}."
            await session.status("Cancelling the job…")
            try:
                # Follow the job as the cancel left it: a job that waited for an answer is
                # resumed to close its machine, and its old question is gone.
                job = await session.request("POST", f"/jobs/{job['id']}/cancel")
            except ServiceError as refused:
                if refused.status != 409:  # it ended between the look and the cancel
                    raise
                job = await session.request("GET", f"/jobs/{job['id']}")
            return await session.follow(job)
        return session.error


def _same_task(running: str, asked: str) -> bool:
    return " ".join(running.split()).casefold() == " ".join(asked.split()).casefold()


class ServiceError(RuntimeError):
    """The job service refused a request, or could not be used; the message is a sentence
    for the chat model that says what happened and what to do. `status`: the HTTP status
    of a refusal, 0 otherwise."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def _verification(job: dict) -> dict:
    """The job's {passed, proven, attempts}; a service from before `verification` gives
    only verification_passed."""
    given = job.get("verification")
    if isinstance(given, dict):
        return {"passed": given.get("passed"), "proven": given.get("proven"),
                "attempts": given.get("attempts") or 0}
    return {"passed": job.get("verification_passed"), "proven": None, "attempts": 0}


def verdict(job: dict) -> str:
    """One plain line on what the supervisor found, ahead of the report: the chat model
    passes this on, and must not call a check that proves nothing a verified result."""
    check = _verification(job)
    passed, proven, runs = check["passed"], check["proven"], check["attempts"]
    if job["state"] == "cancelled" and passed is None:
        return "Outcome: cancelled. The job was stopped before its work was verified."
    if passed is True and proven is True:
        return ("Outcome: verified. The supervisor ran the agent's check itself: it passes now "
                "and failed on the project as it was before the job, so it shows the work was done.")
    if passed is True and proven is False:
        return ("Outcome: passed, not proven: the check also passed on the project as it was before "
                "the job, so it does not show that the work was done. Tell the person plainly that "
                "the result is unconfirmed.")
    if passed is True:
        return ("Outcome: passed, not proven: the check passed, but the supervisor could not run it "
                "on the project as it was before the job, so whether it needs the work is unknown. "
                "Tell the person plainly that the result is unconfirmed.")
    if passed is False:
        tries = f" ({runs} tries)" if runs > 1 else ""
        return (f"Outcome: failed. The supervisor ran the agent's check itself and it did not pass"
                f"{tries}: the work is not done.")
    return f"Outcome: {job['state']}, not verified: the supervisor confirmed nothing about the work."


# What a header value may hold as it is: printable ASCII except "%", which starts an escape.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(text: str) -> str:
    """`text` percent-encoded as UTF-8 wherever a header cannot carry it (José → Jos%C3%A9),
    as Open WebUI itself sends X-OpenWebUI-User-Name; the job service decodes it."""
    return quote(text.strip(), safe=_HEADER_SAFE)


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
        self.url = valves.service_url.strip().rstrip("/")
        self.token = valves.service_token.strip()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        for header, key in (("X-OpenWebUI-User-Id", "id"), ("X-OpenWebUI-User-Email", "email"),
                            ("X-OpenWebUI-User-Name", "name")):
            if self.user.get(key):
                headers[header] = header_value(str(self.user[key]))
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)

    async def __aenter__(self) -> "_Session":
        return self

    async def __aexit__(self, kind, exc, tb) -> bool:
        await self.client.aclose()
        if kind is not None and issubclass(kind, asyncio.CancelledError):
            await self.status("Stopped following the job; it keeps running. Ask about it to re-attach.", done=True)
            return False
        if kind is not None and issubclass(kind, httpx.HTTPError):
            exc = self.unreachable(exc)
            kind = ServiceError
        if kind is not None and issubclass(kind, ServiceError):
            self.error = str(exc)
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
        if not self.token:
            raise ServiceError(
                "The VM tool is not set up: its service_token valve is empty, so the job service "
                "would refuse every request. Nothing was started or changed. Tell the person that "
                "an administrator has to set service_token in Open WebUI (Workspace → Tools → VM "
                "Agent → Valves) to the job service's token (VMAGENT_SERVICE_TOKEN; setup.sh keeps "
                "it in the state folder's service-token file); do not retry until then.")
        response = await self.client.request(method, path, **kwargs)
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code >= 400 and isinstance(answer, dict) and "detail" in answer:
            raise ServiceError(self.refusal_text(method, path, response.status_code, answer["detail"]),
                               status=response.status_code)
        if not isinstance(answer, dict):
            raise self.not_the_service(method, path, response)
        if response.status_code >= 400:
            raise ServiceError(self.refusal_text(method, path, response.status_code, response.text[:300]),
                               status=response.status_code)
        return answer

    def refusal_text(self, method: str, path: str, status: int, detail: Any) -> str:
        hint = {401: " Tell the person the VM tool's service_token valve does not match the job "
                     "service's token; an administrator has to correct it.",
                403: " Tell the person the job service does not allow this for them."}.get(status, "")
        return f"The VM agent service could not do that: {method} {path} answered {status}: {detail}{hint}"

    def not_the_service(self, method: str, path: str, response: httpx.Response) -> ServiceError:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        start = " ".join(response.text[:80].split())
        return ServiceError(
            f"The address in the VM tool's service_url valve ({self.url}) is not the vmagent job "
            f"service: {method} {path} answered HTTP {response.status_code} with {kind} "
            f"({start!r}…), not the service's JSON. Nothing was started or changed. Tell the "
            "person that an administrator has to set service_url to the job service's address "
            "as Open WebUI's server reaches it (for example http://vmagent:8700).",
            status=response.status_code)

    def unreachable(self, exc: Exception) -> ServiceError:
        """An httpx failure outside `follow` as a sentence: nothing reached the service."""
        if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol | httpx.ConnectTimeout):
            return ServiceError(
                f"The VM agent's job service at {self.url} could not be reached "
                f"({type(exc).__name__}: {exc}), so nothing was started or changed. Tell the person "
                "the VM service is not reachable; an administrator should check that it runs and "
                "that the tool's service_url valve points at it. Try again only after that.")
        return ServiceError(
            f"The connection to the VM agent's job service at {self.url} failed mid-request "
            f"({type(exc).__name__}: {exc}); whether the request took effect is unknown. Call "
            "vm_job_status to see where the chat's job stands before trying again.")

    async def chat_job(self) -> Optional[dict]:
        """The newest job of this chat, to re-attach to."""
        if not self.chat_id:
            return None
        listed = await self.request("GET", "/jobs", params={"chat_id": self.chat_id, "limit": 1})
        jobs = listed.get("jobs")
        if not isinstance(jobs, list):
            raise ServiceError(
                f"The address in the VM tool's service_url valve ({self.url}) answered GET /jobs "
                "with JSON that is not the vmagent job service's. Tell the person that an "
                "administrator has to set service_url to the job service's address.")
        return jobs[0] if jobs else None

    async def refuse_second_job(self, running: dict, task: str) -> str:
        """Why `task` was not started while `running` holds the chat, and what to do."""
        state = {"queued": "queued", "running": "running",
                 "needs_input": f"waiting for the person's answer to: {running.get('question')}",
                 "needs_approval": f"waiting for the person's approval of: {running.get('question')}",
                 }.get(running["state"], running["state"])
        await self.status(f"Not started: job {running['id']} is still {running['state']} in this chat.")
        answer = (" answer its question (ask the person, then call answer_vm_question with their reply),"
                  if running["state"] == "needs_input" else "")
        return (f"The new task was NOT started: {task[:200]!r}. This chat already has VM job "
                f"{running['id']}, {running['task'][:200]!r}, which is {state}. A chat runs one VM "
                "job at a time. Tell the person, and ask what they want: wait for that job (call "
                f"vm_job_status to follow it to its report),{answer} or stop it and start the new "
                "task (call cancel_vm_job, then run_task_in_vm again with the new task).")

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
        await self.status("The VM agent asks for approval; waiting for the person's click…")
        try:
            clicked = await self.caller({"type": "confirmation", "data": {
                "title": APPROVAL_TITLE,
                "message": APPROVAL_MESSAGE.format(reason=agent_words(job.get("question") or "")),
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
        """The job now; a restart of the service (`service_wait_s`) is waited out."""
        gone_since = None
        while True:
            try:
                return await self.request("GET", f"/jobs/{job['id']}")
            except (httpx.TransportError, ServiceError) as exc:
                # A proxy in front of a restarting service answers 502-504 meanwhile.
                if isinstance(exc, ServiceError) and exc.status not in (502, 503, 504):
                    raise
                if gone_since is None:
                    gone_since = time.monotonic()
                    await self.status("The job service is not answering; waiting for it…")
                silent = time.monotonic() - gone_since
                if silent >= self.valves.service_wait_s:
                    raise ServiceError(
                        f"The VM agent's job service at {self.url} stopped answering while this "
                        f"call followed job {job['id']} (nothing for {silent:.0f} s; "
                        f"{type(exc).__name__}: {exc}). The job itself may still be running: its "
                        "machine does not depend on this call. Tell the person; call vm_job_status "
                        "in a while to pick the job up again. If the service stays down, an "
                        "administrator has to restart it.") from exc
                await asyncio.sleep(min(2.0, max(0.2, float(self.valves.poll_interval))))

    @staticmethod
    def _final_status(job: dict) -> str:
        check = _verification(job)
        if job["state"] == "done" and check["passed"] is True and check["proven"] is not True:
            return "The VM agent finished: passed, not proven."
        return {"done": "The VM agent finished.", "failed": "The VM job failed.",
                "cancelled": "The VM job was cancelled.",
                "needs_input": "The VM agent has a question.",
                "needs_approval": "The VM agent asks for approval."}.get(job["state"], job["state"])

    def result_text(self, job: dict) -> str:
        if job["state"] in WAITING_STATES:
            return self.waiting_text(job)
        if job["state"] in ACTIVE_STATES:
            return f"The VM job is {job['state']}: {job.get('status_line') or ''}"
        report = job.get("report") or f"The VM job ended {job['state']} without a report."
        return f"{verdict(job)}\n\n{report}"

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
