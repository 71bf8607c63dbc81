"""The eval's hidden check (`hidden_check`, asked by `vmagent eval`, never by the model),
in a clean room (vmd/session/clean_room.py): vmd commits the project folder (the guest
paused), boots a fresh machine holding that commit, and only then writes the check's
files to a fresh folder there, outside the project. The model's guest never sees them
and cannot touch the run: no planted interpreter, no `sitecustomize.py` on a path, no
process left behind reaches the room.

A bare exit 0 is not "solved": vmd leaves a nonce in `$CHECK_DIR/.nonce` and counts the
check as passed only when the check wrote it to `$CHECK_RESULT` (the check's own helper
takes it before any of the project's code runs: vmagent/eval/in_room/vmdcheck.py).
The verb's line in the record keeps the run."""

from __future__ import annotations

import base64
import secrets
import shlex

from vmd.contract.params import HiddenCheck
from vmd.errors import refused
from vmd.guests.guest import GuestError
from vmd.session.check_flow import candidate_commit
from vmd.session.clean_room import CleanRoom, RoomUnavailable
from vmd.session.session import Session

# Outside the project share, so that nothing of the check is committed or pushed, and on
# the guest's disk rather than /tmp (a tmpfs on some images).
CHECK_ROOT = "/var/tmp"


def hidden_check(session: Session, p: HiddenCheck, notify) -> dict:
    if (session.s.os_family or "linux") != "linux":
        raise refused(f"a hidden check runs on Linux guests only; this session's guest is "
                      f"{session.s.os_family}. Run the eval on a Linux image (--os debian).")
    session.ready_machine()
    nonce = secrets.token_hex(16)
    folder = f"{CHECK_ROOT}/vmd-check-{secrets.token_hex(6)}"
    result_file = f"{folder}/.result"
    timeout = min(p.timeout, session.verify_timeout)
    try:
        publication = session.publication()
        candidate, _left_out = candidate_commit(session, publication) if session.s.project_dir else (None, [])
        repo = publication.repository()
        with CleanRoom(session, "eval") as room:
            room.lay_out(repo, candidate)
            machine = room.boot(desktop=p.desktop)
            _put(machine, folder, {**p.files, ".nonce": nonce})
            command = (f"chmod 700 {shlex.quote(folder)}; export CHECK_DIR={shlex.quote(folder)} "
                       f"CHECK_RESULT={shlex.quote(result_file)}; {p.command}")
            got = room.run(None, command, p.expect_exit, timeout, None, session.config.output_tail_chars)
            wrote = _result(machine, result_file)
    except RoomUnavailable as exc:
        raise refused(f"the hidden check could not run on a fresh machine: {exc}") from None
    run = got.check
    solved = run.passed and wrote == nonce
    verdict = ("passed" if solved else "timed out" if run.timed_out else
               "failed: it exited as expected but wrote no result (a bare exit is not a pass)" if run.passed
               else "failed")
    text = (f"The hidden check {verdict}: exit {run.exit_code} (expected {p.expect_exit}) after "
            f"{run.duration:.1f} s on a fresh machine holding commit {(candidate or 'none')[:10]}.\n"
            f"Output tail:\n{run.output_tail[-1500:]}")
    return {**run.model_dump(), "passed": solved, "exited_as_expected": run.passed, "result_written": wrote == nonce,
            "where": "clean_room", "candidate": candidate, "command": p.command, "expect_exit": p.expect_exit,
            "text": text}


# The check's files go in and its result comes out through a command, not SFTP: in a room
# restored from a room template the first SFTP request went unanswered for its whole 60 s
# (tests/e2e/test_eval_vm.py, every run once templates were in use), while commands answered.
# The cause is not found yet; a command is what the check itself runs through anyway.
PUT_TIMEOUT_S = 120.0


def _put(machine, folder: str, files: dict[str, str]) -> None:
    lines = ["set -e", "umask 077", f"mkdir -p {shlex.quote(folder)}"]
    for name, text in files.items():
        data = base64.b64encode(text.encode()).decode()
        lines.append(f"printf %s {data} | base64 -d > {shlex.quote(folder + '/' + name)}")
    got = machine.guest.run("\n".join(lines), timeout=PUT_TIMEOUT_S, cwd="/")
    if got.exit_code != 0:
        raise GuestError(f"the hidden check's files could not be put on the fresh machine: exit "
                         f"{got.exit_code}: {(got.stderr or got.stdout)[-300:]}")


def _result(machine, path: str) -> str:
    try:
        got = machine.guest.run(f"head -c 200 {shlex.quote(path)} 2>/dev/null || true", timeout=PUT_TIMEOUT_S,
                                cwd="/")
        return got.stdout.strip()
    except Exception:  # no result file: the check did not say it passed
        return ""


HANDLERS = {
    "hidden_check": hidden_check,
}
