"""The tool table: every tool the model may be offered, its description (worded for the
guest's shell), the field a bare value is read as, the aliases it accepts, and which
tools each phase offers."""

from __future__ import annotations

from dataclasses import dataclass, field

from vmagent.tool_args import (
    AddTaskArgs, Args, AskUserArgs, ClickArgs, EditFileArgs, EmptyArgs, FinishArgs, GitCommitArgs, KeyArgs, LaunchAppArgs, ListDirArgs, MoveArgs, OsFamily, Phase, PlanTasksArgs, ReadFileArgs, RequestUnfreezeArgs, RunArgs, ScreenshotArgs, ScrollArgs, TypeArgs, UpdateTaskArgs, WaitArgs, WriteFileArgs,
)


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


def os_family_of(os_name: str) -> OsFamily:
    """'windows', 'win11', 'Windows Server' -> windows; anything else (debian, ubuntu) -> linux."""
    return "windows" if str(os_name).strip().lower().startswith("win") else "linux"


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
    Tool("screenshot", ScreenshotArgs,
         "Capture the screen. You get the image (a model that cannot see images gets the "
         "screen read as text instead: the windows and the words on screen, each with a point "
         "to click); click, move and scroll take pixel coordinates in this image."),
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
# The tools that answer with a picture of the screen and can answer with the screen read
# as text (their `text` param): a model that cannot see images is given the text.
SCREEN_TEXT_TOOLS = ("screenshot",)
_WORKING_BEFORE_SCREEN = (
    "plan_tasks", "add_task", "update_task", "run", "read_file", "write_file", "append_file",
    "edit_file", "list_dir", "git_commit",
)
_WORKING_AFTER_SCREEN = ("check_internet", "ask_user", "request_unfreeze", "finish")


def tool_names(phase: Phase, desktop: bool) -> list[str]:
    """The tool names offered in a phase, in the order they are offered."""
    if phase == "planning":
        return list(PLANNING_TOOLS)
    if phase != "working":
        raise ValueError(f"phase must be 'planning' or 'working', not {phase!r}")
    screen = SCREEN_TOOLS if desktop else ()
    return [*_WORKING_BEFORE_SCREEN, *screen, *_WORKING_AFTER_SCREEN]


def _words(text: str, os_family: str) -> str:
    for key, value in OS_WORDS[os_family].items():
        text = text.replace("{" + key + "}", value)
    return text
