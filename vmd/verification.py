"""vmd's own run of the agent's check, and whether the check needs the work.

A check proves the work only if it needs the work. After the agent's check passes in the
guest, vmd runs the same command, at the same path, against the project as it was when
the session opened (the *baseline*: vmd's commit of that moment, or nothing for a new
project). A check that passes there too — `true`, `test -d /mnt/project`, a test file
that asserts nothing — is reported as passed-not-proven, never as verified.

How the baseline is shown to the command: in a private mount namespace in the guest, a
copy of the baseline is bind-mounted over the project path, and only the check runs in
that namespace. Why not swap the host folder: QEMU's 9p server holds the export by its
directory, so a swap would have to move the work out of the folder and back, and a vmd
that died in between would leave the guest looking at the wrong files. This way the
host folder is never touched (nothing can be lost whatever dies), and every other
process in the guest keeps seeing the work where it was.
"""

from __future__ import annotations

import io
import secrets
import shlex
import tarfile
from typing import Callable

from pydantic import BaseModel

from vmd.repository import Repository

# What the record and the report keep of one run's output.
OutputSink = Callable[[str, str], None] | None


class CheckRun(BaseModel):
    exit_code: int | None
    passed: bool
    timed_out: bool = False
    duration: float = 0.0
    output_tail: str = ""
    error: str | None = None  # the run could not be made at all (the baseline, on some guests)


def _tail(result: dict, chars: int) -> str:
    out, err = result.get("stdout") or "", result.get("stderr") or ""
    text = out + ("\n" if out and err else "") + err
    return text[-chars:]


def run_check(machine, command: str, expect_exit: int, cwd: str | None, timeout: float,
              sink: OutputSink, tail_chars: int) -> CheckRun:
    result = machine.run(command, timeout, cwd, sink)
    passed = result["exit_code"] == expect_exit and not result.get("timed_out")
    return CheckRun(exit_code=result["exit_code"], passed=passed, timed_out=bool(result.get("timed_out")),
                    duration=result.get("duration") or 0.0, output_tail=_tail(result, tail_chars))


def baseline_archive(repo: Repository, base_commit: str | None) -> bytes:
    """The project as it was when the session opened, as a tar: vmd's commit of that
    moment, or an empty archive for a new project."""
    if base_commit and repo.exists():
        result = repo.git("archive", "--format=tar", base_commit)
        return result.stdout
    buffer = io.BytesIO()
    tarfile.open(fileobj=buffer, mode="w").close()
    return buffer.getvalue()


def linux_baseline_command(command: str, project_path: str, user: str, archive_path: str) -> str:
    """A shell line for a Linux guest: unpack the baseline, bind it over the project
    path in a private mount namespace, run the check there as the guest user."""
    folder = f"/tmp/vmd-baseline-{secrets.token_hex(4)}"
    inner = (f"mount --bind {shlex.quote(folder)} {shlex.quote(project_path)} && "
             f"cd {shlex.quote(project_path)} && exec runuser -u {shlex.quote(user)} -- bash -c "
             f"{shlex.quote(command)}")
    return (f"set -o pipefail; sudo mkdir -p {folder} && sudo tar -xf {shlex.quote(archive_path)} -C {folder} "
            f"&& sudo chown -R {shlex.quote(user)}: {folder} || exit 125; "
            f"sudo unshare --mount --propagation private -- sh -c {shlex.quote(inner)}; rc=$?; "
            f"sudo rm -rf {folder} {shlex.quote(archive_path)}; exit $rc")


def run_baseline(machine, command: str, expect_exit: int, archive: bytes, timeout: float,
                 tail_chars: int) -> CheckRun:
    """The check against the baseline. A machine that cannot show a baseline (it has no
    `run_baseline`) gives an error, which the outcome reports as not checked."""
    runner = getattr(machine, "run_baseline", None)
    if runner is None:
        return CheckRun(exit_code=None, passed=False,
                        error="this machine cannot run a check against the baseline")
    try:
        result = runner(command, archive, timeout)
    except Exception as exc:  # the proof is not checked; the work is not at stake
        return CheckRun(exit_code=None, passed=False, error=f"{type(exc).__name__}: {exc}"[:400])
    if result["exit_code"] == 125 and "vmd-baseline" in (result.get("stderr") or ""):
        return CheckRun(exit_code=None, passed=False, error="the baseline could not be unpacked in the guest: "
                        + _tail(result, 300))
    passed = result["exit_code"] == expect_exit and not result.get("timed_out")
    return CheckRun(exit_code=result["exit_code"], passed=passed, timed_out=bool(result.get("timed_out")),
                    duration=result.get("duration") or 0.0, output_tail=_tail(result, tail_chars))


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
