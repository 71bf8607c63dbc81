"""The session verbs: is the machine ready, where does the session stand, cancel, a
person's answer (session_resume), the live preview's look (peek), notes and the report."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING

from vmd.contract.errors import NOT_READY
from vmd.contract.params import Answer, Note, SessionReady, SessionStatus, WebSource
from vmd.contract.policy import WAITING_STATES
from vmd.errors import VerbError, refused
from vmd.session.report import build_report

if TYPE_CHECKING:
    from vmd.session.session import Session

# How old a look the live preview (peek) takes instead of a new screenshot: the agent's
# own screenshot of a moment ago is shown as it is, not captured and encoded a second
# time (vmd/machines/screen.py `Screen.screenshot(max_age=...)`). A second is well under the
# preview's tick (vmagent's screen_watch_s, 5 s by default), so it shows nothing staler
# than its own pace would. The agent's screenshot verb always takes the screen now.
PEEK_MAX_AGE_S = 1.0


def session_ready(session: Session, p: SessionReady, notify) -> dict:
    started = time.monotonic()
    if not session.boot_done.wait(p.timeout):
        raise VerbError(f"the machine is still booting ({time.time() - session.s.created:.0f} s since the "
                        "session opened); call session_ready again — planning verbs work meanwhile.",
                        NOT_READY)
    machine = session.ready_machine()
    if session.needs_ready:
        raise refused("the machine is suspended while the session waits for a person; session_resume wakes it.")
    facts = session.s.facts
    if p.desktop and not session.desktop_ready:
        left = max(1.0, p.timeout - (time.monotonic() - started))
        facts = machine.ready(left, desktop=True)
        session.desktop_ready = True
        with session.lock:
            session.s.facts = facts
            session.save()
    seconds = session.s.boot_seconds or 0.0
    how = ("a warm machine handed out" if session.s.machine_came == "warm" else "to boot")
    return {"ready": True, "seconds": seconds, "facts": facts, "came": session.s.machine_came,
            "text": f"The machine is ready ({seconds:.0f} s, {how}): {facts.get('os', session.s.os)}; "
                    f"project folder at {facts.get('project_path', '-')}{_project_note(session)}."}


def _project_note(session: Session) -> str:
    return "" if session.s.project_dir else " (this session has no project folder)"


def _minutes(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60} m {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def session_status(session: Session, p: SessionStatus, notify) -> dict:
    if p.turns is not None:  # the agent's counts (vmd/contract/params.py SessionStatus); kept with the next save
        with session.lock:
            session.s.turns, session.s.tool_calls = p.turns, p.tool_calls
    return status(session)


def counts_text(turns: int | None, tool_calls: int, steps: int) -> str:
    """The counts as people read them: the agent's turns and tool calls when it told them,
    else the calls vmd served."""
    if turns is not None:
        return f"{_count(turns, 'turn')}, {_count(tool_calls, 'tool call')}"
    return _count(steps, "call")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def status(session: Session) -> dict:
    s = session.s
    if session.boot_error:
        machine = f"failed: {session.boot_error}"
    elif s.state == "closed":
        machine = "destroyed"
    elif s.state in WAITING_STATES:
        machine = "suspended"
    elif session.boot_done.is_set() and session.machine is not None:
        machine = "ready" if session.machine_alive() else "destroyed"
    else:
        machine = "booting"
    parts = [s.state, f"machine {machine.split(':')[0]}"]
    if s.machine_came and s.boot_seconds is not None:
        parts[-1] += f" ({s.machine_came}, {s.boot_seconds:.1f} s)"
    parts.append(session.tasks.summary_line() if session.tasks.planned else "no plan yet")
    parts += [counts_text(s.turns, s.tool_calls, s.steps), _count(s.runs, "run"), _minutes(time.time() - s.created)]
    if s.outcome:
        parts.append(f"verification exit {s.outcome['exit_code']}"
                     f" ({'passed' if s.outcome['passed'] else 'failed'})")
    push = s.push.view() if s.push else None
    if push:
        parts.append({"pending": f"push pending ({push['attempts']} tries so far)",
                      "pushed": "pushed", "failed": "push failed"}[push["state"]])
    detached = session.detached_for()
    return {"session_id": s.id, "state": s.state, "planned": session.tasks.planned,
            "push": push, "clients": session.clients,
            "detached_s": None if detached is None else round(detached, 1),
            "ended_by": (s.close or {}).get("ended_by"), "reason": (s.close or {}).get("reason"),
            "tasks": session.tasks.render(), "status_line": " · ".join(parts),
            "question": s.question if s.state == "question" else "",
            "unfreeze_request": s.unfreeze_request if s.state == "unfreeze" else "",
            "cancelled": s.cancelled, "steps": s.steps, "turns": s.turns, "tool_calls": s.tool_calls,
            "machine": machine,
            "machine_came": s.machine_came, "machine_seconds": s.boot_seconds, "came_note": s.came_note,
            "outcome": s.outcome, "text": " · ".join(parts)}


def session_cancel(session: Session, p, notify) -> dict:
    with session.lock:
        if session.s.state != "closed":
            session.s.state = "cancelled"
        session.s.cancelled = True
        session.save()
    return {"cancelled": True, "text": "The session is cancelled: stop working; session_close commits "
                                       "the project folder and ends it."}


def session_resume(session: Session, p: Answer, notify) -> dict:
    with session.lock:
        state = session.s.state
        if state not in WAITING_STATES:
            raise refused(f"the session is {state}, not waiting for an answer; nothing to resume.")
    # After a vmd restart the machine is re-attached by a thread that session_attach
    # started; resuming before it is done would skip waking the paused guest.
    session.boot_done.wait(session.boot_timeout)
    machine = session.machine
    session.kept_frame = None  # the guest draws again
    if machine is not None:
        machine.resume()
        if session.needs_ready:
            session.s.facts = machine.ready(session.boot_timeout)
            session.needs_ready = False
            if session.s.resume_state == "booting":  # the boot ended while the session waited
                session.s.resume_state = "ready"
    problem = None
    with session.lock:
        if state == "question":
            session.s.answer = p.answer
            text = f"The user answered your question ({session.s.question!r}): {p.answer}"
            session.s.question = ""
        else:
            approved = bool(p.approved)
            text = (f"The user {'approved' if approved else 'declined'} your request "
                    f"({session.s.unfreeze_request!r})." + (f" They said: {p.answer}" if p.answer else ""))
            problem = session.machines.egress_problem() if approved else None
            if problem:
                # An approval is not turned into an unguarded network (vmd/machines/egress_guard.py).
                text += (f" But vmd cannot open network egress on this host: {problem}. The machine stays "
                         f"offline; go on without the network, or tell the user what the operator must fix.")
            elif approved:
                session.s.egress = True
                if machine is not None:  # every SessionMachine can (vmd/machines/port.py)
                    machine.set_egress(True)
                    text += " Network egress is open now (the internet only: not this host or its networks)."
                else:  # no machine yet: the one that boots is made with egress open
                    text += " Network egress will be open on the machine (the internet only)."
            session.s.unfreeze_request = ""
        session.s.state = session.s.resume_state if session.s.resume_state in ("booting", "ready", "finished") else "ready"
        session.save()
    session.record.append("answer", state=state, answer=p.answer, approved=p.approved,
                          **({"egress_refused": problem} if problem else {}))
    return {"state": session.s.state, "text": text}


def peek(session: Session, p, notify) -> dict:
    machine = session.machine
    kept = session.kept_frame
    if session.s.state in WAITING_STATES and kept is not None:
        return {"available": True, "kept": True, "png_base64": base64.b64encode(kept.png).decode(),
                "width": kept.width, "height": kept.height,
                "text": "the screen as it was when the session stopped to wait for a person."}
    if (session.s.state not in ("ready", "finished") or machine is None or not session.boot_done.is_set()
            or session.boot_error):
        return {"available": False, "text": f"no screen to show while the session is {session.s.state}."}
    shot = machine.screen.screenshot(max_age=PEEK_MAX_AGE_S)
    return {"available": True, "png_base64": base64.b64encode(shot.png).decode(),
            "width": shot.width, "height": shot.height, "text": "the screen now."}


def note(session: Session, p: Note, notify) -> dict:
    session.record.append("note", turn=p.turn, text=p.text)
    return {"ok": True, "text": "noted."}


def web_source(session: Session, p: WebSource, notify) -> dict:
    session.record.append("web", source=p.kind, target=p.target, title=p.title, detail=p.detail, ok=p.ok)
    return {"ok": True, "text": "recorded."}


def report(session: Session, p, notify) -> dict:
    built = build_report(session.record.path, events=session.record.events())
    return {"markdown": built.markdown, "outcome": built.outcome}


HANDLERS = {
    "session_ready": session_ready,
    "session_status": session_status,
    "session_cancel": session_cancel,
    "session_resume": session_resume,
    "peek": peek,
    "note": note,
    "web_source": web_source,
    "report": report,
}
