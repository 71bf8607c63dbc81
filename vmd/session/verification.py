"""vmd's own run of the agent's check, and whether the check needs the work.

A check proves the work only if it needs the work. After the agent's check passes in the
guest, vmd runs the same command, at the same path, against the project as it was when
the session opened (the *baseline*: vmd's commit of that moment, or nothing for a new
project). A check that passes there too — `true`, `test -d /mnt/project`, a test file
that asserts nothing — is reported as passed-not-proven, never as verified.

How the baseline is shown to the command (on Linux: vmd/guests/os_verbs.py
`linux_baseline_command`): in a private mount namespace in the guest, a copy of the
baseline is bind-mounted over the project path, and only the check runs in that
namespace. Why not swap the host folder: QEMU's 9p server holds the export by its
directory, so a swap would have to move the work out of the folder and back, and a vmd
that died in between would leave the guest looking at the wrong files. This way the
host folder is never touched (nothing can be lost whatever dies), and every other
process in the guest keeps seeing the work where it was. On Windows
(vmd/guests/windows_verbs.py `run_baseline`) the same holds by another means: the check
runs over a second SSH connection, a logon session of its own, where `subst` shows the
unpacked copy at the project's drive letter while the session's own Z: stays the share.
"""

from __future__ import annotations

import io
import tarfile
from typing import TYPE_CHECKING, Callable

from vmd.projects.repository import Repository
from vmd.verb_results import CheckRunResult

if TYPE_CHECKING:
    from vmd.guests.guest import CommandResult, Guest

# What the record and the report keep of one run's output.
OutputSink = Callable[[str, str], None] | None


# One run of the check is what the contract says it is (vmd/verb_results.py).
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


def baseline_archive(repo: Repository, base_commit: str | None) -> bytes:
    """The project as it was when the session opened, as a tar: vmd's commit of that
    moment, or an empty archive for a new project."""
    if base_commit and repo.exists():
        result = repo.git("archive", "--format=tar", base_commit)
        return result.stdout
    buffer = io.BytesIO()
    tarfile.open(fileobj=buffer, mode="w").close()
    return buffer.getvalue()


def run_baseline(guest: Guest, command: str, expect_exit: int, archive: bytes, timeout: float,
                 tail_chars: int) -> CheckRun:
    """The check against the baseline (the guest's `run_baseline`: on Linux,
    vmd/guests/os_verbs.py). A guest that cannot show a baseline gives an error, which the
    outcome reports as not checked."""
    try:
        result = guest.run_baseline(command, archive, timeout)
    except Exception as exc:  # the proof is not checked; the work is not at stake
        return CheckRun(exit_code=None, passed=False, error=f"{type(exc).__name__}: {exc}"[:400])
    if result.exit_code == 125 and "vmd-baseline" in (result.stderr or ""):
        return CheckRun(exit_code=None, passed=False, error="the baseline could not be unpacked in the guest: "
                        + _tail(result, 300))
    return _checked(result, expect_exit, tail_chars)


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


def not_proven_text(command: str, baseline: CheckRun) -> str:
    return (f"REFUSED: your check passes, but it also passes on the project as it was before this "
            f"session (vmd ran `{command}` there: exit {baseline.exit_code}), so it does not prove "
            f"the work. {GOOD_CHECK} Write such a check and finish with it; finishing again with a "
            "check that needs no work ends the session as passed, not proven.")
