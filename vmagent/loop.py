"""The turn loop: one job, from the task to a report.

    run_job(spec, on_event=..., transcript_path=...)      a new job
    resume_job(transcript_path, answer=..., on_event=...) the same job after a question

A job opens a vmd session without waiting for the machine, and the first turns offer
only the planning tools: the model writes the task list while the guest boots. Once a
plan exists and the guest answers, the model is told the machine is up and gets every
tool. Each turn then is: guards, compaction, one model call, the tool calls it asked
for, the transcript written to disk.

Every way out ends in `_end`: unless the session waits for a person, vmd closes it
(commit + push) and the report is vmd's, built from its record, with the loop's notes
on why it ended (vmagent/fallback_report.py). Nothing the model says decides the outcome.
The job's state, its transcript on disk and the event feed are in vmagent/job.py.

Faults on the way are ridden out, within bounds: a vmd restart through the session's
`SessionLink` (vmagent/client.py: wait, re-attach, a tool call in flight answered as
interrupted), a model server that goes away through `LLM.chat`'s retries (the same
request again). A cancel reaches what is in flight after `cancel_grace_s` (`BreakOff`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from vmagent import tools
from vmagent.client import ResultLost, SessionLink, Vmd, VmdError, VmdGone, VmdUnavailable, default_socket
from vmagent.compact import Compactor, PinnedContext, cap_tool_result
from vmagent.config import AgentConfig, ConfigError
from vmagent.fallback_report import local_report, loop_notes, outage_notes, vmd_report
from vmagent.job import Ending, Event, Events, Job, JobSpec, Outcome, Verification, save_quietly
from vmagent.llm import LLM, ModelCancelled, OllamaError, Reply, drop_old_images, only_latest_thinking
from vmagent.prompts import PromptMissing, load_prompts
from vmagent.text_calls import USE_THE_TOOL_INTERFACE, calls_in_text

log = logging.getLogger(__name__)

# vmd's error code for "the machine is not up" (vmd/session.py NOT_READY).
NOT_READY = -32003
# session_ready is asked in slices so that a cancel is seen while the guest boots.
READY_SLICE_S = 30.0
# What the model reads for a tool call whose result vmd lost when it restarted. It is not
# run again: a command may have run in part, in full or not at all, and only a look at
# its effects tells which.
RESULT_LOST_RUN = ("INTERRUPTED: the command's result was lost when vmd restarted (vmd was away {seconds:.0f} s); "
                   "it may have run in part, in full or not at all. Check its effects before running it again.")
RESULT_LOST = ("INTERRUPTED: the result of {verb} was lost when vmd restarted (vmd was away {seconds:.0f} s); it "
               "may or may not have taken effect. Check its effects before calling it again.")
# How often the cancel watcher looks whether the job was cancelled.
CANCEL_POLL_S = 0.2


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
        config = _config_for(spec, config)
        system = _system_prompt(job, config_desktop=False)
    except (ConfigError, PromptMissing) as exc:
        return _end_without_session(job, events, f"The job could not start: {exc}")
    # Asked before session_open, so that a model that cannot do the work boots no machine.
    llm = LLM(config)
    unfit = model_unfit(llm)
    if unfit:
        return _end_without_session(job, events, unfit)
    vmd = Vmd(vmd_socket or default_socket(), on_notify=events.from_vmd)
    try:
        opened = vmd.call("session_open", os=spec.os, project=spec.project, owner=spec.owner,
                          task=spec.task, wait=False, chat_id=spec.chat_id)
    except (VmdUnavailable, VmdError) as exc:
        return _end_without_session(job, events, f"vmd could not open a session: {exc}")
    job.session_id = opened.get("session_id") or vmd.session_id
    link = _link(vmd, config, events, cancel)
    events.emit({"type": "session", "session_id": job.session_id})
    events.emit({"type": "status", "text": f"session {job.session_id} open; the machine boots while the agent plans"})
    job.messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": _opening_message(spec, opened)},
    ]
    job.save()
    return _work(job, link, config, events, cancel, llm)


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
        return _end_without_session(job, events, f"The job cannot be resumed: its transcript "
                                                 f"{transcript_path} could not be read ({exc}).")
    if not job.session_id:
        return _end_without_session(job, events, "The job cannot be resumed: its transcript names no session.")
    job.state, job.question = "running", None
    vmd = Vmd(vmd_socket or default_socket(), on_notify=events.from_vmd)
    vmd.session_id = job.session_id  # what a lost connection re-attaches
    link = SessionLink(vmd, stop=cancel)  # waits for nothing until the config says how long
    try:
        config = _config_for(job.spec, config)
        link = _link(vmd, config, events, cancel)
        link.call("session_attach", session_id=job.session_id)
        if cancel.is_set():  # cancelled while it waited: close it without waking the model
            return _end(job, link, Ending("cancelled", "Cancelled while the session waited for a person."), events)
        resumed = _resume(link, answer, approved)
    except ConfigError as exc:
        return _end(job, link, Ending("failed", f"The job could not resume: {exc}"), events)
    except (VmdUnavailable, VmdError) as exc:
        return _end(job, link, Ending("failed", f"vmd could not resume session {job.session_id}: {exc}"), events)
    events.emit({"type": "session", "session_id": job.session_id})
    events.emit({"type": "status", "text": "resumed with the person's answer"})
    job.messages.append({"role": "user", "content": resumed.get("text") or _answer_text(answer, approved)})
    job.save()
    return _work(job, link, config, events, cancel)


def _link(vmd: Vmd, config: AgentConfig, events: Events, cancel: threading.Event) -> SessionLink:
    """The session's connection as the loop uses it: it rides out a vmd restart for up to
    vmd_reconnect_s, and says so in the event feed."""
    return SessionLink(vmd, wait_s=config.vmd_reconnect_s, stop=cancel,
                       on_status=lambda text: events.emit({"type": "status", "text": text}))


def _resume(link: SessionLink, answer: str | None, approved: bool | None) -> dict:
    """session_resume; when vmd restarted while it was in flight, the session's state says
    whether it took effect (a second one would be refused: nothing waits any more)."""
    try:
        return link.call("session_resume", answer=answer or "", approved=approved)
    except ResultLost:
        if link.call("session_status").get("state") in ("question", "unfreeze"):
            return link.call("session_resume", answer=answer or "", approved=approved)
        return {}


# --- the loop -------------------------------------------------------------------------


def _work(job: Job, vmd: SessionLink, config: AgentConfig, events: Events, cancel: threading.Event,
          llm: LLM | None = None) -> Outcome:
    llm = llm or LLM(config)
    llm.on_wait = lambda text: events.emit({"type": "status", "text": text})
    compactor = Compactor(config, llm)
    breaker = BreakOff(cancel, config.cancel_grace_s, vmd, llm)
    try:
        ending = None
        while ending is None:
            ending = _turn(job, vmd, llm, compactor, config, events, cancel)
            job.save()
    except VmdGone as exc:
        ending = Ending("failed", _vmd_gone(exc))
    except (VmdUnavailable, ModelCancelled) as exc:
        # With the job cancelled, this is the call the cancel broke off.
        ending = cancelled(cancel) or Ending("failed", f"vmd went away during the session: {exc}")
    except OllamaError as exc:
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
    return _end(job, vmd, ending, events, llm)


class BreakOff:
    """Once the job is cancelled, what is in flight gets `grace` seconds to end by itself;
    then the vmd call is broken off (the link's connection shut down) and the model's
    answer abandoned, so the loop reaches `_end` and the session closes promptly. Stopped
    before `_end`, whose calls are never broken off."""

    def __init__(self, cancel: threading.Event, grace: float, link: SessionLink, llm: LLM):
        self.cancel, self.grace, self.link, self.llm = cancel, grace, link, llm
        self.finished = threading.Event()
        self.fired = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="cancel-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self.cancel.wait(CANCEL_POLL_S):
            if self.finished.is_set():
                return
        if self.finished.wait(self.grace):
            return
        with self._lock:
            if self.finished.is_set():
                return
            self.fired = True
            self.llm.abandon()
            self.link.abort()

    def stop(self) -> bool:
        """The loop is done: nothing is broken off from now on. Whether something was."""
        with self._lock:
            self.finished.set()
            return self.fired


def _vmd_gone(exc: VmdGone) -> str:
    return (f"{str(exc).rstrip('.')}; the loop stopped waiting. vmd closes the session itself (commit and "
            "push) once it is back; the session's record stays in vmd's state dir.")


def _turn(job: Job, vmd: SessionLink, llm: LLM, compactor: Compactor, config: AgentConfig,
          events: Events, cancel: threading.Event) -> Ending | None:
    """One turn: guards, the hand-over when due, one model call, its tool calls."""
    ending = cancelled(cancel) or past_deadline(job, config) or at_step_cap(job, config)
    if ending:
        return ending

    status = vmd.call("session_status")
    _show_status(job, status, events)
    ending = machine_gone(status)
    if ending:
        return ending
    if job.phase == "planning" and status.get("planned"):
        ending = _hand_over_machine(job, vmd, config, events, cancel)
        if ending:
            return ending
    stall_reminder(job, config)

    offered = tools.tool_names(job.phase, job.desktop)
    schemas = tools.schemas(job.os_family, job.phase, job.desktop)
    pinned = PinnedContext(task_list=job.tasks_text or "(no tasks planned yet)", verification=job.verification)
    job.messages, compacted = compactor.maybe_compact(job.messages, schemas, pinned)
    if compacted:
        events.emit({"type": "status", "text": "compacted the conversation to stay within the model's context"})

    reply = llm.chat(job.messages, tools=schemas, retry_until=_deadline_at(job, config))
    job.steps += 1
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
    # Ollama's tool-calling docs say; only the newest is kept (llm.only_latest_thinking).
    job.messages = only_latest_thinking(job.messages + [reply.as_message(with_thinking=True)])

    sees_images = llm.sees_images()
    for call in reply.tool_calls:
        outcome = _call_tool(job, vmd, call.name, call.arguments, offered, config, events, notice, sees_images)
        notice = ""
        if outcome.state in ("question", "unfreeze"):
            return Ending(outcome.state, "The agent asked a person and waits for the answer; "
                                         "the machine is kept suspended.")
        if outcome.state == "finished":
            return Ending("done", "The agent finished and vmd accepted it.")
    return None


def _call_tool(job: Job, vmd: SessionLink, name: str, arguments: Any, offered: list[str],
               config: AgentConfig, events: Events, notice: str = "",
               sees_images: bool = True) -> tools.ToolOutcome:
    """Run one tool call and put its result in the history, capped, with any notice."""
    verb = tools._tool_name(name)
    parsed = tools.parse_arguments(verb, arguments) if verb in tools.TOOLS else None
    params = parsed.params if parsed is not None and parsed.ok else None
    if verb == "run" and params:
        events.emit({"type": "command", "command": params["command"]})
    elif verb in tools.TOOLS:
        events.emit({"type": "status", "text": f"{verb}"})
    if verb == "finish" and params and params.get("verification"):
        job.verification = params["verification"].get("command")

    try:
        # A model without vision gets the screen read as text (vmagent/tool_results.py).
        outcome = tools.call(vmd, name, arguments, offered=offered, sees_images=sees_images)
    except ResultLost as lost:
        # vmd restarted while this call was in flight and the session is re-attached.
        template = RESULT_LOST_RUN if verb == "run" else RESULT_LOST
        outcome = tools.ToolOutcome(template.format(verb=verb or name, seconds=lost.seconds), verb=verb, ok=False)

    text = outcome.text
    if verb == "run" and outcome.ok and outcome.result:
        text += repeat_notice(job, params or {}, outcome.result, config)
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
    job.messages = drop_old_images(job.messages, config.keep_images)
    return outcome


def _hand_over_machine(job: Job, vmd: SessionLink, config: AgentConfig, events: Events,
                       cancel: threading.Event) -> Ending | None:
    """Phase two: wait for the guest, tell the agent what it has, offer every tool."""
    events.emit({"type": "status", "text": "plan made; waiting for the machine"})
    waited = time.monotonic()
    while True:
        left = min(config.boot_wait_s - (time.monotonic() - waited), config.deadline_s - job.active_seconds())
        try:
            ready = vmd.call("session_ready", timeout=max(1.0, min(READY_SLICE_S, left)), desktop=False)
            break
        except VmdError as exc:
            still_booting = exc.code == NOT_READY and vmd.call("session_status").get("machine") == "booting"
            if not still_booting:
                return Ending("failed", f"The machine could not be used: {exc.message}")
            if cancel.is_set():
                return Ending("cancelled", "Cancelled by the user while the machine booted.")
            if left <= READY_SLICE_S:
                return Ending("failed", f"The machine was still booting {time.monotonic() - waited:.0f} s "
                                        f"after the plan was made; stopped waiting. ({exc.message})")
    facts = ready.get("facts") or {}
    job.boot_seconds = ready.get("seconds")
    job.desktop = facts.get("desktop") is True or job.os_family == "windows"
    if job.desktop:  # the screen part of the prompt joins once a desktop is known to exist
        job.messages[0] = {"role": "system", "content": _system_prompt(job, config_desktop=True)}
    job.phase = "working"
    events.emit({"type": "status", "text": f"machine up after {job.boot_seconds or 0:.0f} s"})
    job.messages.append({"role": "user", "content": _machine_up_message(job, ready, facts)})
    return None


def _end(job: Job, vmd: SessionLink, ending: Ending, events: Events, llm: LLM | None = None) -> Outcome:
    """The one way out. Closes the session unless it waits for a person, then reports.

    Its calls go through the link: a vmd that restarts right now is waited for, unless
    the loop already gave up on it (then one try each) or the job was cancelled."""
    reason_at = len(job.notes)
    job.notes.append(ending.reason)
    job.notes += outage_notes(vmd.outages, llm.outages if llm is not None else [])
    question = None
    push = None
    reachable, vmd_error = bool(job.session_id), None if job.session_id else "no session was opened"
    try:
        if reachable and ending.state in ("question", "unfreeze"):
            status = vmd.call("session_status")
            question = status.get("question") if ending.state == "question" else status.get("unfreeze_request")
        elif reachable:
            if ending.state == "cancelled":
                _quietly(vmd, "session_cancel")
            closed = _quietly(vmd, "session_close")
            if closed is None:
                job.notes.append("vmd could not close the session (commit and push); see its log.")
            elif isinstance(closed.get("push"), dict):
                push = closed["push"]
    except VmdUnavailable as exc:
        reachable, vmd_error = False, str(exc)
    except VmdError as exc:
        vmd_error = str(exc)
    report, verification = vmd_report(vmd) if reachable else (None, Verification())
    if ending.state == "done" and verification.passed is False:
        # vmd takes a finish whose check keeps failing only to end the session as failed.
        runs = verification.attempts
        ending = Ending("failed", "The agent finished, and vmd ended the session as failed: its "
                                  f"check did not pass ({runs} verification run{'s' if runs != 1 else ''} "
                                  "in all).")
        job.notes[reason_at] = ending.reason
    if report is None:
        report = local_report(job, ending, vmd_error or "vmd could not build the report")
    else:
        report += loop_notes(job)
    job.state, job.question = ending.state, question
    save_quietly(job)
    outcome = Outcome(state=ending.state, report=report, session_id=job.session_id, question=question,
                      verification_passed=verification.passed, verification=verification, steps=job.steps,
                      push=push)
    state_event: Event = {"type": "state", "state": ending.state}
    if question:
        state_event["question"] = question
    events.emit(state_event)
    events.emit({"type": "done", "outcome": outcome.model_dump()})
    vmd.close()
    return outcome


def _end_without_session(job: Job, events: Events, reason: str) -> Outcome:
    job.notes.append(reason)
    report = local_report(job, Ending("failed", reason), None)
    job.state = "failed"
    save_quietly(job)
    outcome = Outcome(state="failed", report=report, session_id=job.session_id, question=None,
                      verification_passed=None, verification=Verification(), steps=job.steps)
    events.emit({"type": "state", "state": "failed"})
    events.emit({"type": "done", "outcome": outcome.model_dump()})
    return outcome


# --- guards ---------------------------------------------------------------------------


def cancelled(cancel: threading.Event) -> Ending | None:
    # Checked every turn: a person who cancels gets the report of what was done so far.
    if cancel.is_set():
        return Ending("cancelled", "Cancelled by the user.")
    return None


def past_deadline(job: Job, config: AgentConfig) -> Ending | None:
    # The promise made to the person is a result within the deadline, not a longer try.
    if job.active_seconds() >= config.deadline_s:
        return Ending("failed", f"Stopped at the session deadline ({config.deadline_s / 60:.0f} min of work).")
    return None


def at_step_cap(job: Job, config: AgentConfig) -> Ending | None:
    # Past the cap the bench's sessions were going in circles; a report helps more.
    if job.steps >= config.max_steps:
        return Ending("failed", f"Stopped at the step cap ({config.max_steps} model turns) without a finish.")
    return None


def machine_gone(status: dict) -> Ending | None:
    # A failed or destroyed guest will not come back in this session; every further
    # turn would only collect errors. The project folder is on the host and is kept.
    machine = str(status.get("machine") or "")
    if machine.startswith("failed") or (machine == "destroyed" and status.get("state") != "closed"):
        return Ending("failed", f"The machine is gone ({machine}); the project folder was kept.")
    return None


def model_unfit(llm: LLM) -> str | None:
    """Why the model cannot run a job, as a sentence for the report; None when it can."""
    try:
        capabilities = llm.capabilities()
    except OllamaError as exc:
        return f"The job could not start: {exc}"
    # An empty list: an Ollama too old to report capabilities; the first chat will tell.
    if capabilities and "tools" not in capabilities:
        return (f"The job could not start: the model {llm.model} cannot call tools (Ollama lists its "
                f"capabilities as {', '.join(capabilities)}), and the agent works only through tool "
                f"calls. Set VMAGENT_MODEL to a model with tool calling, such as qwen3-vl:32b (tools "
                f"and vision), and pull it with `ollama pull` on the Ollama server. No machine was started.")
    return None


def calls_written_as_text(job: Job, reply: Reply) -> tuple[Reply, str]:
    """A reply with no tool_calls whose content holds calls as text: the calls, run as
    calls (any known tool, so that one of the other phase gets its sentence from
    tools.call), and the notice to use the tool interface, given once per job."""
    if reply.tool_calls:
        return reply, ""
    recovered = calls_in_text(reply.content, tools.TOOLS)
    if not recovered:
        return reply, ""
    # The history shows them as real calls, so the model is not shown its own habit.
    reply = reply.model_copy(update={"tool_calls": recovered, "content": ""})
    if job.guards.told_tool_interface:
        return reply, ""
    job.guards.told_tool_interface = True
    return reply, USE_THE_TOOL_INTERFACE


def prose_only(job: Job, content: str, config: AgentConfig) -> Ending | None:
    # Work happens only through tool calls. Small models drift into describing what they
    # would do; a nudge with the task list brings most back, three ignored ones mean the
    # model has lost the tool protocol.
    job.guards.prose_streak += 1
    if job.guards.prose_streak > config.max_prose_replies:
        return Ending("failed", f"The model answered {job.guards.prose_streak} times in a row without a "
                                "tool call after being reminded; stopped.")
    job.messages.append({"role": "assistant", "content": content})
    job.messages.append({"role": "user", "content": (
        "You replied without a tool call, and nothing happens without one. Call the tool for "
        "your next step now. If every task is done or blocked, call finish with a verification "
        "command.\n\nThe task list:\n" + (job.tasks_text or "(no tasks planned yet: call plan_tasks)"))})
    return None


def repeat_notice(job: Job, params: dict, result: dict, config: AgentConfig) -> str:
    # Models poll: the same command with the same result, again and again. The count is
    # of identical results (exit code and output), so a changing build log is not one.
    key = json.dumps([params.get("command"), params.get("cwd"), result.get("exit_code"),
                      result.get("stdout"), result.get("stderr")], ensure_ascii=False, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    count = job.guards.repeats.get(digest, 0) + 1
    job.guards.repeats[digest] = count
    if count < config.repeat_notice_after:
        return ""
    return (f"\n[vmagent: this command has given this same result {count} times. Running it again "
            "will not change it: read the output, change the approach, or mark the task blocked "
            "with the reason.]")


def stall_reminder(job: Job, config: AgentConfig) -> None:
    # A task list that has not moved for many steps usually means the agent forgot it,
    # or is stuck on one task; showing it again is cheap.
    if job.guards.steps_since_tasks_moved < config.stall_reminder_steps:
        return
    job.guards.steps_since_tasks_moved = 0
    job.messages.append({"role": "user", "content": (
        f"[vmagent: the task list has not changed in {config.stall_reminder_steps} steps.] Check it "
        "against what you have done: mark finished tasks done (with how you verified them), mark "
        "a task blocked if it cannot be done, or change approach.\n\n" + (job.tasks_text or "(no tasks)"))})


# --- pieces -------------------------------------------------------------------------------


def _config_for(spec: JobSpec, config: AgentConfig | None) -> AgentConfig:
    config = config or AgentConfig.load()
    if spec.model:
        config = config.model_copy(update={"model": spec.model})
    return config


def _system_prompt(job: Job, config_desktop: bool) -> str:
    prompts = load_prompts(job.os_family, desktop=config_desktop)
    for warning in prompts.warnings:
        log.warning("%s", warning)
    return prompts.system


def _opening_message(spec: JobSpec, opened: dict) -> str:
    where = tools.OS_WORDS[tools.os_family_of(spec.os)]
    storage = opened.get("storage") or ""
    return (
        f"The task:\n\n{spec.task.strip()}\n\n"
        f"A {spec.os} machine is booting for you now ({where['shell']}; the project folder "
        f"will be {where['project']}). {('Storage: ' + storage + '.') if storage else ''}\n"
        "First write the task list with plan_tasks: short, checkable steps in the order you "
        "will do them, the last one the check that proves the result. The machine's tools "
        "appear once the plan exists and the machine is up."
    )


def _machine_up_message(job: Job, ready: dict, facts: dict) -> str:
    shown = {k: v for k, v in facts.items() if v not in (None, "", [], {}) and k != "boot_id"}
    lines = [f"The machine is up: it took {job.boot_seconds or 0:.0f} s to boot."]
    lines += [f"- {k}: {v}" for k, v in shown.items()]
    offered = tools.tool_names("working", job.desktop)
    lines.append(f"All tools are available now: {', '.join(offered)}.")
    lines.append("Work through the task list, keeping it true as you go:\n" + (job.tasks_text or ""))
    return "\n".join(lines)


def _answer_text(answer: str | None, approved: bool | None) -> str:
    if approved is not None:
        return f"The person {'approved' if approved else 'declined'} your request." + (
            f" They said: {answer}" if answer else "")
    return f"The person answered: {answer or '(no answer given)'}"


def _show_status(job: Job, status: dict, events: Events) -> None:
    tasks_text = str(status.get("tasks") or "")
    if tasks_text != job.guards.last_tasks:
        job.guards.last_tasks = tasks_text
        job.guards.steps_since_tasks_moved = 0
        if tasks_text:
            events.emit({"type": "tasks", "text": tasks_text})
    elif job.steps:
        job.guards.steps_since_tasks_moved += 1
    job.tasks_text = tasks_text
    line = str(status.get("status_line") or "")
    if line and line != job.status_line:
        job.status_line = line
        events.emit({"type": "status", "text": line})


def _deadline_at(job: Job, config: AgentConfig) -> float:
    """The job's deadline on time.monotonic()'s clock: a model that is away is not waited
    for past it."""
    return time.monotonic() + max(0.0, config.deadline_s - job.active_seconds())


def _note(vmd: SessionLink, turn: int, text: str) -> None:
    try:
        vmd.call("note", turn=turn, text=text[:4000])
    except VmdError as exc:  # the record misses a line; the work goes on
        log.warning("vmd refused a note: %s", exc)


def _quietly(vmd: SessionLink, verb: str) -> dict | None:
    """One of `_end`'s calls; vmd's refusal is logged, vmd gone (VmdUnavailable) is raised."""
    try:
        return vmd.call(verb)
    except VmdError as exc:
        log.warning("%s failed: %s", verb, exc)
        return None
