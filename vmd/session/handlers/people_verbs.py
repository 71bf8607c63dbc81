"""The people verbs: ask_user and request_unfreeze stop the session until a person
answers (session_resume); the machine is suspended meanwhile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmd.contract.params import AskUser, RequestUnfreeze
from vmd.contract.policy import WAITING_STATES
from vmd.errors import sentence

if TYPE_CHECKING:
    from vmd.session.session import Session


def _wait_for_person(session: Session, state: str, field: str, value: str) -> None:
    with session.lock:
        if session.s.state not in WAITING_STATES:
            session.s.resume_state = session.s.state
        session.s.state = state
        setattr(session.s, field, value)
        session.save()
    if session.machine is not None and session.boot_done.is_set() and not session.boot_error:
        _keep_frame(session)
        try:
            session.machine.suspend()
        except Exception as exc:  # the question stands even if the guest would not pause
            session.record.append("machine", event="suspend_failed", error=sentence(exc, "suspend failed"))


def _keep_frame(session: Session) -> None:
    """The screen the person should see beside the question: taken before the guest is
    paused, so the preview shows what the agent was looking at, not a blank."""
    try:
        session.kept_frame = session.machine.screen.screenshot()
    except Exception as exc:  # no screen, or it would not answer: the question stands without one
        session.kept_frame = None
        session.record.append("machine", event="frame_not_kept", error=sentence(exc, "screenshot failed"))


def ask_user(session: Session, p: AskUser, notify) -> dict:
    _wait_for_person(session, "question", "question", p.question)
    return {"state": "question", "text": "Your question is with the user. Stop here: the session "
                                         "resumes with their answer."}


def request_unfreeze(session: Session, p: RequestUnfreeze, notify) -> dict:
    _wait_for_person(session, "unfreeze", "unfreeze_request", p.reason)
    return {"state": "unfreeze", "text": "Your request is with the user. Stop here: the session "
                                         "resumes when they decide."}


HANDLERS = {
    "ask_user": ask_user,
    "request_unfreeze": request_unfreeze,
}
