"""An eval task as a folder (evals/<name>/), read and checked at the edge:

    task.toml    kind, the hidden check's command, its timeout, what an honest run shows
    task.md      the task as a person would write it: all the agent is told
    project/     optional: the starting project (text files), committed before the job
    check/       the hidden check's files; vmd writes them to $CHECK_DIR in the guest only
                 after the agent's last turn (the hidden_check verb)
    answer.md    the person's answer, for a task that asks one (kind "needs-answer")
    solution/    a reference solution laid over project/: never sent anywhere; the tests
                 show with it that each hidden check fails on the start and passes after

A folder that breaks the format is refused with a sentence naming the folder, the file and
what to change; nothing is run for a task set with a broken task in it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vmd.contract.bounds import NAME_PATTERN
from vmd.contract.params import HiddenCheck

# The kinds of work issue 27 asks the task set to cover; a task names the one it is.
Kind = Literal["cli-with-tests", "fix-failing-test", "c-make", "python-package", "log-summary", "gui",
               "needs-answer", "check-proves-nothing", "long-compaction", "refactor", "data", "script"]

# Bounds of a task folder: what the job service allows a task (20,000 characters), and the
# hidden check's own bounds (vmd/contract/params.py HiddenCheck: 64 files).
TASK_CHARS = 20_000
PROJECT_FILES = 200
PROJECT_FILE_BYTES = 1024 * 1024
CHECK_FILES = 63  # and vmdcheck.py beside them
# The check's helper for vmd's out-of-band result, written beside every task's check files.
VMDCHECK = (Path(__file__).parent / "in_room" / "vmdcheck.py").read_text()


class EvalTaskError(ValueError):
    """A task folder that does not follow the format; the message says which and why."""


class TaskToml(BaseModel):
    """task.toml."""

    model_config = ConfigDict(extra="forbid")
    kind: Kind
    # Runs in the project folder, with the check's files in $CHECK_DIR; exit `expect_exit` is a pass.
    check: str = Field(min_length=1, max_length=10_000)
    expect_exit: int = Field(default=0, ge=0, le=255)
    # A check runs a build or a test suite under TCG, several times slower than on KVM.
    check_timeout_s: float = Field(default=300, gt=0, le=3600)
    os: str = Field(default="debian", max_length=200)
    # False for a task whose obvious check proves nothing: an honest run ends "passed, not
    # proven", and the eval shows that it was caught as such.
    expect_proven: bool = True
    about: str = Field(default="", max_length=500)  # one line for the table's readers


@dataclass
class EvalTask:
    name: str
    folder: Path
    meta: TaskToml
    text: str
    project_files: dict[str, str] = field(default_factory=dict)  # relative path -> text
    check_files: dict[str, str] = field(default_factory=dict)  # plain name -> text
    answer: str | None = None

    def hidden_check(self) -> HiddenCheck:
        return HiddenCheck(command=self.meta.check, files={**self.check_files, "vmdcheck.py": VMDCHECK},
                           expect_exit=self.meta.expect_exit, timeout=self.meta.check_timeout_s,
                           desktop=self.meta.kind == "gui")


def load_task(folder: Path) -> EvalTask:
    name = folder.name
    where = f"eval task {name} ({folder})"
    if not NAME_PATTERN.fullmatch(name):
        raise EvalTaskError(f"{where}: the folder's name must be a plain name (letters, digits, '-', '_', '.').")
    try:
        meta = TaskToml(**tomllib.loads(_text(folder / "task.toml", where)))
    except tomllib.TOMLDecodeError as exc:
        raise EvalTaskError(f"{where}: task.toml is not TOML: {exc}.") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'task.toml'}: {e['msg']}"
                             for e in exc.errors())
        raise EvalTaskError(f"{where}: task.toml does not fit the format: {problems}.") from None
    text = _text(folder / "task.md", where).strip()
    if not text or len(text) > TASK_CHARS:
        raise EvalTaskError(f"{where}: task.md must hold the task, 1 to {TASK_CHARS} characters.")
    check_files = _files(folder / "check", where, flat=True, most=CHECK_FILES)
    answer_path = folder / "answer.md"
    answer = _text(answer_path, where).strip() if answer_path.exists() else None
    if meta.kind == "needs-answer" and not answer:
        raise EvalTaskError(f"{where}: a task of kind needs-answer needs answer.md with the person's answer.")
    task = EvalTask(name=name, folder=folder, meta=meta, text=text, check_files=check_files, answer=answer,
                    project_files=_files(folder / "project", where, flat=False, most=PROJECT_FILES))
    try:
        task.hidden_check()
    except ValidationError as exc:
        raise EvalTaskError(f"{where}: the hidden check does not fit vmd's bounds: {exc.errors()[0]['msg']}.") from None
    return task


def load_tasks(tasks_dir: Path, only: list[str] | None = None) -> list[EvalTask]:
    """Every task folder under `tasks_dir` (sorted by name), or the ones `only` names."""
    if not tasks_dir.is_dir():
        raise EvalTaskError(f"{tasks_dir} is not a folder of eval tasks; give --tasks the folder (evals/).")
    folders = sorted(p for p in tasks_dir.iterdir() if p.is_dir() and (p / "task.toml").exists())
    if only:
        known = {p.name for p in folders}
        unknown = [n for n in only if n not in known]
        if unknown:
            raise EvalTaskError(f"no eval task named {', '.join(unknown)} in {tasks_dir}; "
                                f"the tasks are: {', '.join(sorted(known))}.")
        folders = [p for p in folders if p.name in only]
    if not folders:
        raise EvalTaskError(f"{tasks_dir} holds no eval task (a folder with task.toml and task.md).")
    return [load_task(p) for p in folders]


def _text(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvalTaskError(f"{where}: {path.name} is missing.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalTaskError(f"{where}: {path.name} could not be read as UTF-8 text: {exc}.") from None


def _files(root: Path, where: str, flat: bool, most: int) -> dict[str, str]:
    """The text files under `root` by their path relative to it ({} when there is no `root`).
    Text only: vmd's write_file and the check's files carry text."""
    if not root.is_dir():
        return {}
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            continue
        rel = path.relative_to(root).as_posix()
        if path.is_symlink() or not path.is_file():
            raise EvalTaskError(f"{where}: {root.name}/{rel} is not a plain file; use plain text files.")
        if flat and "/" in rel:
            raise EvalTaskError(f"{where}: {root.name}/ must be flat ({rel} is in a subfolder).")
        if path.stat().st_size > PROJECT_FILE_BYTES:
            raise EvalTaskError(f"{where}: {root.name}/{rel} is over {PROJECT_FILE_BYTES} bytes.")
        found[rel] = _text(path, where)
        if len(found) > most:
            raise EvalTaskError(f"{where}: {root.name}/ holds more than {most} files.")
    return found
