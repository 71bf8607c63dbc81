"""The end of a job, the one way out of the turn loop (vmagent/loop/turns.py): unless the
session waits for a person, vmd closes it (`vmagent eval`'s hidden check first, then
commit and push) and the report is vmd's, built from its record, with the loop's notes on
why it ended (vmagent/loop/fallback_report.py); the outcome goes to the transcript and the
event feed. A job that never opened a session ends with the loop's own report."""

from __future__ import annotations

import logging
from dataclasses import asdict

from vmagent.link import SessionLink, VmdError, VmdUnavailable
from vmagent.loop.fallback_report import local_report, loop_notes, outage_notes, vmd_report
from vmagent.loop.job import Ending, Event, Events, Job, Outcome, Verification, save_quietly
from vmagent.models import Model
from vmd.contract.policy import WAITING_STATES
from vmd.contract.results import Result

log = logging.getLogger(__name__)


def end_job(job: Job, vmd: SessionLink, ending: Ending, events: Events, llm: Model | None = None) -> Outcome:
    """The one way out. Closes the session unless it waits for a person, then reports.

    Its calls go through the link: a vmd that restarts right now is waited for, unless
    the loop already gave up on it (then one try each) or the job was cancelled."""
    reason_at = len(job.notes)
    job.notes.append(ending.reason)
    job.notes += outage_notes(vmd.outages, llm.outages if llm is not None else [])
    question = None
    push = hidden = None
    reachable, vmd_error = bool(job.session_id), None if job.session_id else "no session was opened"
    # The loop's final counts go to vmd's record, whose report states them (vmd/session/report.py).
    counts = {"turns": job.steps, "tool_calls": job.tool_calls}
    try:
        if reachable and ending.state in WAITING_STATES:
            status = vmd.call("session_status", **counts)
            question = status.question if ending.state == "question" else status.unfreeze_request
        elif reachable:
            _quietly(vmd, "session_status", **counts)
            if ending.state == "cancelled":
                _quietly(vmd, "session_cancel")
            hidden = _hidden_check(job, vmd)
            closed = _quietly(vmd, "session_close")
            if closed is None:
                job.notes.append("vmd could not close the session (commit and push); see its log.")
            elif closed.push is not None:
                push = closed.push.model_dump()
    except VmdUnavailable as exc:
        reachable, vmd_error = False, str(exc)
    except VmdError as exc:
        vmd_error = str(exc)
    report, verification = vmd_report(vmd) if reachable else (None, Verification())
    if ending.state == "done" and verification.passed is False:
        # vmd takes a finish whose check keeps failing only to end the session as failed.
        ending = Ending("failed", "The agent finished, and vmd ended the session as failed: "
                                  f"{verification.reason()}.")
        job.notes[reason_at] = ending.reason
    if report is None:
        report = local_report(job, ending, vmd_error or "vmd could not build the report")
    else:
        report += loop_notes(job)
    job.state, job.question = ending.state, question
    save_quietly(job)
    outcome = Outcome(state=ending.state, report=report, session_id=job.session_id, question=question,
                      verification_passed=verification.passed, verification=verification, steps=job.steps,
                      tool_calls=job.tool_calls, push=push, reason=ending.reason, usage=asdict(job.usage), hidden_check=hidden)
    state_event: Event = {"type": "state", "state": ending.state}
    if question:
        state_event["question"] = question
    events.emit(state_event)
    events.emit({"type": "done", "outcome": outcome.model_dump()})
    vmd.close()
    return outcome


def end_without_session(job: Job, events: Events, reason: str) -> Outcome:
    job.notes.append(reason)
    report = local_report(job, Ending("failed", reason), None)
    job.state = "failed"
    save_quietly(job)
    outcome = Outcome(state="failed", report=report, session_id=job.session_id, question=None,
                      verification_passed=None, verification=Verification(), steps=job.steps, reason=reason,
                      tool_calls=job.tool_calls, usage=asdict(job.usage))
    events.emit({"type": "state", "state": "failed"})
    events.emit({"type": "done", "outcome": outcome.model_dump()})
    return outcome


def _hidden_check(job: Job, vmd: SessionLink) -> dict | None:
    """`vmagent eval`'s check, run by vmd in the guest after the model's last turn and before
    the close, so the model never sees it; None when the job has none."""
    check = job.spec.hidden_check
    if check is None:
        return None
    try:
        return vmd.call("hidden_check", **check.model_dump()).model_dump()
    except VmdError as exc:
        return {"error": str(exc)}


def _quietly(vmd: SessionLink, verb: str, **params) -> Result | None:
    """One of `end_job`'s calls; vmd's refusal is logged, vmd gone (VmdUnavailable) is raised."""
    try:
        return vmd.call(verb, **params)
    except VmdError as exc:
        log.warning("%s failed: %s", verb, exc)
        return None
