"""The job API's shapes: what a request may carry (each field with its limit, and what to do
when a value is too long) and what a job looks like to its caller. The routes are in
vmagent/service/app.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from vmd.contract.bounds import NAME_CHARS, NAME_PATTERN

# Field limits, in characters. A task is typed into a chat: 20,000 characters is about ten
# pages, and longer material (logs, specifications) belongs in the project's files. An
# answer may paste the error the agent asked about, so it gets as much.
TASK_CHARS = ANSWER_CHARS = 20000
# A question about a job, or the reason given with a decision: a paragraph or two.
QUESTION_CHARS = REASON_CHARS = 4000
# vmd's name rule (vmd/contract/bounds.py) is the limit for a project.
PROJECT_CHARS = NAME_CHARS
# Guest image names are short words: debian, ubuntu-desktop, windows-11.
OS_CHARS = 64
# Open WebUI's chat and message ids are UUIDs (36 characters); Ollama model names are
# `[host/][namespace/]name[:tag]`, e.g. hf.co/org/repo:Q4_K_M.
ID_CHARS = MODEL_CHARS = 200
# vmd's name rule (NAME_PATTERN, which name_problem applies) as the document states it and
# the request model enforces it: no name ends in .git, and no newline may end one
# (Python's `$` matches before a final newline, a schema's ECMA `$` does not, so without
# the lookahead the two readings of one pattern differ on "name\n").
OWNER_PATTERN = r"^(?!.*\n)(?!.*\.[Gg][Ii][Tt]$)" + NAME_PATTERN.pattern.removeprefix("^")
# A job's project: a name, or empty for none (the Open WebUI tool sends "" by default).
PROJECT_PATTERN = "^$|" + OWNER_PATTERN
# What to do about a field that is too long, beyond "shorten it".
TOO_LONG_HINTS = {
    "task": "put long material (logs, specifications) in the project's files and name them in the task",
    "answer": "put long material in the project's files and name them in the answer",
    "question": "ask about one thing at a time",
}
# What a name must look like, for a field refused by its pattern.
PATTERN_HINTS = {
    "project": (f"is not a usable project name: use up to {PROJECT_CHARS} letters, digits, '-', '_' and '.', "
                "start with a letter, digit or '_', and do not end in .git; or leave it empty for no project"),
}


class JobCreate(BaseModel):
    # The lookaheads of the name patterns need Python's re (pydantic's default engine has none).
    model_config = ConfigDict(regex_engine="python-re")
    task: str = Field(min_length=1, max_length=TASK_CHARS)
    os: str = Field("debian", min_length=1, max_length=OS_CHARS)
    project: str | None = Field(None, max_length=PROJECT_CHARS, pattern=PROJECT_PATTERN)
    chat_id: str = Field("", max_length=ID_CHARS)
    message_id: str = Field("", max_length=ID_CHARS)
    model: str | None = Field(None, max_length=MODEL_CHARS)
    # False: the agent is offered no web tool in this job (the person's switch); true: what
    # the operator's settings allow (vmagent's web_tools, a search engine). Strict: the
    # document says boolean, and 0 or "no" taken as false is a client's bug left unseen.
    web: StrictBool = True


class AnswerBody(BaseModel):
    answer: str = Field(min_length=1, max_length=ANSWER_CHARS)


class DecisionBody(BaseModel):
    reason: str = Field("", max_length=REASON_CHARS)


class AskBody(BaseModel):
    question: str = Field(min_length=1, max_length=QUESTION_CHARS)


class VerificationView(BaseModel):
    """vmd's verdict on the agent's check. passed: it passed when vmd ran it (None: no
    verdict). proven: it also failed on the project as it was before the job, so it needs
    the work (False: it passed there too; None: not passed, or that could not be run).
    attempts: runs of the check in the job."""
    passed: bool | None
    proven: bool | None
    attempts: int


class PushView(BaseModel):
    """vmd's push of the job's commit to Gitea. `pending`: Gitea could not take it at close
    and vmd retries it (`next_try`, until `retry_until`); `pushed` (`pushed_at`: when it
    landed, later than the job's end when it was retried); `failed`: refused or given up."""
    state: str
    attempts: int = 0
    sha: str | None = None
    web_url: str | None = None
    pushed_at: str | None = None
    next_try: str | None = None
    retry_until: str | None = None
    error: str | None = None


class MachineView(BaseModel):
    """How the job's machine came: `warm` (handed out from vmd's pool of saved guests) or
    `cold` (booted for this job), and the seconds until it was ready."""
    came: str
    seconds: float | None = None


class JobView(BaseModel):
    id: str
    # Documented, not checked here: a job's owner and project passed the name rule when it
    # was created, and a view of an older row must not fail.
    owner: str = Field(json_schema_extra={"pattern": OWNER_PATTERN})
    chat_id: str
    message_id: str
    task: str
    os: str
    project: Annotated[str, Field(json_schema_extra={"pattern": OWNER_PATTERN})] | None
    model: str | None
    web: bool  # the person let the job use the web tools (the operator's settings decide the rest)
    state: str
    question: str | None
    report: str | None
    session_id: str | None
    verification_passed: bool | None  # verification.passed, kept for older clients
    verification: VerificationView
    push: PushView | None  # None: nothing to push (no project, no Gitea) or not closed yet
    machine: MachineView | None  # None: no machine is up yet (or the job never got one)
    turns: int  # the model's turns (one call of the model each); the turn cap counts these
    tool_calls: int  # the tool calls the model made in them
    steps: int  # the same as turns, kept for older clients
    status_line: str
    tasks: str
    preview_ready: bool
    preview_url: str
    created: float
    updated: float


class JobList(BaseModel):
    jobs: list[JobView]  # newest first


class Health(BaseModel):
    ok: bool
    running: int  # jobs with a worker now


class AskView(BaseModel):
    """An answer about a job (vmagent/service/ask.py): from the model, or the matching lines
    of the job's record ("extractive"); `sources` names what it was drawn from."""
    job_id: str
    state: str
    answer: str
    method: Literal["model", "extractive"]
    sources: list[str]
