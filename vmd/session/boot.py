"""A session's machine: started in the background, stopped by the session's end.

`start_machine` boots (or, for a session vmd loads from disk, re-binds) the machine in a
thread, so that session_open answers at once and planning goes on while the guest comes
up. `stop_machine` is the close's half: it destroys the machine whatever the boot is
doing. The two meet through the session's `ending` event: a boot that sees it stops at
its next step and destroys what it made, and the record says the session ended before
the machine was ready, not that the machine failed.

Functions of the session (vmd/session/session.py `Session`): they read and set its `machine`,
`boot_done`, `boot_error`, `ending`, `destroyed` and `boot_stopped` under its lock.
"""

from __future__ import annotations

import threading
import time

from vmd.contract.policy import WAITING_STATES
from vmd.errors import sentence
from vmd.machines.port import SessionMachine
from vmd.session.session import Session

# How long a close waits for a boot in progress to stop: a create under way (qemu-img, the
# domain's definition and start: seconds) must return before its domain can be destroyed,
# and a boot waiting for SSH notices its destroyed guest within its connect timeout (10 s).
BOOT_STOP_WAIT_S = 60.0
ENDED_BEFORE_READY = "the session ended before the machine was ready"


def start_machine(session: Session, attach: bool) -> None:
    """Boots (attach=False) or re-binds (attach=True) the machine in the background;
    `session.boot_done` is set when that is over, `boot_error` says why it failed."""
    session.boot_done.clear()
    session.boot_error = None
    threading.Thread(target=_boot, args=(session, attach), name=f"boot-{session.s.id}", daemon=True).start()


def _boot(session: Session, attach: bool) -> None:
    """Creates (or re-binds) the machine and waits until it answers. A close that began
    meanwhile (`ending`) stops it at its next step: what was made is destroyed, and the
    record says the session ended before the machine was ready, not that it failed."""
    s = session.s
    started = time.monotonic()
    machine = None
    try:
        if session.ending.is_set():
            _stopped(session, created=False)
            return
        spec = session.spec()
        machine = session.machines.attach(spec) if attach else session.machines.create(spec)
        with session.lock:
            ending = session.ending.is_set()
            if not ending:
                session.machine = machine
            s.machine_created = True
            if not attach:
                # A warm machine keeps its slot's domain name: the sweep, a close and the
                # next vmd find it by the name kept here.
                s.machine_name = machine.name or s.machine_name
                s.machine_came = machine.came or "cold"
                s.came_note = machine.came_note
            suspended = s.state in WAITING_STATES
            session.save()
        if ending:  # made after the close began: the close did not see it, so it goes here
            destroy(session, machine)
            _stopped(session, created=True)
            return
        if suspended:
            session.needs_ready = True
            session.record.append("machine", event="attached", suspended=True)
            return
        facts = machine.ready(session.boot_timeout)
        with session.lock:
            ending = session.ending.is_set()
            if not ending:
                s.facts = facts
                if s.boot_seconds is None or attach:
                    s.boot_seconds = round(time.monotonic() - started if attach else time.time() - s.created, 1)
                if s.state == "booting":
                    s.state = "ready"
                    s.resume_state = "ready"
                elif s.resume_state == "booting":  # a question asked while it booted goes back to ready
                    s.resume_state = "ready"
                session.save()
        if ending:
            _stopped(session, created=True)
            return
        session.record.append("machine", event="attached" if attach else "ready", seconds=s.boot_seconds,
                              facts=facts, came=s.machine_came, note=s.came_note)
    except Exception as exc:
        if session.ending.is_set():
            # The close destroyed the guest under the boot (its SSH wait fails: EOFError,
            # "stopped while booting"), or a create cut short: not the machine's fault.
            if machine is None and not attach:
                _discard(session)
            _stopped(session, created=machine is not None, error=sentence(exc, "the boot stopped"))
            return
        session.boot_error = sentence(exc, "the machine could not be started")
        session.record.append("machine", event="gone" if attach else "failed", error=session.boot_error,
                              duration=round(time.monotonic() - started, 3))
    finally:
        session.boot_done.set()


def _stopped(session: Session, created: bool, error: str | None = None) -> None:
    """The record of a boot that the session's end stopped."""
    session.boot_stopped = True
    text = ENDED_BEFORE_READY + ("; vmd destroyed what it had started" if created
                                 else "; no machine had been started yet")
    session.record.append("machine", event="stopped", created=created, text=text, cause=error)
    with session.lock:
        close = session.s.close
        if close is not None and created and session.destroyed and not close.get("machine_destroyed"):
            # The close answered before this boot's create returned; now it is gone too.
            session.s.close = {**close, "machine_destroyed": True,
                               "machine": "destroyed after the close: its create had not returned yet"}
            session.save()


def destroy(session: Session, machine: SessionMachine) -> str | None:
    """Destroys `machine`; None when done, else why not (also in the record)."""
    try:
        machine.destroy()
    except Exception as exc:
        problem = sentence(exc, "destroy failed")
        session.record.append("machine", event="destroy_failed", error=problem)
        return problem
    with session.lock:
        session.destroyed = True
    return None


def _discard(session: Session) -> None:
    """What a create cut short may have left in libvirt goes too."""
    try:
        if session.machines.discard(session.spec()):
            with session.lock:
                session.destroyed = True
    except Exception as exc:
        session.record.append("machine", event="destroy_failed", error=sentence(exc, "destroy failed"))


def stop_machine(session: Session, wait: float | None = None) -> tuple[bool, str]:
    """Ends the machine whatever the boot is doing: destroys it if it is there, makes
    a boot in progress stop and destroy what it makes, and waits (at most `wait` s) for
    that. Returns (whether a machine was destroyed, what became of it in words)."""
    with session.lock:
        session.ending.set()
        machine, session.machine = session.machine, None
        was_ready = session.boot_done.is_set() and session.boot_error is None
    if machine is not None:
        problem = destroy(session, machine)
        if problem:
            return False, f"not destroyed: {problem}"
    wait = BOOT_STOP_WAIT_S if wait is None else wait
    if not session.boot_done.wait(wait):
        if session.destroyed:
            return True, "destroyed before it was ready"
        return False, ("still being created after the close waited "
                       f"{wait:.0f} s: vmd destroys it as soon as libvirt hands it over")
    if not session.destroyed and machine is None and session.s.machine_created and session.boot_error:
        # A machine of an earlier vmd that this one could not re-bind: one more look.
        try:
            problem = destroy(session, session.machines.attach(session.spec()))
        except Exception:
            return False, "gone already"
        if problem:
            return False, f"not destroyed: {problem}"
    if not session.destroyed:
        return False, "never started" if not session.s.machine_created else "gone already"
    return True, "destroyed" if was_ready else "destroyed before it was ready"
