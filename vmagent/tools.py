"""The tools the model is offered, tolerant reading of what it sends, and the calls to vmd.

Three jobs, in the order a turn meets them:

- `schemas(os_family, phase, desktop)` — the function schemas offered to the model,
  worded for the guest's shell (bash and /mnt/project, or PowerShell 5.1 and Z:\\).
- `parse_arguments(name, raw)` — tool arguments are untrusted input. A JSON string,
  broken JSON, a bare string where an object belongs, aliased or unknown field names
  are all read as well as they can be; what cannot be read becomes an error text that
  shows the expected shape, never an exception.
- `call(vmd, name, arguments)` — runs one verb and turns vmd's result into the text
  (and, for a screenshot, the image) the model reads next. It raises nothing but
  `VmdUnavailable`: the loop must learn when the supervisor is gone, and nothing else.

The argument models below mirror `vmd/verbs.py` field for field. They are kept here
because vmagent may not import vmd; tests/test_tools.py compares the two to catch drift.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import json_repair
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vmagent.client import VmdError, VmdUnavailable

OsFamily = Literal["linux", "windows"]
Phase = Literal["planning", "working"]
TaskStatus = Literal["pending", "in_progress", "done", "blocked"]
MouseButton = Literal["left", "right", "middle"]

# Words that differ per guest; descriptions below name them as {shell}, {project}, ...
OS_WORDS: dict[str, dict[str, str]] = {
    "linux": {
        "shell": "bash",
        "project": "/mnt/project",
        "example_file": "/mnt/project/app.py",
    },
    "windows": {
        "shell": "PowerShell 5.1",
        "project": "Z:\\",
        "example_file": "Z:\\app.py",
    },
}

# What a result text may show of a value the model sent, in error texts.
_ECHO_LIMIT = 300


def os_family_of(os_name: str) -> OsFamily:
    """'windows', 'win11', 'Windows Server' -> windows; anything else (debian, ubuntu) -> linux."""
    return "windows" if str(os_name).strip().lower().startswith("win") else "linux"


# --- argument models (mirror vmd/verbs.py) ---------------------------------------------

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


# --- the tool table --------------------------------------------------------------------

_RUN_TEXT = {
    "linux": (
        "Run a bash command line in the guest (a normal user with passwordless sudo) and get "
        "its exit code, stdout and stderr. The project folder is {project}; it lives on the "
        "host and is committed at the end, so keep everything worth keeping there. Nothing "
        "is interactive: pass -y to installers, never open an editor or a pager. Start a "
        "server in the background (`nohup cmd >/tmp/x.log 2>&1 &`) so the call returns."
    ),
    "windows": (
        "Run a PowerShell 5.1 command in the guest and get its exit code, stdout and stderr. "
        "PowerShell 5.1 has no `&&` or `||`: separate commands with `;` and check "
        "`if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }` after a native program. The "
        "project folder is Z:\\; it lives on the host and is committed at the end, so keep "
        "everything worth keeping there. Nothing is interactive. GUI programs started here "
        "do not appear on the screen."
    ),
}


@dataclass(frozen=True)
class Tool:
    name: str
    args: type[Args]
    description: str | dict[str, str]  # one text, or one per OS family
    primary: str | None = None  # the field a bare string (or list) is read as
    aliases: dict[str, str] = field(default_factory=dict)

    def describe(self, os_family: str) -> str:
        text = self.description if isinstance(self.description, str) else self.description[os_family]
        return _words(text, os_family)


_PATH_ALIASES = {
    "file": "path", "filename": "path", "file_name": "path", "filepath": "path",
    "file_path": "path", "fname": "path", "target": "path",
}

TOOLS: dict[str, Tool] = {t.name: t for t in [
    Tool("plan_tasks", PlanTasksArgs,
         "Write the task list for this job: short, checkable steps in the order you will do "
         "them. Call it first, while the machine boots. Once a plan exists, use add_task to "
         "extend it.",
         primary="tasks",
         aliases={"plan": "tasks", "items": "tasks", "steps": "tasks", "task_list": "tasks",
                  "titles": "tasks", "list": "tasks"}),
    Tool("add_task", AddTaskArgs,
         "Add one task to the end of the task list (work you discovered along the way).",
         primary="title",
         aliases={"task": "title", "name": "title", "text": "title", "description": "title"}),
    Tool("update_task", UpdateTaskArgs,
         "Keep the task list true: set a task in_progress when you start it, done with a note "
         "saying how you verified it, or blocked with a note saying why and what would "
         "unblock it.",
         aliases={"task_id": "id", "task": "id", "number": "id", "state": "status",
                  "comment": "note", "reason": "note", "message": "note", "notes": "note"}),
    Tool("run", RunArgs, _RUN_TEXT, primary="command",
         aliases={"cmd": "command", "script": "command", "shell": "command",
                  "commandline": "command", "command_line": "command",
                  "timeout_s": "timeout", "timeout_seconds": "timeout",
                  "workdir": "cwd", "dir": "cwd", "directory": "cwd",
                  "working_directory": "cwd", "working_dir": "cwd"}),
    Tool("read_file", ReadFileArgs,
         "Read a text file in the guest. A large file comes back in parts: read on with "
         "offset (and limit).",
         primary="path", aliases=dict(_PATH_ALIASES, start="offset", max="limit", length="limit")),
    Tool("write_file", WriteFileArgs,
         "Create or overwrite a file with the whole content given. For a small change to an "
         "existing file use edit_file.",
         aliases=dict(_PATH_ALIASES, contents="content", text="content", data="content",
                      body="content", file_content="content", code="content")),
    Tool("append_file", WriteFileArgs,
         "Append text to the end of a file (created if missing).",
         aliases=dict(_PATH_ALIASES, contents="content", text="content", data="content",
                      body="content", code="content")),
    Tool("edit_file", EditFileArgs,
         "Replace one exact piece of text in a file. Refused unless `old` occurs exactly once: "
         "read the file first and copy enough of it to be unique.",
         aliases=dict(_PATH_ALIASES, old_str="old", old_string="old", old_text="old",
                      search="old", find="old", original="old",
                      new_str="new", new_string="new", new_text="new",
                      replace="new", replacement="new")),
    Tool("list_dir", ListDirArgs,
         "List a directory in the guest: names, kinds and sizes.",
         primary="path", aliases=dict(_PATH_ALIASES, dir="path", directory="path",
                                      folder="path")),
    Tool("git_commit", GitCommitArgs,
         "Commit the project folder ({project}) now, on the host. Everything there is "
         "committed and pushed at the end anyway; use this to mark a working milestone.",
         primary="message", aliases={"msg": "message", "commit_message": "message",
                                     "text": "message"}),
    Tool("screenshot", EmptyArgs,
         "Capture the screen. You get the image; click, move and scroll take pixel "
         "coordinates in this image."),
    Tool("click", ClickArgs,
         "Click at a point of the last screenshot (pixels). Take a screenshot first; take "
         "another afterwards to see what happened.",
         aliases={"double_click": "double", "doubleclick": "double"}),
    Tool("move", MoveArgs, "Move the mouse to a point of the last screenshot (pixels)."),
    Tool("type", TypeArgs,
         "Type text into the window that has focus, paced like a person. Make sure the "
         "right window has focus first (click it, wait, screenshot).",
         primary="text", aliases={"string": "text", "content": "text", "value": "text",
                                  "keys": "text"}),
    Tool("key", KeyArgs,
         'Press a key or a chord, e.g. "Return", "Tab", "ctrl+s", "alt+F4".',
         primary="keys", aliases={"key": "keys", "combo": "keys", "chord": "keys",
                                  "shortcut": "keys"}),
    Tool("scroll", ScrollArgs,
         "Scroll the mouse wheel over a point of the last screenshot (pixels).",
         aliases={"delta": "amount", "clicks": "amount", "dy": "amount", "lines": "amount"}),
    Tool("launch_app", LaunchAppArgs,
         "Start a GUI program in the logged-on user's desktop session, where it can be seen "
         "and clicked. Then wait and take a screenshot.",
         primary="path", aliases={"app": "path", "program": "path", "executable": "path",
                                  "command": "path", "arguments": "args", "argv": "args"}),
    Tool("wait", WaitArgs,
         "Wait a number of seconds (at most 600), e.g. for a window to open.",
         primary="seconds", aliases={"duration": "seconds", "secs": "seconds",
                                     "time": "seconds", "s": "seconds"}),
    Tool("check_internet", EmptyArgs,
         "Check whether the guest can reach the internet. It normally cannot: network egress "
         "is closed by default (see request_unfreeze)."),
    Tool("ask_user", AskUserArgs,
         "Stop and ask the person who gave the task a question. The session pauses until "
         "they answer, possibly hours later. Only for a decision that only a person can "
         "make; never to ask for confirmation or to report progress.",
         primary="question", aliases={"text": "question", "message": "question",
                                      "prompt": "question", "q": "question"}),
    Tool("request_unfreeze", RequestUnfreezeArgs,
         "Ask a person to allow something the sandbox forbids, such as internet access to "
         "install packages. The session pauses until they decide.",
         primary="reason", aliases={"why": "reason", "text": "reason", "message": "reason",
                                    "request": "reason"}),
    Tool("finish", FinishArgs,
         "End the job. Refused until every task is done or blocked and at least one command "
         "has been run. The verification command is re-run by the supervisor from the "
         "project folder ({project}) with {shell}; its exit code, compared with expect_exit, "
         "decides the outcome the user sees. A good check fails before the work and passes "
         "after it: it runs what was built (the tests that exercise the new code, or the "
         "program with its output checked), not `true`, `test -d`, or a test that asserts "
         "nothing. The supervisor also runs it on the project as it was before the session; "
         "a check that passes there too is no proof (refused once, then the job ends passed, "
         "not proven). A check that fails is refused: the work is not done, so fix the cause "
         "and finish again.",
         primary="summary",
         aliases={"message": "summary", "result": "summary", "text": "summary",
                  "verify": "verification", "check": "verification",
                  "verification_command": "verification", "test": "verification",
                  "test_command": "verification"}),
]}

PLANNING_TOOLS = ("plan_tasks", "add_task", "update_task", "ask_user")
SCREEN_TOOLS = ("screenshot", "click", "move", "type", "key", "scroll", "launch_app", "wait")
_WORKING_BEFORE_SCREEN = (
    "plan_tasks", "add_task", "update_task", "run", "read_file", "write_file", "append_file",
    "edit_file", "list_dir", "git_commit",
)
_WORKING_AFTER_SCREEN = ("check_internet", "ask_user", "request_unfreeze", "finish")

# Wrappers some models put around the real arguments: {"arguments": {...}}.
_WRAPPER_KEYS = ("arguments", "args", "params", "parameters", "input", "kwargs")


def tool_names(phase: Phase, desktop: bool) -> list[str]:
    """The tool names offered in a phase, in the order they are offered."""
    if phase == "planning":
        return list(PLANNING_TOOLS)
    if phase != "working":
        raise ValueError(f"phase must be 'planning' or 'working', not {phase!r}")
    screen = SCREEN_TOOLS if desktop else ()
    return [*_WORKING_BEFORE_SCREEN, *screen, *_WORKING_AFTER_SCREEN]


# --- schemas ---------------------------------------------------------------------------

def _words(text: str, os_family: str) -> str:
    for key, value in OS_WORDS[os_family].items():
        text = text.replace("{" + key + "}", value)
    return text


def json_schema(model: type[BaseModel], os_family: str = "linux") -> dict:
    """A flat JSON schema of a pydantic model, as small models read best: refs inlined,
    `X | None` shown as X, no titles. Tests run it over vmd's models too, to compare."""
    raw = model.model_json_schema()
    defs = raw.get("$defs", {})

    def clean(node: Any) -> Any:
        if isinstance(node, list):
            return [clean(n) for n in node]
        if not isinstance(node, dict):
            return node
        node = dict(node)
        if "$ref" in node:
            target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
            node = {**target, **node}
        if "allOf" in node and len(node["allOf"]) == 1:
            node = {**node.pop("allOf")[0], **node}
            return clean(node)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o != {"type": "null"}]
            if len(options) == 1:
                node.pop("anyOf")
                return clean({**options[0], **node})
        node.pop("title", None)
        node.pop("$defs", None)
        node.pop("additionalProperties", None)
        if node.get("default", 0) is None:
            node.pop("default")
        out = {}
        for key, value in node.items():
            if key == "properties":
                out[key] = {name: clean(v) for name, v in value.items()}
            elif key == "description" and isinstance(value, str):
                out[key] = _words(value, os_family)
            else:
                out[key] = clean(value)
        return out

    schema = clean(raw)
    schema.pop("description", None)  # a class docstring is not a parameter description
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


def schemas(os_family: str, phase: Phase, desktop: bool) -> list[dict]:
    """Function tool schemas (Ollama/OpenAI shape) offered to the model."""
    family = os_family_of(os_family)
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": TOOLS[name].describe(family),
                "parameters": json_schema(TOOLS[name].args, family),
            },
        }
        for name in tool_names(phase, desktop)
    ]


def _type_word(node: dict) -> str:
    if "enum" in node:
        return "|".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    kind = node.get("type")
    if kind == "array":
        return "[" + _type_word(node.get("items", {})) + ", ...]"
    if kind == "object":
        return _shape_of(node)
    return kind or "any"


def _shape_of(schema: dict) -> str:
    required = set(schema.get("required", []))
    parts = [
        json.dumps(name) + ("" if name in required else "?") + ": " + _type_word(node)
        for name, node in schema.get("properties", {}).items()
    ]
    return "{" + ", ".join(parts) + "}"


def shape(name: str) -> str:
    """The expected arguments of a tool in one line, e.g.
    {"command": string, "timeout"?: number, "cwd"?: string}."""
    return _shape_of(json_schema(TOOLS[name].args))


# --- parsing ---------------------------------------------------------------------------

@dataclass
class ParsedArguments:
    """What parse_arguments made of the model's arguments: params to send to vmd, or an
    error text for the model; notes say what was dropped along the way."""
    params: dict | None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def _echo(raw: Any) -> str:
    try:
        if isinstance(raw, str) and _looks_like_json(raw.strip()):
            text = raw.strip()  # broken JSON is shown as it came, not escaped again
        else:
            text = json.dumps(raw, ensure_ascii=False, default=str)
    except Exception:
        text = repr(raw)
    if len(text) > _ECHO_LIMIT:
        text = text[:_ECHO_LIMIT] + f"... ({len(text)} chars)"
    return text


def _looks_like_json(text: str) -> bool:
    return text[:1] in ("{", "[", '"')


def _decode(raw: Any) -> Any:
    """Strings that hold JSON are decoded (repaired when broken); other strings and
    non-strings come back as they are; a blank string is an empty object."""
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if not text:
        return {}
    if not _looks_like_json(text):
        return raw
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = json_repair.repair_json(text, return_objects=True)
        except Exception:
            return raw
        if not isinstance(value, dict):
            # A repaired fragment that is not an object was most likely never JSON:
            # `{ make; } 2>&1` is a shell command, not a broken object.
            return raw
    if isinstance(value, str) and _looks_like_json(value.strip()):  # JSON inside JSON
        return _decode(value)
    return value


def _primary_is_list(tool: Tool) -> bool:
    if tool.primary is None:
        return False
    return json_schema(tool.args)["properties"][tool.primary].get("type") == "array"


def parse_arguments(name: str, raw: Any) -> ParsedArguments:
    """Read a tool call's arguments tolerantly and validate them against the tool's shape.

    Never raises. Accepts a dict, a JSON string (repaired when broken), a bare value where
    the tool has one obvious field (run("ls") -> {"command": "ls"}), aliased field names
    ("cmd" -> "command", "file" -> "path"); unknown fields are dropped with a note.
    """
    tool = TOOLS.get(name)
    if tool is None:
        return ParsedArguments(None, _unknown_tool_text(name))
    try:
        return _parse(tool, raw)
    except Exception as exc:  # untrusted input must never cost the session
        return ParsedArguments(
            None, f"{name} needs {shape(name)}; could not read what you sent ({exc}): {_echo(raw)}"
        )


def _parse(tool: Tool, raw: Any) -> ParsedArguments:
    name = tool.name
    fields = set(tool.args.model_fields)
    value = _decode(raw)
    if value is None:
        value = {}

    if not isinstance(value, dict):
        if isinstance(value, list) and not _primary_is_list(tool) and isinstance(raw, str):
            value = raw  # a list-looking string for a text field: the text itself
        if tool.primary is None:
            return ParsedArguments(
                None, f"{name} needs {shape(name)}; you sent {_echo(raw)}. Send an object "
                "with those fields."
            )
        if isinstance(value, str) and name != "type":  # typed text keeps its spaces
            value = value.strip()
        value = {tool.primary: value}

    # {"arguments": {...}} around the real arguments.
    if len(value) == 1:
        (key, inner), = value.items()
        if key in _WRAPPER_KEYS and key not in fields:
            inner = _decode(inner)
            if isinstance(inner, dict):
                value = inner

    notes: list[str] = []
    params: dict[str, Any] = {k: v for k, v in value.items() if k in fields}
    unknown: list[str] = []
    for key, item in value.items():
        if key in fields:
            continue
        lowered = str(key).strip().lower()
        canonical = lowered if lowered in fields else tool.aliases.get(lowered)
        if canonical in fields and canonical not in params:
            params[canonical] = item
        else:  # unknown, or an alias of a field that was given by its proper name
            unknown.append(str(key))
    if unknown:
        notes.append(
            f"note: ignored unknown field(s) {', '.join(repr(k) for k in unknown)}; "
            f"{name} takes {shape(name)}."
        )

    try:
        validated = tool.args.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        return ParsedArguments(
            None,
            f"{name} needs {shape(name)}; you sent {_echo(raw)}. Problem: {problems}.",
            notes,
        )
    return ParsedArguments(validated.model_dump(mode="json", exclude_unset=True), None, notes)


def _problem(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
    if error.get("type") == "missing":
        return f"{where} is missing"
    return f"{where}: {error.get('msg', 'invalid')}"


def _unknown_tool_text(name: Any, offered: Iterable[str] | None = None) -> str:
    valid = list(offered) if offered is not None else list(TOOLS)
    return f"there is no tool named {_echo(name)}. Valid tools: {', '.join(valid)}."


def _tool_name(name: Any) -> str:
    # "functions.run", " Run " -> "run"
    text = str(name or "").strip()
    return text.rsplit(".", 1)[-1].strip().lower()


# --- calling vmd and formatting what comes back ----------------------------------------

@dataclass
class ToolOutcome:
    """What one tool call gave: the text (and image) for the model, and for the loop
    whether it worked and whether the session stops here."""
    text: str
    image_b64: str | None = None
    verb: str = ""
    ok: bool = True
    result: dict | None = None
    # "question" / "unfreeze" when the verb paused the session; "finished" when finish
    # was accepted. None otherwise.
    state: str | None = None


def call(vmd: Any, name: Any, arguments: Any, offered: Iterable[str] | None = None) -> ToolOutcome:
    """Run one tool call against vmd and format the result for the model.

    `offered`: the tool names offered this turn; a call to any other gets an error text.
    Raises only VmdUnavailable.
    """
    verb = _tool_name(name)
    try:
        offered_names = list(offered) if offered is not None else None
        if verb not in TOOLS:
            return ToolOutcome("ERROR: " + _unknown_tool_text(name, offered_names),
                               verb=verb, ok=False)
        if offered_names is not None and verb not in offered_names:
            return ToolOutcome(
                f"ERROR: {verb} is not available at this point. Available now: {', '.join(offered_names)}.",
                verb=verb, ok=False,
            )
        parsed = parse_arguments(verb, arguments)
        if not parsed.ok:
            return ToolOutcome(_join(["ERROR: " + parsed.error, *parsed.notes]), verb=verb, ok=False)
        try:
            result = vmd.call(verb, **parsed.params)
        except VmdError as exc:
            return ToolOutcome(_join([f"ERROR: {exc.message or exc}", *parsed.notes]),
                               verb=verb, ok=False)
        outcome = _outcome(verb, parsed.params, result)
        if parsed.notes:
            outcome.text = _join([outcome.text, *parsed.notes])
        return outcome
    except VmdUnavailable:
        raise
    except Exception as exc:
        return ToolOutcome(f"ERROR: internal: {type(exc).__name__}: {exc}", verb=verb, ok=False)


def _join(parts: Iterable[str]) -> str:
    return "\n".join(p for p in parts if p)


def _outcome(verb: str, params: dict, result: Any) -> ToolOutcome:
    if not isinstance(result, dict):
        result = {"result": result}
    formatter = _FORMATTERS.get(verb, _format_text)
    try:
        outcome = formatter(params, result)
    except Exception:
        # vmd answered but not in the shape expected; its own text still helps the model.
        outcome = ToolOutcome(_format_text(params, result).text)
    outcome.verb = verb
    outcome.result = result
    if outcome.state is None and result.get("state") in ("question", "unfreeze"):
        outcome.state = result["state"]
    if outcome.image_b64 is None and isinstance(result.get("png_base64"), str):
        outcome.image_b64 = result["png_base64"]  # any verb that answers with a picture
    return outcome


def _format_text(params: dict, r: dict) -> ToolOutcome:
    text = r.get("text")
    if not isinstance(text, str) or not text:
        shown = {k: v for k, v in r.items() if k != "png_base64"}
        text = json.dumps(shown, ensure_ascii=False, default=str) if shown else "ok"
    return ToolOutcome(text)


def _format_run(params: dict, r: dict) -> ToolOutcome:
    if "exit_code" not in r:
        return _format_text(params, r)
    head = f"exit {r['exit_code']}"
    if isinstance(r.get("duration"), (int, float)):
        head += f" ({r['duration']:.1f} s)"
    parts = [head]
    stdout, stderr = r.get("stdout") or "", r.get("stderr") or ""
    if stdout:
        parts.append(stdout.rstrip("\n"))
    if stderr:
        parts.append("[stderr]\n" + stderr.rstrip("\n"))
    if not stdout and not stderr:
        parts.append("(no output)")
    if r.get("timed_out"):
        timeout = params.get("timeout", 300)
        parts.append(
            f"[timed out: killed after {timeout:g} s. Run long jobs in the background and poll, "
            "or give a larger timeout.]"
        )
    if r.get("truncated"):
        parts.append(
            "[output truncated: only part of it is shown. Redirect long output to a file and "
            "read the part you need.]"
        )
    # ok: the command ran; a non-zero exit is a result for the model to read, not a failed call.
    return ToolOutcome("\n".join(parts))


def _format_read_file(params: dict, r: dict) -> ToolOutcome:
    if "content" not in r:
        return _format_text(params, r)
    content = r.get("content") or ""
    offset = r.get("offset", params.get("offset", 0)) or 0
    size = r.get("size")
    head = f"{params.get('path', 'file')}"
    if size is not None:
        head += f" ({size} bytes)"
    if offset:
        head += f", from offset {offset}"
    parts = [head + ":", content if content else "(empty)"]
    if r.get("truncated"):
        # vmd reads bytes from `offset`; the next part starts where this one ended.
        next_offset = offset + len(content.encode("utf-8"))
        parts.append(f"[truncated: read on with read_file offset={next_offset}]")
    return ToolOutcome("\n".join(parts))


def _format_list_dir(params: dict, r: dict) -> ToolOutcome:
    entries = r.get("entries")
    if not isinstance(entries, list):
        return _format_text(params, r)
    lines = [f"{params.get('path', '.')}: {len(entries)} entries"]
    for e in entries:
        if not isinstance(e, dict):
            lines.append(str(e))
        elif e.get("type") in ("dir", "directory"):
            lines.append(f"{e.get('name')}/")
        elif e.get("size") is not None:
            lines.append(f"{e.get('name')}  ({e.get('size')} bytes)")
        else:
            lines.append(str(e.get("name")))
    return ToolOutcome("\n".join(lines))


def _format_screenshot(params: dict, r: dict) -> ToolOutcome:
    image = r.get("png_base64") or None
    if image is None:
        return ToolOutcome(_format_text(params, r).text, ok=False)
    size = f"{r.get('width')}x{r.get('height')}" if r.get("width") else "the screen"
    return ToolOutcome(
        f"screenshot of {size}; click, move and scroll take pixel coordinates in this image.",
        image_b64=image,
    )


def _format_tasks(params: dict, r: dict) -> ToolOutcome:
    text = r.get("text") if isinstance(r.get("text"), str) else ""
    tasks = r.get("tasks") if isinstance(r.get("tasks"), str) else ""
    if tasks and tasks not in text:
        text = _join([text, tasks])
    return ToolOutcome(text or _format_text(params, r).text)


def _format_pause(params: dict, r: dict) -> ToolOutcome:
    outcome = _format_text(params, r)
    state = r.get("state")
    outcome.state = state if state in ("question", "unfreeze") else None
    return outcome


def _format_finish(params: dict, r: dict) -> ToolOutcome:
    accepted = bool(r.get("accepted"))
    text = r.get("text") if isinstance(r.get("text"), str) and r.get("text") else (
        "finish accepted." if accepted else "REFUSED: finish was not accepted."
    )
    return ToolOutcome(text, ok=accepted, state="finished" if accepted else None)


_FORMATTERS = {
    "run": _format_run,
    "read_file": _format_read_file,
    "list_dir": _format_list_dir,
    "screenshot": _format_screenshot,
    "plan_tasks": _format_tasks,
    "add_task": _format_tasks,
    "update_task": _format_tasks,
    "ask_user": _format_pause,
    "request_unfreeze": _format_pause,
    "finish": _format_finish,
}
