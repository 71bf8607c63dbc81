"""vmd's own run of a command of the agent's check, the files that are the check's own,
and the words of a refusal. Where the runs happen (fresh machines: the candidate's and the
baseline's) is vmd/session/check_flow.py and vmd/session/clean_room.py.

A check proves the work only if it needs the work: after it passes on the candidate,
vmd runs it on the project as it was when the session opened (the *baseline*: vmd's
commit of that moment, or nothing for a new project) with the check's own files laid
over it. A check that passes there too (`true`, `test -d .git`, a test file that
asserts nothing) is reported as passed-not-proven, never as verified.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import TYPE_CHECKING, Callable

from vmd.contract.check import CheckRunResult

if TYPE_CHECKING:
    from vmd.guests.guest import CommandResult, Guest

# What the record and the report keep of one run's output.
OutputSink = Callable[[str, str], None] | None


# One run of the check is what the contract says it is (vmd/contract/results.py).
CheckRun = CheckRunResult


def _tail(result: CommandResult, chars: int) -> str:
    out, err = result.stdout or "", result.stderr or ""
    text = out + ("\n" if out and err else "") + err
    return text[-chars:]


def _checked(result: CommandResult, expect_exit: int, tail_chars: int) -> CheckRun:
    passed = result.exit_code == expect_exit and not result.timed_out
    return CheckRun(exit_code=result.exit_code, passed=passed, timed_out=result.timed_out,
                    duration=result.duration or 0.0, output_tail=_tail(result, tail_chars))


def run_check(guest: Guest, command: str, expect_exit: int, cwd: str | None, timeout: float,
              sink: OutputSink, tail_chars: int) -> CheckRun:
    return _checked(guest.run(command, timeout=timeout, cwd=cwd, on_output=sink), expect_exit, tail_chars)


# What looks like a test by its name: a tests/ or spec/ folder, test_x.py, x_test.go,
# x.test.js, x.spec.ts, conftest.py, XTest.java. Such files of the work are the check's own
# and go into the baseline with it (SWE-bench's FAIL_TO_PASS: the new tests must fail on the
# old code), so that a test that asserts nothing is not proof.
TEST_NAME = re.compile(r"(^|/)(tests?|specs?|__tests__|t)/|(^|/)(test_[^/]*|[^/]*_tests?\.[^/]+|[^/]*\.(test|spec)"
                       r"\.[^/]+|conftest\.py|[^/]*Tests?\.(java|kt|cs))$", re.IGNORECASE)


# A file the command runs that is named as a check (check.sh, verify.py, run_tests.sh). A
# file it names otherwise is taken for the work: `python3 hello.py | grep hello` runs the
# program itself, and hello.py in the baseline would make every such check "no proof".
CHECK_NAME = re.compile(r"(^|/)(check|verify|validate|run_?tests?|tests?)[^/]*$", re.IGNORECASE)


def check_files(changed: list[str], command: str, named: list[str], setup: str | None = None) -> list[str]:
    """The check's own files among the work's new and changed ones (`changed`: git's
    `status path` lines): those the agent names (`verification.tests`), those that look
    like tests, and, when the agent named none, those the command or the setup names that
    are named as checks (`bash check.sh`). They are laid over the baseline, where the
    check must then fail."""
    present = [line.split(" ", 1)[1] for line in changed if " " in line and not line.startswith("D")]
    words = set()
    for text in (command, setup or ""):
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError:  # an unbalanced quote: its words, as the shell would not have them
            tokens = text.split()
        for token in tokens:
            words.add(token.removeprefix("./"))
    chosen = [path for path in present if path in named or TEST_NAME.search(path)
              or (not named and CHECK_NAME.search(path) and (path in words or posixpath.basename(path) in words))]
    return chosen


GOOD_CHECK = ("A good check fails before the work and passes after it: it runs what was built "
              "(the tests that exercise the new code, or the program itself with its output "
              "checked), not `true`, `test -d`, or a test that asserts nothing.")


def failed_text(run: CheckRun, command: str, expect_exit: int, failures: int, allowed: int) -> str:
    left = allowed - failures
    return (f"REFUSED: your verification failed, so the work is not done yet. vmd ran `{command}`: "
            f"exit {run.exit_code} (expected {expect_exit}{', timed out' if run.timed_out else ''}) "
            f"after {run.duration:.1f} s. Read the output, fix the cause, and finish again "
            f"({left} more failed verification{'s' if left != 1 else ''} end{'s' if left == 1 else ''} "
            f"the session as failed).\nOutput tail:\n{run.output_tail[-1500:]}")


def not_proven_text(command: str, baseline: CheckRun, files: list[str] | None = None) -> str:
    taken = ""
    if files:
        shown = ", ".join(files[:8]) + (" …" if len(files) > 8 else "")
        taken = (f" The check's own files were laid over that old project: {shown} (its tests, and the "
                 "files the command names; if one of them is the work rather than the check, name the "
                 "check's files in verification.tests).")
    return (f"REFUSED: your check passes, but it also passes on the project as it was before this "
            f"session (vmd ran `{command}` there on a fresh machine: exit {baseline.exit_code}), so it "
            f"does not prove the work.{taken} {GOOD_CHECK} Write such a check and finish with it; "
            "finishing again with a check that needs no work ends the session as passed, not proven.")


def setup_failed_text(setup: CheckRun, command: str | None, failures: int, allowed: int) -> str:
    left = allowed - failures
    return (f"REFUSED: the setup `{command}` failed on the fresh machine (exit {setup.exit_code}"
            f"{', timed out' if setup.timed_out else ''}), so vmd did not count the check's run. The "
            "fresh machine holds only the committed project: install what the work needs in the "
            f"setup, or fix the project, and finish again ({left} more failed verification"
            f"{'s' if left != 1 else ''} end{'s' if left == 1 else ''} the session as failed).\n"
            f"Setup output tail:\n{setup.output_tail[-1500:]}")


def left_out_note(left_out: list[str]) -> str:
    if not left_out:
        return ""
    shown = " ".join(left_out[:6]) + (" …" if len(left_out) > 6 else "")
    return (f"\nNot in the commit the check ran on ({len(left_out)}): {shown} — too large or not a "
            "plain file; the fresh machine does not have them.")
