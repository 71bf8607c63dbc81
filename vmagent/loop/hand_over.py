"""The machine phase: once a plan exists, the guest is waited for (vmd's `session_ready`,
asked in slices so a cancel is seen while it boots) and the agent is told, in a message,
what it has: the machine's facts, whether it has a desktop (with the screen's rules when
the system prompt does not hold them) and the task list. Called from the turn loop
(vmagent/loop/turns.py `_turn`) on the first turn after the plan."""

from __future__ import annotations

import threading
import time

from vmagent.config import AgentConfig
from vmagent.link import SessionLink, VmdError
from vmagent.loop.job import Ending, Events, Job
from vmagent.loop.words import machine_facts, machine_up_message
from vmagent.prompts import load_prompts
from vmd.contract.errors import NOT_READY

# session_ready is asked in slices so that a cancel is seen while the guest boots.
READY_SLICE_S = 30.0


def hand_over_machine(job: Job, vmd: SessionLink, config: AgentConfig, events: Events,
                       cancel: threading.Event) -> Ending | None:
    """Phase two: wait for the guest, then tell the agent what it has, in a message."""
    events.emit({"type": "status", "text": "plan made; waiting for the machine"})
    waited = time.monotonic()
    while True:
        left = min(config.boot_wait_s - (time.monotonic() - waited), config.deadline_s - job.active_seconds())
        try:
            ready = vmd.call("session_ready", timeout=max(1.0, min(READY_SLICE_S, left)), desktop=False)
            break
        except VmdError as exc:
            still_booting = exc.code == NOT_READY and vmd.call("session_status").machine == "booting"
            if not still_booting:
                return Ending("failed", f"The machine could not be used: {exc.message}")
            if cancel.is_set():
                return Ending("cancelled", "Cancelled by the user while the machine booted.")
            if left <= READY_SLICE_S:
                return Ending("failed", f"The machine was still booting {time.monotonic() - waited:.0f} s "
                                        f"after the plan was made; stopped waiting. ({exc.message})")
    facts = ready.facts.model_dump()  # shown to the model as they are (vmagent/loop/words.py)
    job.boot_seconds = ready.seconds
    job.machine_came = ready.came
    # A guest whose image said it has no desktop is offered no screen tools all job long
    # (the fixed prompt is decided at the start), whatever its facts say now.
    job.desktop = (ready.facts.desktop or job.os_family == "windows") and job.screen is not False
    # The screen's rules come with the hand-over when the desktop was not known at the
    # start; the system prompt is never written again (the head of every request).
    screen_rules = None
    if job.desktop and job.screen is None:
        screen_rules = load_prompts(job.os_family, desktop=False, config=config).screen
    job.phase = "working"
    came = f" ({job.machine_came})" if job.machine_came else ""
    events.emit({"type": "status", "text": f"machine up after {job.boot_seconds or 0:.0f} s{came}"})
    if job.machine_came:  # the job API's `machine` (vmagent/service/workers.py)
        events.emit({"type": "machine", "came": job.machine_came, "seconds": job.boot_seconds})
    job.machine_text = machine_facts(job, facts, screen_rules)  # restated by a compaction
    job.messages.append({"role": "user", "content": machine_up_message(job, facts, screen_rules)})
    return None
