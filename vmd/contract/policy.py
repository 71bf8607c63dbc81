"""When a session serves a verb: the session's states, and one row per verb (`POLICY`) that
the gate (vmd/session/serving.py `gate`) and the step count read, and nothing else decides.
The agent reads the same rows: which of its phases offers a verb as a tool
(`agent_phase`, vmagent/tools/table.py).

Pure pydantic, like the whole contract.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# A session's state, as session_status and session_attach report it and session.json keeps it.
SessionStateName = Literal["booting", "ready", "question", "unfreeze", "finished", "cancelled", "closed"]
# The states in which a session waits for a person (session_resume wakes it).
WAITING_STATES: tuple[str, ...] = ("question", "unfreeze")

# The gate asks in this order: closed, cancelled, waiting for a person, a plan; each
# refusal has its own sentence, saying what to do.

Rule = Literal["serve", "refuse"]
# The first phase of the agent that offers the verb to the model as a tool: "planning"
# (from the start), "working" (once the machine is up), "desktop" (working, on a guest
# with a desktop); None: not a tool of the model (session verbs, vmd's own reads).
AgentPhase = Literal["planning", "working", "desktop"]


class VerbPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    needs_machine: bool = False  # acts on the guest: an error there may mean the machine is gone
    needs_plan: bool = False  # refused until plan_tasks made a plan (the machine boots meanwhile)
    counts_as_step: bool = True  # False: a read of the session, not a step of the work
    recorded: bool = True  # False: not a verb of the session's record (a watcher's look, binding)
    # False: answered on any connection, with or without a session, from vmd's own state (its
    # handler is in vmd/session/handlers/ `SESSIONLESS`); never gated, counted or recorded in a session.
    session: bool = True
    when_closed: Rule = "refuse"
    when_cancelled: Rule = "serve"
    when_waiting: Rule = "serve"  # while a question or an unfreeze request waits for a person
    agent_phase: AgentPhase | None = None


# A machine verb: needs a live machine and a plan, and waits while the session does not go on.
_MACHINE = VerbPolicy(needs_machine=True, needs_plan=True, when_cancelled="refuse", when_waiting="refuse",
                      agent_phase="working")
_SCREEN = _MACHINE.model_copy(update={"agent_phase": "desktop"})
# Reads of the session: served whatever its state, never a step.
_READ = VerbPolicy(counts_as_step=False, when_closed="serve")
_PLANNING = VerbPolicy(agent_phase="planning")

POLICY: dict[str, VerbPolicy] = {
    # They bind the connection (vmd/session/handlers/opening_verbs.py): never gated, counted or recorded.
    "session_open": VerbPolicy(counts_as_step=False, recorded=False, when_closed="serve"),
    "session_attach": VerbPolicy(counts_as_step=False, recorded=False, when_closed="serve"),
    "session_ready": VerbPolicy(),
    "session_status": _READ,
    "session_cancel": VerbPolicy(when_closed="serve"),
    "session_close": VerbPolicy(when_closed="serve"),
    "session_resume": VerbPolicy(),  # its own rule: only a waiting session resumes
    "peek": _READ.model_copy(update={"recorded": False}),
    "report": _READ,
    "note": VerbPolicy(when_closed="serve"),  # what the model said, kept even after the close
    # A web tool's call, run by vmagent on the host: a step of the agent, needing no machine.
    "web_source": VerbPolicy(),
    "plan_tasks": _PLANNING,
    "add_task": _PLANNING,
    "update_task": _PLANNING,
    "run": _MACHINE,
    "read_file": _MACHINE,
    "write_file": _MACHINE,
    "append_file": _MACHINE,
    "edit_file": _MACHINE,
    "list_dir": _MACHINE,
    "git_commit": VerbPolicy(agent_phase="working"),  # host side: reads the folder, not the guest
    "screenshot": _SCREEN,
    "click": _SCREEN,
    "move": _SCREEN,
    "type": _SCREEN,
    "key": _SCREEN,
    "scroll": _SCREEN,
    "launch_app": _SCREEN,
    "wait": VerbPolicy(agent_phase="desktop"),  # a sleep of vmd's; the guest is not asked
    "check_internet": _MACHINE,
    "reboot_vm": _MACHINE.model_copy(update={"agent_phase": None}),
    "ask_user": VerbPolicy(when_cancelled="refuse", agent_phase="planning"),
    "request_unfreeze": VerbPolicy(when_cancelled="refuse", agent_phase="working"),
    "finish": VerbPolicy(when_cancelled="refuse", when_waiting="refuse", agent_phase="working"),
    # The eval's check after the work (params.py HiddenCheck): no tool, no step; served till the close.
    "hidden_check": VerbPolicy(counts_as_step=False, when_waiting="refuse"),
    # Reads vmd's repository of a project, for the job service's /ask (vmd/session/handlers/history_verbs.py).
    "history": VerbPolicy(session=False, counts_as_step=False, recorded=False, when_closed="serve"),
    # Sessions, warm slots, images, capacity: the job service's /hosts (vmd/session/handlers/host_verbs.py).
    "host_info": VerbPolicy(session=False, counts_as_step=False, recorded=False, when_closed="serve"),
}

# Verbs that need a live machine.
MACHINE_VERBS: frozenset[str] = frozenset(verb for verb, policy in POLICY.items() if policy.needs_machine)
