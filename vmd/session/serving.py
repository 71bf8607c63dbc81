"""Serving one verb of a session: the gate (the table `POLICY` of vmd/contract/policy.py says when a
session serves the verb and whether it is a step), the handler (vmd/session/handlers/),
the check of its result against the contract (vmd/contract/results.py), the count and the
record. The rules of the verbs themselves (finish refused while a task is open, the check
re-run by vmd) live in their handlers. A full disk on the host ends the session here: the
verb answers with that sentence (vmd/session/disk.py)."""

from __future__ import annotations

import time

from vmd.contract.errors import FAILED
from vmd.contract.params import Params
from vmd.contract.policy import POLICY, WAITING_STATES
from vmd.errors import VerbError, checked_result, refused, sentence
from vmd.session import disk
from vmd.session.handlers import HANDLERS
from vmd.session.handlers.end_verbs import close
from vmd.session.handlers.output import Notify
from vmd.session.session import Session


def serve(session: Session, verb: str, params: Params, notify: Notify | None = None) -> dict:
    """One verb of `session`, as a client called it: the gate, the handler, the check of its
    result against the contract, the count and the record; a full disk ends the session."""
    if not POLICY[verb].recorded:  # a watcher's look (peek): not a step, not in the record
        gate(session, verb)
        return checked_result(verb, HANDLERS[verb](session, params, notify))
    # Open when the verb came: a full disk found meanwhile (by this verb, or by the
    # reaper, which may end the session while the verb waits on a guest QEMU paused)
    # is what the agent hears, not the error the end left this verb with.
    was_open = session.s.state != "closed"
    try:
        result = _serve(session, verb, params, notify)
    except VerbError as exc:
        if _ends_on_full_disk(session, verb, was_open):
            raise _end_on_full_disk(session) from exc
        raise
    finally:
        session.track_waiting()
    if _ends_on_full_disk(session, verb, was_open):
        raise _end_on_full_disk(session)
    return result


def _ends_on_full_disk(session: Session, verb: str, was_open: bool) -> bool:
    return bool(session.disk_full) and verb != "session_close" and was_open


def _end_on_full_disk(session: Session) -> VerbError:
    """The host's disk is full: nothing more of this session can be recorded or saved,
    so vmd ends it (commit what it can, push, destroy), unless the reaper did already,
    and tells the agent why."""
    reason = session.disk_full or "the host's disk is full"
    closed = close(session, reason=reason)
    # The close's text starts with the reason again; the agent reads it once.
    body = closed["text"].removeprefix("already closed. ").removeprefix(f"vmd closed the session: {reason}. ")
    return VerbError(f"{reason}. vmd ended the session, as nothing more of it could be kept: "
                     f"{body} What was committed stays committed. Free space on the host, "
                     "then open a new session to carry on.")


def _serve(session: Session, verb: str, params: Params, notify: Notify | None) -> dict:
    started = time.monotonic()
    args = params.model_dump()
    try:
        gate(session, verb)
        result = checked_result(verb, HANDLERS[verb](session, params, notify))
    except VerbError as exc:
        session.count(verb)
        session.record.verb(verb, args, error=exc.message, code=exc.code,
                            duration=time.monotonic() - started)
        raise
    except Exception as exc:
        session.count(verb)
        message = sentence(exc, f"{verb} failed")
        if disk.full(exc):  # an OSError of this host (never a guest's own full disk)
            session.note_full(disk.sentence(f"{verb} could not write on the host", exc))
            message = session.disk_full or message
        if POLICY[verb].needs_machine and not session.machine_alive():
            message = ("the machine is gone (destroyed or crashed), so nothing more can run in this "
                       "session. The project folder is kept on the host: call session_close to "
                       f"commit it. ({message})")
        session.record.verb(verb, args, error=message, code=FAILED, duration=time.monotonic() - started)
        raise VerbError(message) from exc
    session.count(verb)
    session.record.verb(verb, args, result=_for_record(verb, result), duration=time.monotonic() - started)
    return result


def gate(session: Session, verb: str) -> None:
    """Refuses `verb` when the session's state or its lack of a plan says no (POLICY)."""
    policy, state = POLICY[verb], session.s.state
    if state == "closed" and policy.when_closed == "refuse":
        raise refused(f"session {session.s.id} is closed; read its report(), or open a new session to do more.")
    if state == "cancelled" and policy.when_cancelled == "refuse":
        raise refused("the session was cancelled; stop and call session_close.")
    if state in WAITING_STATES and policy.when_waiting == "refuse":
        waiting = session.s.question if state == "question" else session.s.unfreeze_request
        raise refused(f"the session waits for a person ({state}: {waiting!r}); the machine is "
                      "suspended until session_resume brings the answer.")
    if policy.needs_plan and not session.tasks.planned:
        raise refused(f"{verb} needs a plan first: call plan_tasks with the steps of the work (the "
                      "machine boots meanwhile), then use the machine.")


def _for_record(verb: str, result: dict) -> dict:
    """What the record keeps of a result: no file bodies, no images, short text."""
    if verb == "report":
        return {"outcome": result.get("outcome")}  # the report is built from the record itself
    kept = dict(result)
    if verb == "read_file":
        kept.pop("text", None)  # the body, again; `content` is summarised by the record
    if verb == "screenshot":
        kept.pop("png_base64", None)
    if verb in ("run",):
        kept.pop("text", None)  # stdout/stderr are kept (cut) on their own
    return kept
