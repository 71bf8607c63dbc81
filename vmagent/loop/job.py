"""A job's state and what goes out of it: the spec (vmagent/job_file.py), the outcome, the
transcript kept on disk after every turn (`Job.save`, `Job.load`: what a resumed job carries
on from) and the watcher's event feed (`Events`: a view never breaks the work)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from vmagent.atomic_file import replace_text
from vmagent.job_file import JobSpec
from vmagent.os_family import os_family_of
from vmd.contract.verdict import Verdict

log = logging.getLogger(__name__)

TRANSCRIPT_VERSION = 1

Event = dict[str, Any]


# vmd's verdict on the agent's check, read from its report; its words are the contract's.
Verification = Verdict


class Outcome(BaseModel):
    state: Literal["done", "question", "unfreeze", "cancelled", "failed"]
    report: str
    session_id: str | None
    question: str | None
    verification_passed: bool | None  # verification.passed, kept for older readers
    verification: Verification = Field(default_factory=Verification)
    steps: int  # the model's turns (the loop's count; the turn cap, max_steps, is of these)
    tool_calls: int = 0  # the tool calls its model made in them
    # vmd's push at close ({state: pending|pushed|failed, attempts, sha, web_url, pushed_at,
    # next_try, retry_until, error}); None without a close or a remote. A pending push is
    # retried by vmd after the job ended, and the job service asks vmd how it went.
    push: dict | None = None
    reason: str = ""  # why the loop stopped, as the report's notes say it
    usage: dict = Field(default_factory=dict)  # Usage, as a dict: the model's time and tokens
    hidden_check: dict | None = None  # the eval's check as vmd ran it (HiddenCheckResult), or {"error"}


@dataclass
class Usage:
    """What the job cost in the model: the calls of the turns (a compaction's summary is not
    counted), the seconds waited for them and the tokens the server said it read and wrote."""

    calls: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    reply_tokens: int = 0

    def add(self, seconds: float, reply) -> None:
        self.calls += 1
        self.seconds = round(self.seconds + seconds, 3)
        self.prompt_tokens += int(getattr(reply, "prompt_eval_count", None) or 0)
        self.reply_tokens += int(getattr(reply, "eval_count", None) or 0)


@dataclass
class Ending:
    """Why the loop stops: the outcome state and a sentence for the report."""

    state: str
    reason: str


# --- the job's state, kept on disk after every turn -----------------------------------


@dataclass
class Guards:
    """Counters the guards keep; saved with the transcript so a resumed job keeps them."""

    prose_streak: int = 0
    # sha1 of (command, exit code, output) -> how many times that exact result came back
    repeats: dict[str, int] = field(default_factory=dict)
    steps_since_tasks_moved: int = 0
    last_tasks: str = ""
    # Whether the model was told to use the tool interface after writing a call as text.
    told_tool_interface: bool = False
    # The stuck detector's view of the job (vmagent/loop/guards.py): the newest tool calls,
    # each {"call", "answer", "refused", "label"} (digests and a short name), as many as
    # its longest pattern needs; how often each pattern was hit; and, once one ends the
    # job, the sentence for the report.
    recent_calls: list[dict] = field(default_factory=list)
    stuck_hits: dict[str, int] = field(default_factory=dict)
    stuck_end: str = ""
    # A poll (a `wait` or a `sleep` among the repeated calls): the seconds it has waited with
    # nothing changing, and the [call, answer] pairs it repeats; any other answer resets both.
    poll_waited_s: float = 0.0
    poll_pairs: list[list[str]] = field(default_factory=list)


@dataclass
class Job:
    spec: JobSpec
    transcript_path: Path
    session_id: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0  # model turns: one call of the model each
    tool_calls: int = 0  # the tool calls in the model's replies that the loop ran
    phase: str = "planning"  # planning | working
    desktop: bool = False
    # Whether the fixed prompt holds the screen tools and rules, decided when the job starts
    # from the image (session_open's `desktop`; a Windows guest always): False, a guest with no
    # desktop is offered none all job long; None, a vmd that did not say: every tool is offered
    # and the rules come with the hand-over if a desktop is found.
    screen: bool | None = None
    boot_seconds: float | None = None
    machine_came: str | None = None  # "warm" (vmd's pool) or "cold" (booted), as vmd said
    machine_text: str = ""  # the machine's facts told at the hand-over, restated by a compaction
    # Seconds worked in earlier runs of this job; time spent waiting for a person is not work.
    active_before_s: float = 0.0
    started_at: float = field(default_factory=time.time)
    run_started: float = field(default_factory=time.monotonic)
    guards: Guards = field(default_factory=Guards)
    verification: str | None = None  # the last verification command the model named
    notes: list[str] = field(default_factory=list)  # the loop's own lines for the report
    state: str = "running"
    question: str | None = None
    tasks_text: str = ""
    status_line: str = ""
    # The host's web tools this job offers (web_search, read_page), decided when it started:
    # the tool list stays the same all job long, across a question and its answer too.
    web_tools: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    # The guest's family as vmd's session_open answered it (from the image's manifest), kept
    # in the transcript so a resumed job words its tools and prompts as it started; None
    # before the session opens, or from a vmd that does not say (older than that answer).
    answered_os_family: str | None = None

    @property
    def os_family(self) -> str:
        return os_family_of(self.spec.os, self.answered_os_family)

    def active_seconds(self) -> float:
        return self.active_before_s + (time.monotonic() - self.run_started)

    def save(self) -> None:
        data = {
            "version": TRANSCRIPT_VERSION,
            "spec": self.spec.model_dump(),
            "session_id": self.session_id,
            "state": self.state,
            "question": self.question,
            "phase": self.phase,
            "desktop": self.desktop,
            "screen": self.screen,
            "boot_seconds": self.boot_seconds,
            "machine_came": self.machine_came,
            "machine_text": self.machine_text,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "started_at": self.started_at,
            "active_seconds": round(self.active_seconds(), 3),
            "saved_at": time.time(),
            "guards": asdict(self.guards),
            "verification": self.verification,
            "notes": self.notes,
            "web_tools": self.web_tools,
            "os_family": self.answered_os_family,
            "usage": asdict(self.usage),
            "messages": self.messages,
        }
        path = Path(self.transcript_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, json.dumps(data, ensure_ascii=False, default=str))

    @classmethod
    def load(cls, path: Path) -> "Job":
        data = json.loads(Path(path).read_text())
        job = cls(spec=JobSpec(**data["spec"]), transcript_path=Path(path))
        job.session_id = data.get("session_id")
        job.messages = list(data.get("messages") or [])
        job.steps = int(data.get("steps") or 0)
        job.tool_calls = int(data.get("tool_calls") or 0)
        job.phase = data.get("phase") or "planning"
        job.desktop = bool(data.get("desktop"))
        screen = data.get("screen")
        job.screen = screen if isinstance(screen, bool) else None  # an older transcript: as before
        job.boot_seconds = data.get("boot_seconds")
        job.machine_came = data.get("machine_came")
        job.machine_text = str(data.get("machine_text") or "")
        job.active_before_s = float(data.get("active_seconds") or 0.0)
        job.started_at = float(data.get("started_at") or time.time())
        job.guards = Guards(**(data.get("guards") or {}))
        job.verification = data.get("verification")
        job.notes = list(data.get("notes") or [])
        job.state = data.get("state") or "running"
        job.question = data.get("question")
        job.web_tools = [str(name) for name in data.get("web_tools") or []]
        job.usage = Usage(**(data.get("usage") or {}))
        # A transcript written before vmd answered the family has none: the name is read.
        job.answered_os_family = data.get("os_family")
        return job


class Events:
    """The watcher's feed. A view never breaks the work: whatever on_event raises is logged once."""

    def __init__(self, on_event: Callable[[Event], None] | None):
        self.on_event = on_event
        self.failures = 0

    def emit(self, event: Event) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            self.failures += 1
            if self.failures == 1:
                log.exception("the event watcher failed on a %s event; the job goes on", event.get("type"))

    def from_vmd(self, method: str, params: dict) -> None:
        if method == "output":
            self.emit({"type": "output", "stream": params.get("stream", "stdout"), "line": params.get("line", "")})


def save_quietly(job: Job) -> None:
    try:
        job.save()
    except OSError as exc:
        log.warning("could not write the transcript %s: %s", job.transcript_path, exc)
