"""The arguments of each tool, as the model sends them: one pydantic model per tool,
field for field what vmd/verbs.py takes, with the lenient validators a model needs
(a bulleted string is a task list, "complete" is done, 3.0 is 3). They are kept in
vmagent because vmagent may import nothing of vmd but vmd/verbs.py; tests/test_tools.py
compares the two to catch drift."""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


OsFamily = Literal["linux", "windows"]
Phase = Literal["planning", "working"]
TaskStatus = Literal["pending", "in_progress", "done", "blocked"]
MouseButton = Literal["left", "right", "middle"]


class Args(BaseModel):
    # Unknown keys are dropped with a note before validation; forbid is the backstop.
    # Numbers where text belongs (type(text=42)) are read as text, not refused.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


def _whole_number(v: Any) -> Any:
    # Models send pixel coordinates as 412.5 or "412"; a pixel is a pixel.
    if isinstance(v, float):
        return round(v)
    if isinstance(v, str):
        try:
            return round(float(v.strip()))
        except ValueError:
            return v
    return v


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|\[[ xX]?\])\s+")


class PlanTasksArgs(Args):
    tasks: list[str] = Field(
        min_length=1,
        description="Task titles in the order you will do them; each one short and checkable.",
    )

    @field_validator("tasks", mode="before")
    @classmethod
    def _read_any_list(cls, v: Any) -> Any:
        if isinstance(v, str):  # one task per line, bullets and numbers stripped
            v = [_BULLET.sub("", line) for line in v.splitlines()]
        if isinstance(v, list):
            titles = []
            for item in v:
                if isinstance(item, dict):  # [{"title": ...}] is a common shape
                    item = next((item[k] for k in ("title", "name", "task", "description")
                                 if isinstance(item.get(k), str)), None)
                if isinstance(item, (str, int, float)) and str(item).strip():
                    titles.append(str(item).strip())
            return titles
        return v


class AddTaskArgs(Args):
    title: str = Field(min_length=1, description="Short, checkable title of the new task.")


_STATUS_WORDS = {
    "todo": "pending", "open": "pending", "not_started": "pending",
    "inprogress": "in_progress", "in progress": "in_progress", "in-progress": "in_progress",
    "started": "in_progress", "doing": "in_progress", "active": "in_progress",
    "working": "in_progress",
    "complete": "done", "completed": "done", "finished": "done", "verified": "done",
    "ok": "done", "success": "done",
    "stuck": "blocked", "failed": "blocked",
}


class UpdateTaskArgs(Args):
    id: int = Field(description="The task's number as shown in the task list.")
    status: TaskStatus = Field(
        description="in_progress when you start it; done once verified; blocked when it "
        "cannot be done (a note is required then)."
    )
    note: str = Field(
        default="",
        description="For done: how it was verified. For blocked: why, and what would unblock it.",
    )

    @field_validator("id", mode="before")
    @classmethod
    def _number_in_text(cls, v: Any) -> Any:
        if isinstance(v, str):  # "#3", "task 3"
            digits = re.search(r"\d+", v)
            return int(digits.group()) if digits else v
        return _whole_number(v)

    @field_validator("status", mode="before")
    @classmethod
    def _status_words(cls, v: Any) -> Any:
        if isinstance(v, str):
            word = v.strip().lower()
            return _STATUS_WORDS.get(word, word.replace("-", "_").replace(" ", "_"))
        return v


class RunArgs(Args):
    command: str = Field(min_length=1, description="The {shell} command line to run.")
    timeout: float = Field(
        default=300, gt=0, le=7200,
        description="Seconds before the command is killed (default 300, at most 7200).",
    )
    cwd: str | None = Field(
        default=None, description="Directory to run in, e.g. {project}.",
    )


class ReadFileArgs(Args):
    path: str = Field(description="Path in the guest, e.g. {example_file}.")
    offset: int = Field(default=0, ge=0, description="Where to start reading (default 0).")
    limit: int | None = Field(default=None, gt=0, description="How much to read at most.")


class WriteFileArgs(Args):
    path: str = Field(description="Path in the guest, e.g. {example_file}.")
    content: str = Field(description="The text to write.")


class EditFileArgs(Args):
    path: str = Field(description="Path in the guest, e.g. {example_file}.")
    old: str = Field(
        min_length=1,
        description="Exact text to replace; must occur exactly once in the file "
        "(include surrounding lines to make it unique).",
    )
    new: str = Field(description="Text to put in its place.")


class ListDirArgs(Args):
    path: str = Field(default=".", description="Directory to list, e.g. {project}.")


class GitCommitArgs(Args):
    message: str = Field(min_length=1, description="Commit message: what changed and why.")


class ClickArgs(Args):
    x: int = Field(description="Pixels from the left edge of the last screenshot.")
    y: int = Field(description="Pixels from the top edge of the last screenshot.")
    button: MouseButton = Field(default="left", description="left (default), right or middle.")
    double: bool = Field(default=False, description="true for a double click.")

    @field_validator("x", "y", mode="before")
    @classmethod
    def _pixels(cls, v: Any) -> Any:
        return _whole_number(v)


class MoveArgs(Args):
    x: int = Field(description="Pixels from the left edge of the last screenshot.")
    y: int = Field(description="Pixels from the top edge of the last screenshot.")

    @field_validator("x", "y", mode="before")
    @classmethod
    def _pixels(cls, v: Any) -> Any:
        return _whole_number(v)


class TypeArgs(Args):
    text: str = Field(description="Text to type into the focused window.")


class KeyArgs(Args):
    keys: str = Field(
        min_length=1, description='A key or chord, e.g. "Return", "ctrl+s", "alt+F4".'
    )

    @field_validator("keys", mode="before")
    @classmethod
    def _chord_from_list(cls, v: Any) -> Any:
        if isinstance(v, list) and all(isinstance(k, str) for k in v):
            return "+".join(k.strip() for k in v)
        return v


class ScrollArgs(Args):
    x: int = Field(description="Pixels from the left edge of the last screenshot.")
    y: int = Field(description="Pixels from the top edge of the last screenshot.")
    amount: int = Field(description="Positive scrolls down, negative up.")

    @field_validator("x", "y", "amount", mode="before")
    @classmethod
    def _pixels(cls, v: Any) -> Any:
        return _whole_number(v)


class LaunchAppArgs(Args):
    path: str = Field(description="The program to start.")
    args: list[str] = Field(default=[], description="Arguments, one list item each.")

    @field_validator("args", mode="before")
    @classmethod
    def _split_string(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return shlex.split(v, posix=True)
            except ValueError:
                return v.split()
        return v


class WaitArgs(Args):
    seconds: float = Field(gt=0, le=600, description="How long to wait (at most 600).")


class EmptyArgs(Args):
    pass


class ScreenshotArgs(Args):
    text: bool = Field(
        default=False,
        description="true to also get the screen read as text: each window with its place, and "
        "the words on screen with the point to click each (takes a second or two longer).",
    )


class AskUserArgs(Args):
    question: str = Field(
        min_length=1,
        description="One clear question, with the options you see and what you would pick.",
    )


class RequestUnfreezeArgs(Args):
    reason: str = Field(
        min_length=1,
        description="Exactly what you need opened or allowed, and why the task needs it.",
    )


class VerificationArgs(Args):
    command: str = Field(
        min_length=1,
        description="A {shell} command that fails without the work and passes with it; "
        "re-run by the supervisor from {project}, and on the project as it was before.",
    )
    expect_exit: int = Field(default=0, description="The exit code that means success (default 0).")


class FinishArgs(Args):
    summary: str = Field(
        default="", description="What was done, where it is, and anything left open."
    )
    verification: VerificationArgs | None = Field(
        default=None,
        # Ollama's client sends a nested object's type and description, not its fields:
        # this sentence is all the model reads of the shape.
        description='The check the supervisor re-runs, as {"command": "<a {shell} command>", '
        '"expect_exit": 0}; its exit code decides the outcome.',
    )

    @field_validator("verification", mode="before")
    @classmethod
    def _string_is_the_command(cls, v: Any) -> Any:
        # Models often send the command alone where the object belongs; vmd reads it
        # the same way.
        if isinstance(v, str):
            return {"command": v} if v.strip() else None
        return v
