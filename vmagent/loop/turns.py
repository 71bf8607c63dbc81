"""The turn loop: one job, from the task to a report.

    run_job(spec, on_event=..., transcript_path=...)      a new job
    resume_job(transcript_path, answer=..., on_event=...) the same job after a question
    work(job, link, config, events, cancel)                the turns of a job whose session
                                                           is open (also vmagent/loop/rerun.py's)

A job opens a vmd session without waiting for the machine, and the first turns are for
the plan: the model writes the task list while the guest boots (vmd refuses the
machine's tools until a plan exists, with a sentence that says so). Once a plan exists
and the guest answers, the model is told the machine is up (vmagent/loop/hand_over.py).
Every request offers the same tools and starts with the same system prompt, written
once per job: what becomes known later arrives as a message at the end, so the model
server's cache of the prompt's head holds from the first turn to the last (old
screenshots go in batches: vmagent/models/history.py's drop_images_in_batches). Each turn
then is: guards (vmagent/loop/guards.py), compaction, one model call, the tool calls it
asked for, the transcript written to disk. What the loop itself says to the model is in
vmagent/loop/words.py.

Every way out ends in `end_job` (vmagent/loop/job_end.py): unless the session waits for a
person, vmd closes it (commit + push) and the report is vmd's, built from its record,
with the loop's notes on why it ended (vmagent/loop/fallback_report.py). Nothing the model
says decides the outcome.
The job's state, its transcript on disk and the event feed are in vmagent/loop/job.py.

Faults on the way are ridden out, within bounds: a vmd restart through the session's
`SessionLink` (vmagent/link/: wait, re-attach, a tool call in flight answered as
interrupted), a model server that goes away through `Model.chat`'s retries (the same
request again). A cancel reaches what is in flight after `cancel_grace_s` (`BreakOff`,
vmagent/loop/break_off.py).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from vmagent import tools
from vmagent.config import AgentConfig, ConfigError
from vmagent.link import ResultLost, SessionLink, Vmd, VmdError, VmdGone, VmdUnavailable, default_socket
from vmagent.loop.break_off import BreakOff
from vmagent.loop.compact import Compactor, PinnedContext, cap_tool_result
from vmagent.loop.guards import (at_step_cap, call_step, calls_written_as_text, cancelled, machine_gone,
                                 model_unfit, past_deadline, prose_only, repeat_notice, stall_reminder,
                                 stuck_ending, stuck_notice)
from vmagent.loop.hand_over import hand_over_machine
from vmagent.loop.job import Ending, Event, Events, Job, JobSpec, Outcome
from vmagent.loop.job_end import end_job, end_without_session
from vmagent.loop.words import answer_text, opening_message, result_lost, vmd_gone
from vmagent.models import (Model, ModelCancelled, ModelError, drop_images_in_batches, only_latest_thinking,
                            open_model)
from vmagent.prompts import PromptMissing, Prompts, load_prompts
from vmagent.web.agent_tools import WebTools, record_source
from vmd.contract.policy import WAITING_STATES
from vmd.contract.results import ResumeResult, SessionStatusResult

log = logging.getLogger(__name__)


# --- the public entry points ----------------------------------------------------------


def run_job(
    spec: JobSpec,
    *,
    on_event: Callable[[Event], None],
    cancel: threading.Event | None = None,
    transcript_path: Path,
    config: AgentConfig | None = None,
    vmd_socket: str | None = None,
) -> Outcome:
    """Run one job to its end (done, failed, cancelled) or to a question. Never raises."""
    events = Events(on_event)
    cancel = cancel or threading.Event()
    job = Job(spec=spec, transcript_path=Path(transcript_path))
    try:
        config = config_for(spec, config)
        # Loaded before session_open, so that a missing prompt boots no machine; it is
        # written once vmd says the guest's family (only the family's own part differs,
        # and that part is optional).
        load_prompts(job.os_family, desktop=False, config=config)
    except (ConfigError, PromptMissing) as exc:
        return end_without_session(job, events, f"The job could not start: {exc}")
    # Asked before session_open, so that a model that cannot do the work boots no machine.
    llm = open_model(config)
    unfit = model_unfit(llm)
    if unfit:
        return end_without_session(job, events, unfit)
    vmd = Vmd(vmd_socket or default_socket(), on_notify=events.from_vmd)
    try:
        opened = vmd.call("session_open", os=spec.os, project=spec.project, owner=spec.owner,
                          task=spec.task, wait=False, chat_id=spec.chat_id)
    except (VmdUnavailable, VmdError) as exc:
        return end_without_session(job, events, f"vmd could not open a session: {exc}")
    job.session_id = opened.session_id
    job.answered_os_family = opened.os_family  # None from an older vmd: the name is read
    # A Windows guest always has a desktop; else the image says (None from an older vmd).
    job.screen = True if job.os_family == "windows" else opened.desktop
    web = WebTools.from_config(config) if spec.web else WebTools(None, None, 0)
    job.web_tools = list(web.names)  # decided once: the tool list stays the same all job long
    link = session_link(vmd, config, events, cancel)
    events.emit({"type": "session", "session_id": job.session_id})
    try:
        # The screen's rules join the prompt at once where the screen tools are offered from
        # the start; never where there is no desktop, and with the hand-over where vmd did not say.
        system = _prompts(job, config, desktop=bool(job.screen)).system
    except PromptMissing as exc:  # gone since the check above: the session is closed again
        return end_job(job, link, Ending("failed", f"The job could not start: {exc}"), events)
    events.emit({"type": "status", "text": f"session {job.session_id} open; the machine boots while the agent plans"})
    job.messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": opening_message(spec, opened, job.web_tools)},
    ]
    job.save()
    return work(job, link, config, events, cancel, llm, web)


def resume_job(
    transcript_path: Path,
    *,
    answer: str | None = None,
    approved: bool | None = None,
    on_event: Callable[[Event], None],
    cancel: threading.Event | None = None,
    config: AgentConfig | None = None,
    vmd_socket: str | None = None,
) -> Outcome:
    """Carry on a job that stopped with a question or an approval request. Never raises."""
    events = Events(on_event)
    cancel = cancel or threading.Event()
    try:
        job = Job.load(Path(transcript_path))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        spec = JobSpec(task="(unknown: the transcript could not be read)")
        job = Job(spec=spec, transcript_path=Path(transcript_path))
        return end_without_session(job, events, f"The job cannot be resumed: its transcript "
                                                 f"{transcript_path} could not be read ({exc}).")
    if not job.session_id:
        return end_without_session(job, events, "The job cannot be resumed: its transcript names no session.")
    job.state, job.question = "running", None
    vmd = Vmd(vmd_socket or default_socket(), on_notify=events.from_vmd)
    vmd.session_id = job.session_id  # what a lost connection re-attaches
    link = SessionLink(vmd, stop=cancel)  # waits for nothing until the config says how long
    try:
        config = config_for(job.spec, config)
        link = session_link(vmd, config, events, cancel)
        link.call("session_attach", session_id=job.session_id)
        if cancel.is_set():  # cancelled while it waited: close it without waking the model
            return end_job(job, link, Ending("cancelled", "Cancelled while the session waited for a person."), events)
        resumed = _resume(link, answer, approved)
    except ConfigError as exc:
        return end_job(job, link, Ending("failed", f"The job could not resume: {exc}"), events)
    except (VmdUnavailable, VmdError) as exc:
        return end_job(job, link, Ending("failed", f"vmd could not resume session {job.session_id}: {exc}"), events)
    events.emit({"type": "session", "session_id": job.session_id})
    events.emit({"type": "status", "text": "resumed with the person's answer"})
    job.messages.append({"role": "user", "content": (resumed.text if resumed else "") or answer_text(answer, approved)})
    job.save()
    web = WebTools.from_config(config)
    web.names = tuple(name for name in web.names if name in job.web_tools)  # as the job started
    return work(job, link, config, events, cancel, web=web)


def session_link(vmd: Vmd, config: AgentConfig, events: Events, cancel: threading.Event) -> SessionLink:
    """The session's connection as the loop uses it: it rides out a vmd restart for up to
    vmd_reconnect_s, and says so in the event feed."""
    return SessionLink(vmd, wait_s=config.vmd_reconnect_s, stop=cancel,
                       on_status=lambda text: events.emit({"type": "status", "text": text}))


def _resume(link: SessionLink, answer: str | None, approved: bool | None) -> ResumeResult | None:
    """session_resume; when vmd restarted while it was in flight, the session's state says
    whether it took effect (a second one would be refused: nothing waits any more)."""
    try:
        return link.call("session_resume", answer=answer or "", approved=approved)
    except ResultLost:
        if link.call("session_status").state in WAITING_STATES:
            return link.call("session_resume", answer=answer or "", approved=approved)
        return None


# --- the loop -------------------------------------------------------------------------


def work(job: Job, vmd: SessionLink, config: AgentConfig, events: Events, cancel: threading.Event,
         llm: Model | None = None, web: WebTools | None = None) -> Outcome:
    """The turns of `job`, whose session `vmd` is open and whose history holds its start (a
    new job, a resume, a rerun), to the job's end: the outcome, never an exception."""
    llm = llm or open_model(config)
    llm.on_wait = lambda text: events.emit({"type": "status", "text": text})
    compactor = Compactor(config, llm)
    breaker = BreakOff(cancel, config.cancel_grace_s, vmd, llm)
    try:
        ending = None
        while ending is None:
            ending = _turn(job, vmd, llm, compactor, config, events, cancel, web)
            job.save()
    except VmdGone as exc:
        ending = Ending("failed", vmd_gone(exc))
    except (VmdUnavailable, ModelCancelled) as exc:
        # With the job cancelled, this is the call the cancel broke off.
        ending = cancelled(cancel) or Ending("failed", f"vmd went away during the session: {exc}")
    except ModelError as exc:
        ending = Ending("failed", f"The model could not answer: {exc}")
    except Exception as exc:  # a bug in the loop must still end in a report
        log.error("the loop failed:\n%s", traceback.format_exc())
        ending = Ending("failed", f"The agent loop stopped on an internal error: {type(exc).__name__}: {exc}")
    finally:
        broke_off = breaker.stop()
    if broke_off and ending.state == "cancelled":
        ending = Ending("cancelled", f"{ending.reason} What was in flight (a command in the guest or the model's "
                                     f"answer) was broken off after {config.cancel_grace_s:g} s; closing the "
                                     "session destroys the machine, which ends a command still running.")
    return end_job(job, vmd, ending, events, llm)


def _turn(job: Job, vmd: SessionLink, llm: Model, compactor: Compactor, config: AgentConfig,
          events: Events, cancel: threading.Event, web: WebTools | None = None) -> Ending | None:
    """One turn: guards, the hand-over when due, one model call, its tool calls."""
    ending = cancelled(cancel) or past_deadline(job, config) or at_step_cap(job, config)
    if ending:
        return ending

    status = vmd.call("session_status", turns=job.steps + 1, tool_calls=job.tool_calls)  # this turn counted
    _show_status(job, status, events)
    ending = machine_gone(status)
    if ending:
        return ending
    if job.phase == "planning" and status.planned:
        ending = hand_over_machine(job, vmd, config, events, cancel)
        if ending:
            return ending
    stall_reminder(job, config)

    # The same tool list in every phase; while planning every call goes to vmd, whose gate
    # refuses what needs a plan. Once working, a screen tool on a guest without a desktop is
    # answered here (tool_results.py): vmd has no screen to refuse it with.
    # A guest with no desktop at the start is offered no screen tool (job.desktop stays False).
    screen = job.screen is not False
    offered = tools.offered_names((), screen) if job.phase == "planning" else tools.tool_names(job.phase, job.desktop)
    offered += job.web_tools  # run on the host: no plan or machine needed
    schemas = tools.offered_schemas(job.os_family, job.web_tools, screen)
    pinned = PinnedContext(task_list=job.tasks_text or "(no tasks planned yet)", verification=job.verification,
                           machine=job.machine_text or None)
    job.messages, compacted = compactor.maybe_compact(job.messages, schemas, pinned)
    if compacted:
        events.emit({"type": "status", "text": "compacted the conversation to stay within the model's context"})

    # A prompt the server refuses as longer than the context is compacted and asked again.
    asked = time.monotonic()
    job.messages, reply, refused = compactor.ask(job.messages, schemas, pinned, retry_until=_deadline_at(job, config))
    if refused:
        events.emit({"type": "status", "text": "the model server found the prompt longer than the model's context; "
                                                "compacted the conversation and asked again"})
    job.steps += 1
    job.usage.add(time.monotonic() - asked, reply)
    compactor.observe(job.messages, schemas, reply)
    if reply.thinking.strip():
        events.emit({"type": "thinking", "text": reply.thinking})
    if reply.content.strip():
        events.emit({"type": "speech", "text": reply.content})

    reply, notice = calls_written_as_text(job, reply)
    if not reply.tool_calls:
        return prose_only(job, reply.content, config)
    job.guards.prose_streak = 0
    if reply.content.strip():
        _note(vmd, job.steps, reply.content.strip())
    # The thinking goes back with the tool calls while their results are answered, as
    # Ollama's tool-calling docs say; only the newest is kept (models.only_latest_thinking).
    job.messages = only_latest_thinking(job.messages + [reply.as_message(with_thinking=True)])

    sees_images = llm.sees_images()
    for call in reply.tool_calls:
        job.tool_calls += 1
        outcome = _call_tool(job, vmd, call.name, call.arguments, offered, config, events, notice, sees_images, web)
        notice = ""
        if outcome.state in WAITING_STATES:
            return Ending(outcome.state, "The agent asked a person and waits for the answer; "
                                         "the machine is kept suspended.")
        if outcome.state == "finished":
            return Ending("done", "The agent finished and vmd accepted it.")
        ending = stuck_ending(job)  # the calls after it in this reply are not run
        if ending:
            return ending
    return None


def _call_tool(job: Job, vmd: SessionLink, name: str, arguments: Any, offered: list[str],
               config: AgentConfig, events: Events, notice: str = "",
               sees_images: bool = True, web: WebTools | None = None) -> tools.ToolOutcome:
    """Run one tool call and put its result in the history, capped, with any notice."""
    verb = tools.verb_of(name)
    # Read once: the command is shown before it runs, and the same reading goes to vmd.
    parsed = tools.parse_arguments(verb, arguments)
    params = parsed.params or {}
    if verb == "run" and params:
        events.emit({"type": "command", "command": params["command"]})
    elif verb in tools.WEB_TOOLS and params:
        events.emit({"type": "status", "text": f"{verb}: {params.get('query') or params.get('url')}"})
    elif verb in tools.TOOLS:
        events.emit({"type": "status", "text": f"{verb}"})
    if verb == "finish" and params.get("verification"):
        job.verification = params["verification"].get("command")

    try:
        # A model without vision gets the screen read as text (vmagent/tools/results.py).
        outcome = tools.call(vmd, name, parsed, offered=offered, sees_images=sees_images, web=web)
    except ResultLost as lost:
        # vmd restarted while this call was in flight and the session is re-attached.
        outcome = tools.ToolOutcome(result_lost(verb or name, lost.seconds), verb=verb, ok=False)

    if verb in tools.WEB_TOOLS and outcome.result:
        record_source(vmd, events.emit, outcome.result)
    text = outcome.text
    repeated = ""
    if verb == "run" and outcome.ok and outcome.result:
        repeated = repeat_notice(job, params, outcome.result, config)
    # The stuck detector sees every call; its notice says more than the run-only one.
    text += stuck_notice(job, call_step(verb, params if parsed.ok else arguments, outcome), config) or repeated
    if notice:
        text = f"{notice}\n\n{text}"
    message: dict[str, Any] = {"role": "tool", "tool_name": verb or str(name),
                               "content": cap_tool_result(text, config.tool_result_cap_chars)}
    if outcome.image_b64:
        if sees_images:  # Ollama drops images for a model without vision, silently
            message["images"] = [outcome.image_b64]
        result = outcome.result or {}
        events.emit({"type": "screenshot", "png_base64": outcome.image_b64,
                     "width": result.get("width"), "height": result.get("height")})
    job.messages.append(message)
    job.messages = drop_images_in_batches(job.messages, config.keep_images, config.max_images)
    return outcome


# --- pieces -------------------------------------------------------------------------------


def config_for(spec: JobSpec, config: AgentConfig | None) -> AgentConfig:
    """The job's settings: `config` (else the agent's own, loaded), with the spec's model."""
    config = config or AgentConfig.load()
    if spec.model:
        config = config.model_copy(update={"model": spec.model})
    return config


def _prompts(job: Job, config: AgentConfig, desktop: bool) -> Prompts:
    prompts = load_prompts(job.os_family, desktop=desktop, config=config)
    for warning in prompts.warnings:
        log.warning("%s", warning)
    return prompts


def _show_status(job: Job, status: SessionStatusResult, events: Events) -> None:
    tasks_text = status.tasks
    if tasks_text != job.guards.last_tasks:
        job.guards.last_tasks = tasks_text
        job.guards.steps_since_tasks_moved = 0
        if tasks_text:
            events.emit({"type": "tasks", "text": tasks_text})
    elif job.steps:
        job.guards.steps_since_tasks_moved += 1
    job.tasks_text = tasks_text
    line = status.status_line
    if line and line != job.status_line:
        job.status_line = line
        events.emit({"type": "status", "text": line, "turns": status.turns, "tool_calls": status.tool_calls})


def _deadline_at(job: Job, config: AgentConfig) -> float:
    """The job's deadline on time.monotonic()'s clock: a model that is away is not waited
    for past it."""
    return time.monotonic() + max(0.0, config.deadline_s - job.active_seconds())


def _note(vmd: SessionLink, turn: int, text: str) -> None:
    try:
        vmd.call("note", turn=turn, text=text[:4000])
    except VmdError as exc:  # the record misses a line; the work goes on
        log.warning("vmd refused a note: %s", exc)
