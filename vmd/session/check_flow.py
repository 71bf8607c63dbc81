"""Where and how a finish's check runs: the candidate commit, its clean room, and the
baseline's (vmd/session/clean_room.py); or, for a check of the machine rather than the
project (`verification.in = "session"`, or a session without a project), the session's
own guest. vmd/session/handlers/end_verbs.py decides on what this returns.

1. **One verified snapshot.** The guest is paused while vmd commits the project folder's
   bytes into its repository (the *candidate*); from then on that commit is what is
   checked, reported and, at the close, pushed as verified (a tree that changed after it
   is pushed as not verified).
2. **The clean room**: a fresh machine with the candidate as a git work tree at the
   project's path; the setup (when named) and then the check run there.
3. **The baseline, the SWE-bench way**: a second fresh machine with the base commit (or
   an empty project) and the check's own files from the candidate
   (`verification.check_files`) committed over it, booted while the candidate's check
   runs and used only when that check passed; the setup is run there too (its exit is not
   the check's), then the check. Proven: it fails there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vmd.contract.check import Verification
from vmd.errors import sentence
from vmd.projects.store import Publication
from vmd.session import verification as check
from vmd.session.clean_room import CleanRoom, RoomRun, RoomUnavailable
from vmd.session.handlers.output import streamed
from vmd.session.session import Session


@dataclass
class Checked:
    """One finish's runs, as end_verbs turns them into the attempt and the outcome."""
    where: str  # "clean_room" or "session"
    run: check.CheckRun
    cwd: str | None
    setup: check.CheckRun | None = None
    baseline: check.CheckRun | None = None  # None: not run (the check failed, or a session check)
    candidate: str | None = None
    check_files: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # the folder's files the candidate lacks
    rooms: list[dict] = field(default_factory=list)  # each room: how its machine came, its cost


def verify(session: Session, v: Verification, notify) -> Checked:
    """Raises RoomUnavailable when a fresh machine cannot be had (the finish refuses; it
    never falls back to the session's guest)."""
    tail = session.config.output_tail_chars
    timeout = session.verify_timeout
    if v.in_ == "session" or not session.s.project_dir:
        machine = session.ready_machine()
        cwd = session.s.facts.get("project_path") or machine.project_path if session.s.project_dir else None
        setup = None
        with streamed(notify) as sink:
            if v.setup:
                setup = check.run_check(machine.guest, v.setup, 0, cwd, timeout, sink, tail)
            run = check.run_check(machine.guest, v.command, v.expect_exit, cwd, timeout, sink, tail)
        return Checked(where="session", run=run, cwd=cwd, setup=setup)
    session.ready_machine()  # the work is done in the session's machine: its boot is over
    publication = session.publication()
    candidate, left_out = candidate_commit(session, publication)
    repo = publication.repository()
    # The baseline's project is known once the candidate is: its room boots while the
    # candidate's check runs (two restores side by side instead of one after the other), and
    # is torn down unused when the check fails.
    changed = repo.changed_files(session.s.base_commit, candidate) if candidate else []
    check_files = check.check_files(changed, v.command, v.tests, v.setup)
    overlay = {path: _blob(repo, candidate, path) for path in check_files} if candidate else {}
    with CleanRoom(session, "check") as room, CleanRoom(session, "base") as base_room:
        room.lay_out(repo, candidate)
        base_room.lay_out(repo, session.s.base_commit if repo.exists() else None,
                          {p: data for p, data in overlay.items() if data is not None})
        base_room.boot_beside()
        with streamed(notify) as sink:
            got = room.run(v.setup, v.command, v.expect_exit, timeout, sink, tail)
        checked = Checked(where="clean_room", run=got.check, cwd=got.project_path, setup=got.setup,
                          candidate=candidate, left_out=left_out, rooms=[_room(got, "check")])
        if got.setup is not None and not got.setup.passed:
            return checked  # the setup failed: the check's run says nothing of the work
        if not got.check.passed:
            return checked
        checked.check_files = check_files
        base = base_room.run(v.setup, v.command, v.expect_exit, timeout, None, tail)
    checked.baseline = base.check
    checked.rooms.append(_room(base, "baseline"))
    return checked


def candidate_commit(session: Session, publication: Publication) -> tuple[str | None, list[str]]:
    """The project folder's bytes committed while the guest is paused: the candidate."""
    attempt = len(session.s.verifications) + 1
    message = (f"The work as finish {attempt} checks it\n\nvmagent session {session.s.id}\n\n"
               "Candidate: vmd checks this commit on a fresh machine.")
    try:
        with session.frozen():
            committed = publication.commit(Path(session.s.project_dir), message, allow_empty=False)
    except Exception as exc:
        raise RoomUnavailable(sentence(exc, "the project folder could not be committed for the check")) from None
    return committed["sha"], list(committed.get("left_out") or [])


def _blob(repo, commit: str, path: str) -> bytes | None:
    """A file of the candidate by its path (None: not a plain file there, e.g. a link)."""
    listed = repo.git("ls-tree", "-z", commit, "--", path, check=False).stdout
    if not listed.startswith((b"100644 ", b"100755 ")):
        return None
    return repo.git("cat-file", "blob", f"{commit}:{path}").stdout


def _room(got: RoomRun, role: str) -> dict:
    return {"role": role, "came": got.came, "seconds": got.seconds}
