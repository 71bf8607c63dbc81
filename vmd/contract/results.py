"""What each verb answers: one pydantic model per result, and `RESULTS` (verb -> model).

vmd checks every handler's answer against its model before it sends it (`result_problem`,
through vmd/errors.py `checked_result`): a key missing or of the wrong type is a bug in vmd
and answers INTERNAL_ERROR, never a reply that only looks right. The answer on the wire is
the handler's own dict, unchanged; the agent's client reads it into the same model
(vmagent/link/unix_socket.py `typed_result`), nested parts too (`Facts`, `FinishOutcome`,
`PushView`, `ReportOutcome`), and refuses one that does not fit with `result_problem`'s
sentence.

Extra keys are allowed (`extra="allow"`), so that adding a key to a result is not a
breaking change; the keys named here are the ones a client may rely on.

Pure pydantic and stdlib, like the whole contract.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from vmd.contract.check import CheckRunResult, FinishOutcome
from vmd.contract.policy import SessionStateName
from vmd.contract.verdict import Verdict, VerdictStatus


class Result(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextResult(Result):
    text: str  # what the model reads, as it is


# --- session ---------------------------------------------------------------------------

class SessionOpenResult(TextResult):
    session_id: str
    os: str
    # The guest's family from its image ("linux", "windows"), so no client guesses it from
    # the name; None when vmd has no such image (the boot then says so).
    os_family: str | None = None
    # Whether the image has a desktop (its manifest), so the agent's fixed prompt holds the
    # screen tools from the start or never; None when vmd has no such image, or an older vmd.
    desktop: bool | None = None
    project: str | None
    project_share: bool  # the session has a project folder (shared with the guest)
    storage: str  # where the work is kept, in words
    state: SessionStateName


class SessionAttachResult(TextResult):
    session_id: str
    state: SessionStateName


class Facts(BaseModel):
    """What a machine's `ready` tells of its guest (vmd/machines/port.py; the session keeps
    it, the agent reads it)."""

    os: str
    kernel: str
    python: str
    git: str
    desktop: bool
    project_path: str
    project_mounted: bool
    boot_id: str
    hostname: str
    accel: str
    seconds: float = 0.0


class PushView(BaseModel):
    """A closed session's push while vmd retries it, as session_status and session_close
    show it (vmd/projects/push_state.py PushState.view): times as ISO strings."""
    model_config = ConfigDict(extra="allow")
    state: Literal["pending", "pushed", "failed"]
    attempts: int
    sha: str | None
    web_url: str | None
    error: str | None  # the last failure, a sentence
    pushed_at: str | None
    next_try: str | None  # the next try, while pending
    retry_until: str | None  # when vmd stops retrying


class SessionReadyResult(TextResult):
    ready: Literal[True]
    seconds: float  # how long the boot (or the warm hand-out) took
    facts: Facts
    came: Literal["warm", "cold"] | None = None  # restored from vmd's warm pool, or booted


class SessionStatusResult(TextResult):
    session_id: str
    state: SessionStateName
    planned: bool
    tasks: str  # the task list rendered
    status_line: str  # the same as text
    question: str  # the open question while the state is "question", else ""
    unfreeze_request: str  # the open request while the state is "unfreeze", else ""
    cancelled: bool
    steps: int  # the verbs vmd served that count as steps (policy.py POLICY)
    # The agent's model turns (the one under way included) and its model's tool calls, as it
    # last told them (session_status's params); None while none told.
    turns: int | None = None
    tool_calls: int = 0
    machine: str  # booting | ready | suspended | destroyed | "failed: <why>"
    machine_came: Literal["warm", "cold"] | None = None  # how the machine came, once it did
    machine_seconds: float | None = None  # its boot or warm hand-out, in seconds
    came_note: str | None = None  # why it came cold although the warm pool was on
    outcome: FinishOutcome | None  # finish's outcome once accepted
    push: PushView | None  # the push at close and its retries
    clients: int  # connections bound to the session
    detached_s: float | None  # seconds since the last client went; None while one is bound
    ended_by: Literal["vmd", "client"] | None  # once closed
    reason: str | None  # why vmd closed it, when vmd did


class CancelResult(TextResult):
    cancelled: Literal[True]


class CloseResult(TextResult):
    """session_close, also when it was closed already (text starts "already closed").
    A close kept in session.json by an older vmd may lack the later keys: they have defaults."""
    closed: Literal[True]
    commit: str | None  # vmd's commit of the project folder; None when nothing was committed
    web_url: str | None = None
    branch: str | None = None
    remote: str | None = None
    pushed: bool = False
    push_error: str | None = None
    warnings: list[str] = []
    files: list[str] = []  # the files changed since the session opened
    machine_destroyed: bool = False
    machine: str = ""  # what became of the machine, in words
    left_out: list[str] = []  # what the commit left out, and why
    ended_by: Literal["vmd", "client"] = "client"
    reason: str | None = None
    push: PushView | None = None  # while vmd retries the push


class ResumeResult(TextResult):
    state: SessionStateName  # where the session went back to


class PeekResult(TextResult):
    available: bool  # False: no screen to show now (the rest is then absent)
    png_base64: str | None = None
    width: int | None = None
    height: int | None = None
    # True while the session waits for a person: the frame vmd kept before it paused the guest.
    kept: bool = False


class ReportOutcome(Result):
    """The report's outcome (vmd/session/report.py): the verdict as `status` with `proven` and
    `attempts`, and the check as vmd last ran it (None before a finish)."""
    status: VerdictStatus
    proven: bool | None
    attempts: int
    command: str | None
    cwd: str | None = None
    exit_code: int | None
    expect_exit: int | None
    timed_out: bool | None = None
    duration: float | None = None
    output_tail: str | None
    baseline: CheckRunResult | None = None
    where: Literal["clean_room", "session"] = "clean_room"  # check.py CheckWhere
    candidate: str | None = None  # the commit the check ran on
    setup_command: str | None = None
    commit: str | None = None  # once closed: vmd's commit, and its page on Gitea
    web_url: str | None = None

    def verdict(self) -> Verdict:
        return Verdict.of_status(self.model_dump())


class ReportResult(Result):
    """Read by people and the agent's loop, not by the model: no text."""
    markdown: str
    outcome: ReportOutcome


class OkResult(TextResult):
    """note, web_source, click, move, type, key, scroll, launch_app."""
    ok: Literal[True]


# --- tasks -----------------------------------------------------------------------------

class TasksResult(TextResult):
    """plan_tasks and update_task."""
    tasks: str  # the task list rendered


class AddTaskResult(TasksResult):
    id: int


# --- shell and files -------------------------------------------------------------------

class RunResult(TextResult):
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    truncated: bool  # output cut in the middle
    timed_out: bool


class ReadFileResult(TextResult):
    content: str
    size: int  # of the whole file, in bytes
    offset: int
    truncated: bool  # more follows: read on from offset + len(content)


class WriteFileResult(TextResult):
    """write_file and append_file."""
    path: str
    bytes: int


class EditFileResult(TextResult):
    path: str


class ListDirEntry(Result):
    name: str
    type: str  # file | dir | link | other
    size: int


class ListDirResult(TextResult):
    entries: list[ListDirEntry]


class GitCommitResult(TextResult):
    commit: str | None  # None: the folder is empty, nothing to commit
    left_out: list[str]


# --- screen and machine ----------------------------------------------------------------

class ScreenshotResult(TextResult):
    width: int
    height: int
    scale: float  # shown pixels per framebuffer pixel
    path: str  # the PNG beside the record
    png_base64: str
    screen_text: str | None = None  # with text=True


class WaitResult(TextResult):
    seconds: float


class CheckInternetResult(TextResult):
    online: bool
    detail: str  # the probe's own output, cut


class RebootResult(TextResult):
    seconds: float


# --- people ----------------------------------------------------------------------------

class AskUserResult(TextResult):
    state: Literal["question"]


class RequestUnfreezeResult(TextResult):
    state: Literal["unfreeze"]


# --- end -------------------------------------------------------------------------------

class FinishResult(TextResult):
    """Only an accepted finish is a result; every refusal is a REFUSED error."""
    accepted: Literal[True]  # kept for clients that read it
    outcome: FinishOutcome


# --- the eval's hidden check ------------------------------------------------------------

class HiddenCheckResult(CheckRunResult, TextResult):
    """The eval's hidden check as vmd ran it in a clean room (vmd/session/handlers/eval_verbs.py).
    passed: it exited as expected AND wrote vmd's nonce to $CHECK_RESULT."""
    command: str
    expect_exit: int
    exited_as_expected: bool = False
    result_written: bool = False
    where: Literal["clean_room", "session"] = "clean_room"
    candidate: str | None = None


class HistoryResult(TextResult):
    """vmd's repository of a project as git showed it (text: made printable; the guest wrote
    the files and the agent the messages), with a line saying where it was cut."""
    owner: str
    project: str
    what: Literal["log", "show", "diff"]
    commit: str  # the full id `rev` named when it was read
    commits: int  # commits in the answer (a log: at most max_commits; show and diff: 1)
    cut: bool  # stopped at max_commits or max_bytes (or git's time); the text says which


class HostImage(Result):
    name: str  # the image's name, as session_open's `os` takes it
    os_family: str  # linux | windows
    warm_slots: int  # saved guests of it ready to hand out now


class HostInfoResult(TextResult):
    """What this vmd's host holds and offers now (vmd/session/handlers/host_verbs.py), for /hosts."""
    host: str  # vmd's name of the host its new sessions go to ("local")
    sessions: int  # not closed, waiting for a person included
    states: dict[str, int]  # those sessions by state (booting, ready, question, ...)
    warm_slots: int  # every image's
    images: list[HostImage]
    cpus: int
    memory_mib: int
    guest_memory_mib: int
    room: str | None  # why no warm guest may be made now (load, memory, disk); None: room


RESULTS: dict[str, type[Result]] = {
    "session_open": SessionOpenResult,
    "session_attach": SessionAttachResult,
    "session_ready": SessionReadyResult,
    "session_status": SessionStatusResult,
    "session_cancel": CancelResult,
    "session_close": CloseResult,
    "session_resume": ResumeResult,
    "peek": PeekResult,
    "report": ReportResult,
    "note": OkResult,
    "web_source": OkResult,
    "plan_tasks": TasksResult,
    "add_task": AddTaskResult,
    "update_task": TasksResult,
    "run": RunResult,
    "read_file": ReadFileResult,
    "write_file": WriteFileResult,
    "append_file": WriteFileResult,
    "edit_file": EditFileResult,
    "list_dir": ListDirResult,
    "git_commit": GitCommitResult,
    "screenshot": ScreenshotResult,
    "click": OkResult,
    "move": OkResult,
    "type": OkResult,
    "key": OkResult,
    "scroll": OkResult,
    "launch_app": OkResult,
    "wait": WaitResult,
    "check_internet": CheckInternetResult,
    "reboot_vm": RebootResult,
    "ask_user": AskUserResult,
    "request_unfreeze": RequestUnfreezeResult,
    "finish": FinishResult,
    "hidden_check": HiddenCheckResult,
    "history": HistoryResult,
    "host_info": HostInfoResult,
}


def result_problem(verb: str, result: object) -> str | None:
    """None when `result` fits `verb`'s result model, else a sentence naming the verb and
    the fields that do not fit."""
    model = RESULTS.get(verb)
    if model is None:
        return f"vmd has no result model for {verb}"
    if not isinstance(result, dict):
        return f"vmd's answer to {verb} is a {type(result).__name__}, not an object ({model.__name__})"
    try:
        model.model_validate(result)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'the result'}: {err['msg']}"
                           for err in exc.errors()[:5])
        return f"vmd's answer to {verb} does not fit its contract ({model.__name__}): {fields}"
    return None
