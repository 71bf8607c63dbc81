"""The agent's check as the contract says it: what `finish` names (`Verification`) and
what vmd answers of its runs (`CheckRunResult`, `CheckAttempt`, `FinishOutcome`). Part of
the contract: `finish`'s params (params.py) hold a `Verification`, its answer and the
report's outcome (results.py) these runs. Pure pydantic.

Where a check runs (`CheckWhere`, vmd/session/clean_room.py): "clean_room", a fresh
machine of the session's image holding the candidate commit as a git work tree, never
the guest the model had root in; "session", the session's own guest, for a check about
the machine rather than the project (`Verification.in_`): weaker, never proven.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vmd.contract.bounds import CHECK_FILE_CHARS, CHECK_FILES, COMMAND_CHARS

CheckWhere = Literal["clean_room", "session"]


class Verification(BaseModel):
    """The check `finish` names. vmd runs `setup` (when given: say `pip install -e .`) and
    then `command` in a fresh machine holding the project as committed; `tests`: the files
    of the check itself, which vmd also puts into the baseline (the project as it was) to
    see the check fail there. `in`: "session" for a check about the machine rather than
    the project (a service installed, a window on the desktop), run in the session's own
    guest and never proven."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    command: str = Field(min_length=1, max_length=COMMAND_CHARS)
    expect_exit: int = Field(default=0, ge=0, le=255)
    setup: str | None = Field(default=None, max_length=COMMAND_CHARS)
    tests: list[Annotated[str, Field(max_length=CHECK_FILE_CHARS)]] = Field(default=[], max_length=CHECK_FILES)
    in_: Literal["project", "session"] = Field(default="project", alias="in")

    @field_validator("tests")
    @classmethod
    def _project_paths(cls, paths: list[str]) -> list[str]:
        # Files of the project, as the candidate commit holds them: never a path that
        # climbs out of it or into its .git.
        for path in paths:
            parts = path.split("/")
            if (not path or len(path) > CHECK_FILE_CHARS or path.startswith("/") or "\\" in path
                    or "\0" in path or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git"):
                raise ValueError(f"tests: {path[:80]!r} is not a file path inside the project; name the "
                                 "check's files as paths relative to the project folder, like tests/test_calc.py")
        return paths


class CheckRunResult(BaseModel):
    """One run of a command of the check by vmd (vmd/session/verification.py CheckRun)."""
    model_config = ConfigDict(extra="allow")
    exit_code: int | None
    passed: bool
    timed_out: bool = False
    duration: float = 0.0
    output_tail: str = ""
    error: str | None = None  # the run could not be made at all


class CheckAttempt(CheckRunResult):
    """One finish's run of the check, and of the same check on the baseline."""
    attempt: int  # 1 for the first finish that ran a check
    command: str
    expect_exit: int
    baseline: CheckRunResult | None
    where: CheckWhere = "clean_room"
    candidate: str | None = None  # vmd's commit the check ran on (None: a session check)
    setup: CheckRunResult | None = None  # the setup's run before the check, when one was named


class FinishRefusalData(BaseModel):
    """The `data` of a finish refused after vmd ran the check (it failed, or it proves
    nothing): the attempt as vmd ran it."""
    model_config = ConfigDict(extra="allow")
    attempt: CheckAttempt


class FinishOutcome(BaseModel):
    model_config = ConfigDict(extra="allow")
    command: str
    cwd: str | None
    expect_exit: int
    exit_code: int | None
    passed: bool
    proven: bool | None  # None: not passed, a session check, or the baseline could not be checked
    timed_out: bool
    duration: float
    output_tail: str
    baseline: CheckRunResult | None
    attempts: int
    where: CheckWhere = "clean_room"
    candidate: str | None = None  # the verified commit: what the close pushes as verified
    setup_command: str | None = None
    setup: CheckRunResult | None = None
    check_files: list[str] = []  # the check's files put into the baseline beside the old project
