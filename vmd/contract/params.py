"""The verbs' params: one pydantic model per verb, and `VERBS` (name -> model), the table
vmd validates every request against at the edge (vmd/server/rpc.py) and the agent builds
its tools from (vmagent/tools/table.py). Extra keys are refused, so that a typo in a
param's name gets an error, not silence; every size has its bound (bounds.py).

What each verb answers is results.py; when a session serves it, policy.py.
Pure pydantic and stdlib, like the whole contract.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from vmd.contract.bounds import (ARGS, COMMAND_CHARS, CONTENT_CHARS, COORD, HISTORY_BYTES, HISTORY_COMMITS, ID_CHARS,
                                 KEYS_CHARS, LOCAL_OWNER, MAX_COUNT, MAX_OFFSET, MAX_TIMEOUT_S, NAME_CHARS, NAME_RULE,
                                 PATH_CHARS, READ_LIMIT, REV_CHARS, REV_PATTERN, SCROLL, TASKS, TEXT_CHARS,
                                 TITLE_CHARS, TYPE_CHARS, Arg, Title, name_problem)
from vmd.contract.check import Verification

TaskStatus = Literal["pending", "in_progress", "done", "blocked"]
MouseButton = Literal["left", "right", "middle"]


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


# --- the eval's hidden check, after the work ---------------------------------------------

class HiddenCheck(Params):
    """Service only (`vmagent eval`): a check the agent never sees, which vmd runs after the
    agent's work and before the close on a fresh machine holding the committed project
    (vmd/session/handlers/eval_verbs.py). `files` are written there to a fresh folder outside
    the project, named to the command by $CHECK_DIR; `command` runs in the project folder and
    passes only by writing the nonce in $CHECK_DIR/.nonce to $CHECK_RESULT.
    -> HiddenCheckResult"""
    command: str = Field(min_length=1, max_length=COMMAND_CHARS)
    # Plain names; a few KiB each in evals/, and the request line's own bound (64 MiB)
    # bounds them all together.
    files: dict[Annotated[str, Field(pattern=NAME_RULE, max_length=NAME_CHARS)],
                Annotated[str, Field(max_length=4 * 1024 * 1024)]] = Field(default={}, max_length=64)
    expect_exit: int = Field(default=0, ge=0, le=255)
    timeout: float = Field(default=300, gt=0, le=MAX_TIMEOUT_S)
    desktop: bool = False  # the check clicks on a desktop: the fresh machine waits for its own


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
