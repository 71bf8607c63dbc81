"""The vmd verb table: one pydantic model per verb's params, what each returns, and when
a session serves it.

This is the contract between the agent (vmagent, through vmagent/client.py) and the
supervisor. Params are validated here at the edge (`VERBS`). Results are JSON objects;
each verb's keys are a model in vmd/verb_results.py (`RESULTS`, re-exported here), which
vmd checks every answer against before it sends it. Every result that the model will read
carries a `text` key: a sentence or block the agent can act on as it is. `POLICY` says,
per verb, when a session serves it (the gate) and whether it is a step.

Pure pydantic and stdlib: the agent imports this module.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

# The result models are part of this contract: `from vmd.verbs import RunResult` works.
from vmd.verb_results import *  # noqa: F401,F403
from vmd.verb_results import RESULTS, SessionStateName, result_problem  # noqa: F401
# The name rule and every size's upper bound, each with its reason there.
from vmd.request_bounds import *  # noqa: F401,F403
from vmd.request_bounds import (ARGS, CONTENT_CHARS, COORD, HISTORY_BYTES, HISTORY_COMMITS, ID_CHARS, KEYS_CHARS,
                                LOCAL_OWNER, MAX_COUNT, MAX_OFFSET, PATH_CHARS, READ_LIMIT, REV_CHARS, REV_PATTERN,
                                SCROLL, TASKS, TEXT_CHARS, TITLE_CHARS, TYPE_CHARS, Arg, Title, name_problem)
# Bounds the hidden check's params (in vmd/verb_results.py) share with the verbs here.
from vmd.verb_results import COMMAND_CHARS, MAX_TIMEOUT_S
# How text from a guest or a model is shown (terminals, logs, reports): one rule for both sides.
from vmd.shown_text import fence, one_line, printable  # noqa: F401
# JSON from outside is parsed only once its depth is known to be shallow (why: json_depth).
from vmd.json_depth import MAX_DEPTH as JSON_MAX_DEPTH, TooDeep  # noqa: F401
from vmd.json_depth import check as json_depth_check, loads as bounded_json  # noqa: F401

TaskStatus = Literal["pending", "in_progress", "done", "blocked"]
MouseButton = Literal["left", "right", "middle"]
# The states in which a session waits for a person (session_resume wakes it).
WAITING_STATES: tuple[str, ...] = ("question", "unfreeze")


# --- error codes ----------------------------------------------------------------------
# JSON-RPC reserves -32768..-32000; the standard codes come first, vmd's own after.
# Every refusal (a rule of the session says no) is an error with code REFUSED whose
# message starts with REFUSED_PREFIX; nothing refuses inside a result.
PARSE_ERROR = -32700  # the line is not JSON (or not UTF-8, or nested too deep)
INVALID_REQUEST = -32600  # JSON, but not a request object
METHOD_NOT_FOUND = -32601  # an unknown verb
INVALID_PARAMS = -32602  # params that do not fit the verb's model, or a task that does not exist
INTERNAL_ERROR = -32603  # a bug in vmd; the connection stays up
FAILED = -32000  # the verb ran and failed (a guest error, a git error)
REFUSED = -32001  # a rule of the session refuses the verb now; the message says why
NO_SESSION = -32002  # the connection has no session bound
NOT_READY = -32003  # the machine is not up (still booting, or it failed)
BUSY = -32004  # vmd serves its connection limit already; retry later
REFUSED_PREFIX = "REFUSED:"


# --- names and sizes: what a request may hold (vmd/request_bounds.py) ----------------------

class Params(BaseModel):
    # Extra keys are refused so that a typo in a param name gets an error, not silence.
    model_config = ConfigDict(extra="forbid")


# --- session ---------------------------------------------------------------------------

class SessionOpen(Params):
    """-> SessionOpenResult"""
    os: str = Field(default="debian", max_length=KEYS_CHARS)
    project: str | None = Field(default=None, max_length=TITLE_CHARS)
    owner: str = Field(default="", max_length=ID_CHARS)
    task: str = Field(default="", max_length=TEXT_CHARS)
    wait: bool = False
    chat_id: str = Field(default="", max_length=ID_CHARS)


# A session id as vmd makes it (vmd/session/state.py `new_session_id`): a name on disk and
# in libvirt's <metadata>, so anything else that claims to be one is refused before it
# becomes a path.
SESSION_ID = re.compile(r"^s-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")


class SessionAttach(Params):
    """-> SessionAttachResult"""
    session_id: str = Field(max_length=ID_CHARS)


class SessionReady(Params):
    """Waits for the guest. -> SessionReadyResult"""
    timeout: float = Field(default=300, ge=0, le=MAX_TIMEOUT_S)
    desktop: bool = False


class Empty(Params):
    """No params: session_cancel, session_close, peek, report,
    check_internet, reboot_vm, host_info (their results: RESULTS)."""


class SessionStatus(Params):
    """-> SessionStatusResult. The agent's own counts, told so that the status line and the
    report count as it does: its model turns (the one under way included) and the tool calls
    its model made. Left out (any other client, a watcher), the counts told last stand."""
    turns: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    tool_calls: int = Field(default=0, ge=0, le=MAX_COUNT)


class Note(Params):
    """-> OkResult"""
    turn: int = Field(default=0, ge=0, le=MAX_COUNT)
    text: str = Field(max_length=TEXT_CHARS)


class WebSource(Params):
    """-> OkResult. A search or a page read that vmagent made on the host for the agent
    (vmagent/web/; the guest stays offline): a line of the record, and of the report's
    sources. Its text came from the web: the report shows it as data."""
    kind: Literal["search", "page"]
    target: str = Field(min_length=1, max_length=PATH_CHARS)  # the query, or the URL asked for
    title: str = Field(default="", max_length=TITLE_CHARS)  # a page's title
    detail: str = Field(default="", max_length=TITLE_CHARS)  # what came: results, characters, or why not
    ok: StrictBool = True


# --- tasks -----------------------------------------------------------------------------

class PlanTasks(Params):
    """-> TasksResult (tasks: the list rendered as text)"""
    tasks: list[Title] = Field(min_length=1, max_length=TASKS)

    @field_validator("tasks")
    @classmethod
    def _titles_not_blank(cls, v: list[str]) -> list[str]:
        titles = [t.strip() for t in v if t and t.strip()]
        if not titles:
            raise ValueError("give at least one non-empty task title")
        return titles


class AddTask(Params):
    """-> AddTaskResult"""
    title: str = Field(min_length=1, max_length=TITLE_CHARS)


class UpdateTask(Params):
    """-> TasksResult; blocked needs a note."""
    id: int = Field(le=MAX_COUNT)
    status: TaskStatus
    note: str = Field(default="", max_length=TEXT_CHARS)


# --- shell and files -------------------------------------------------------------------

class Run(Params):
    """-> RunResult"""
    command: str = Field(min_length=1, max_length=COMMAND_CHARS)
    timeout: float = Field(default=300, gt=0, le=MAX_TIMEOUT_S)
    cwd: str | None = Field(default=None, max_length=PATH_CHARS)


class ReadFile(Params):
    """-> ReadFileResult"""
    path: str = Field(max_length=PATH_CHARS)
    offset: int = Field(default=0, ge=0, le=MAX_OFFSET)
    limit: int | None = Field(default=None, gt=0, le=READ_LIMIT)


class WriteFile(Params):
    """write_file and append_file -> WriteFileResult"""
    path: str = Field(max_length=PATH_CHARS)
    content: str = Field(max_length=CONTENT_CHARS)


class EditFile(Params):
    """-> EditFileResult; fails unless `old` matches exactly once."""
    path: str = Field(max_length=PATH_CHARS)
    old: str = Field(min_length=1, max_length=CONTENT_CHARS)
    new: str = Field(max_length=CONTENT_CHARS)


class ListDir(Params):
    """-> ListDirResult"""
    path: str = Field(default=".", max_length=PATH_CHARS)


class GitCommit(Params):
    """Host-side commit of the project folder. -> GitCommitResult"""
    message: str = Field(min_length=1, max_length=TEXT_CHARS)


# --- screen ----------------------------------------------------------------------------
# Coordinates are in screenshot space: the image the agent was shown.

class Screenshot(Params):
    """-> ScreenshotResult; with text=True also screen_text: the screen read as text for a
    model that cannot see images (the windows with their places, the words on screen with
    their centres, in screenshot pixels; vmd/machines/screen_text.py), at most a few thousand
    characters."""
    text: bool = False


class Click(Params):
    x: int = Field(ge=-COORD, le=COORD)
    y: int = Field(ge=-COORD, le=COORD)
    button: MouseButton = "left"
    double: bool = False


class Move(Params):
    x: int = Field(ge=-COORD, le=COORD)
    y: int = Field(ge=-COORD, le=COORD)


class TypeText(Params):
    text: str = Field(max_length=TYPE_CHARS)


class Key(Params):
    keys: str = Field(min_length=1, max_length=KEYS_CHARS, description='e.g. "ctrl+alt+t", "Return", "alt+F4"')


class Scroll(Params):
    x: int = Field(ge=-COORD, le=COORD)
    y: int = Field(ge=-COORD, le=COORD)
    amount: int = Field(ge=-SCROLL, le=SCROLL, description="positive scrolls down, negative up")


class LaunchApp(Params):
    path: str = Field(max_length=PATH_CHARS)
    args: list[Arg] = Field(default=[], max_length=ARGS)


class Wait(Params):
    seconds: float = Field(gt=0, le=600)


# --- people ----------------------------------------------------------------------------

class AskUser(Params):
    """-> AskUserResult"""
    question: str = Field(min_length=1, max_length=TEXT_CHARS)


class RequestUnfreeze(Params):
    """-> RequestUnfreezeResult"""
    reason: str = Field(min_length=1, max_length=TEXT_CHARS)


class Answer(Params):
    """Given by the job service when a person replies. -> ResumeResult"""
    answer: str = Field(default="", max_length=TEXT_CHARS)
    # Strict: pydantic would read "yes" or "on" as True, and consent is never parsed from text.
    approved: StrictBool | None = None


# --- end -------------------------------------------------------------------------------

class Finish(Params):
    """-> FinishResult when vmd accepts the finish. Every refusal is an error with code
    REFUSED (tasks still open, no command run, no verification named, a failed check, a
    check that proves nothing); the last two carry `data` = FinishRefusalData (the attempt)."""
    summary: str = Field(default="", max_length=TEXT_CHARS)
    verification: Verification | None = None

    @field_validator("verification", mode="before")
    @classmethod
    def _string_is_the_command(cls, v):
        # Models often send the command alone where the object belongs.
        if isinstance(v, str):
            return {"command": v} if v.strip() else None
        return v


# --- vmd's own history of a project, read without a session -----------------------------
class History(Params):
    """Read-only, on any connection, no session needed: vmd's repository of one owner's
    project. -> HistoryResult. log: the commits reachable from `rev`, newest first, each
    with the files it changed (`patch`: with its diff); show: one commit, its message and
    diff; diff: what `rev` changed, or the change from `base` to `rev`. `path`: only
    what touches that file or folder. Cut at max_commits and max_bytes, and says so."""
    owner: str = Field(default="", max_length=ID_CHARS)  # "" is LOCAL_OWNER, as in session_open
    project: str = Field(max_length=TITLE_CHARS)
    what: Literal["log", "show", "diff"] = "log"
    rev: str = Field(default="HEAD", max_length=REV_CHARS)
    base: str | None = Field(default=None, max_length=REV_CHARS)
    path: str | None = Field(default=None, max_length=PATH_CHARS)
    patch: bool = False
    max_commits: int = Field(default=10, ge=1, le=HISTORY_COMMITS)
    max_bytes: int = Field(default=64 * 1024, ge=1, le=HISTORY_BYTES)

    @field_validator("owner", "project")
    @classmethod
    def _a_name(cls, v: str, info) -> str:
        problem = name_problem(info.field_name, v or LOCAL_OWNER)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("rev", "base")
    @classmethod
    def _one_commit(cls, v: str | None, info) -> str | None:
        if v is not None and (not REV_PATTERN.fullmatch(v) or ".." in v or "//" in v or v.endswith((".", "/", ".lock"))):
            raise ValueError(f"{info.field_name} {v!r} is not one commit: give a commit id or a branch or tag "
                             "name (HEAD, main, 1a2b3c4, HEAD~2); options, ranges (a..b) and paths are refused.")
        return v

    @field_validator("path")
    @classmethod
    def _in_the_project(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith(("/", "-", ":")) or not v.isprintable()
                              or any(part in ("", ".", "..") for part in v.rstrip("/").split("/"))):
            raise ValueError(f"path {v!r} is not a path in the project: give one from its top folder, "
                             "like src/app.py, without '..'.")
        return v if v is None else v.rstrip("/")


VERBS: dict[str, type[Params]] = {
    "session_open": SessionOpen,
    "session_attach": SessionAttach,
    "session_ready": SessionReady,
    "session_status": SessionStatus,
    "session_cancel": Empty,
    "session_close": Empty,
    "session_resume": Answer,
    # A look at the screen for people watching (the preview), not an action of the agent:
    # never offered to the model, never in the record. -> PeekResult
    "peek": Empty,
    "report": Empty,
    "note": Note,
    "web_source": WebSource,
    "plan_tasks": PlanTasks,
    "add_task": AddTask,
    "update_task": UpdateTask,
    "run": Run,
    "read_file": ReadFile,
    "write_file": WriteFile,
    "append_file": WriteFile,
    "edit_file": EditFile,
    "list_dir": ListDir,
    "git_commit": GitCommit,
    "screenshot": Screenshot,
    "click": Click,
    "move": Move,
    "type": TypeText,
    "key": Key,
    "scroll": Scroll,
    "launch_app": LaunchApp,
    "wait": Wait,
    "check_internet": Empty,
    "reboot_vm": Empty,
    "ask_user": AskUser,
    "request_unfreeze": RequestUnfreeze,
    "finish": Finish,
    "hidden_check": HiddenCheck,
    "history": History,
    # What this vmd's host holds and offers, session or none. -> HostInfoResult
    "host_info": Empty,
}


# --- when a session serves a verb -------------------------------------------------------
# One row per verb: the gate (vmd/session/serving.py `gate`) and the step count read this
# table, and nothing else decides. The gate asks in this order: closed, cancelled,
# waiting for a person, a plan; each refusal has its own sentence, saying what to do.

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
    # False: answered on any connection, with or without a session (vmd/server/rpc.py serves
    # it from vmd's own state); never gated, counted or recorded in a session.
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
    # Served by vmd/server/rpc.py, which binds the connection: never gated, counted or recorded as verbs.
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
    # The eval's check after the work (vmd/verb_results.py): no tool, no step; served till the close.
    "hidden_check": VerbPolicy(counts_as_step=False, when_waiting="refuse"),
    # Reads vmd's repository of a project, for the job service's /ask (vmd/server/history.py).
    "history": VerbPolicy(session=False, counts_as_step=False, recorded=False, when_closed="serve"),
    # Sessions, warm slots, images, capacity: the job service's /hosts (vmd/server/host_info.py).
    "host_info": VerbPolicy(session=False, counts_as_step=False, recorded=False, when_closed="serve"),
}

# Verbs that need a live machine.
MACHINE_VERBS: frozenset[str] = frozenset(verb for verb, policy in POLICY.items() if policy.needs_machine)
