"""Clean rooms: where vmd runs a check it must be able to trust.

The session's guest is the model's: it had root there (the agent user has passwordless
sudo), so anything a check run there says (a planted `/usr/local/bin/python3`, a
`sitecustomize.py`, a process left running under `setsid`) may be the model's own word.
A clean room is a **fresh machine of the session's image** (one parked ahead from the host's
room template and used once: vmd/machines/parked_rooms.py; else restored from the room
template, a guest saved once and never written again; else a cold boot: the session's
`MachineFactory.create` with `for_check`; vmd/machines/room_templates.py), whose project folder is
a new host folder holding one commit of vmd's repository as a git work tree (with
`.git`), at the same path as in the session. The session's guest has no path to it: no
shared folder, no network between them. Its egress follows the session's approval. The
room's machine is destroyed and its folder removed when the run is over.

    <session dir>/rooms/<label>/   project/ (the commit's tree), machine/ (the guest's files)

The finish uses two (vmd/session/handlers/end_verbs.py): the candidate commit, and the
baseline (the base commit with the check's own files laid over it). The eval's hidden
check uses one (vmd/session/handlers/eval_verbs.py). A room that cannot be had is a
`RoomUnavailable` whose sentence the finish passes on; vmd never falls back to the
session's guest.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vmd.errors import sentence
from vmd.machines.port import MachineSpec, SessionMachine
from vmd.private_fs import passable_dir, qemu_gid
from vmd.projects.repository import Repository, RepositoryError, git_env
from vmd.projects.tree import present_to_guest, share_owner
from vmd.session import verification as check
from vmd.session.session import Session


class RoomUnavailable(RuntimeError):
    """No fresh machine could be had for a check (no image, a boot that failed, no room on
    the host); the message says what happened, in words the agent can act on."""


@dataclass
class RoomRun:
    """What one clean room ran: the setup (when named) and the check."""
    setup: check.CheckRun | None
    check: check.CheckRun
    project_path: str  # where the project was in the room's guest (the session's path)
    came: str  # "parked", "template" or "cold": how the room's machine came (vmd/machines/parked_rooms.py)
    seconds: float  # the room's whole cost: its tree, its machine, its runs, its end


def lay_out(repo: Repository, commit: str | None, folder: Path, overlay: dict[str, bytes],
            owner: tuple[int, int] | None) -> None:
    """Write the room's project: `commit` of vmd's repository as a git work tree at
    `folder` (a new folder; an empty repository for no commit), with only that commit's
    history in its `.git` (a baseline's room holds nothing of the work, not even in its
    objects), then `overlay` (path -> bytes: the check's own files) committed over it, so
    that both rooms look alike to git (`git status` clean in each). Shown to the guest as
    its user's files."""
    folder = folder.absolute()
    Repository.init_work_tree(folder)
    env = git_env(extra={"GIT_DIR": str(folder / ".git"), "GIT_WORK_TREE": str(folder),
                         "GIT_AUTHOR_NAME": "vmagent", "GIT_AUTHOR_EMAIL": "vmagent@localhost",
                         "GIT_COMMITTER_NAME": "vmagent", "GIT_COMMITTER_EMAIL": "vmagent@localhost"})

    def git(*args: str) -> None:
        result = subprocess.run(["git", *args], cwd=folder, env=env, capture_output=True, timeout=300,
                                stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise RepositoryError(f"git {args[0]} failed: {result.stderr.decode(errors='replace')[-300:]}")

    if commit:
        # A ref of its own for the fetch: git hands out what a ref reaches, and only that.
        ref = f"refs/vmd/room-{secrets.token_hex(6)}"
        repo.git("update-ref", ref, commit)
        try:
            git("fetch", "-q", "--no-tags", "--update-head-ok", str(repo.path), f"{ref}:refs/heads/main")
        finally:
            repo.git("update-ref", "-d", ref, check=False)
        git("reset", "-q", "--hard", "main")
    for path, data in overlay.items():
        target = folder / path
        # The paths come from the candidate commit's tree (never ".." or .git: the contract's
        # Verification and git itself refuse them); a folder of the old tree may stand where
        # the check needs a file's parent.
        if folder.resolve() not in target.resolve().parents or path.split("/")[0] == ".git":
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        target.write_bytes(data)
    if overlay:
        git("add", "-A")
        git("commit", "-q", "--allow-empty", "-m", "the check's own files, from the work")
    shutil.rmtree(folder / ".git" / "hooks", ignore_errors=True)
    present_to_guest(folder, owner)


class CleanRoom:
    """One fresh machine for one run: `with CleanRoom(session, label) as room: room.run(...)`.
    `label` names the room's folder and its guest (`<session's machine>-<label>`).

    `boot_beside()` starts the machine's boot in a thread of its own, so that the finish's
    baseline room comes up while the candidate's check runs; a room left before that boot
    ended (the check failed: no baseline is needed) is torn down by that thread once it
    ends, so the refusal never waits for a boot it does not use."""

    def __init__(self, session: Session, label: str):
        self.session = session
        self.label = f"{label}-{secrets.token_hex(3)}"
        self.dir = session.dir / "rooms" / self.label
        self.project = self.dir / "project"
        self.machine: SessionMachine | None = None
        self.started = time.monotonic()
        self._booting: threading.Thread | None = None
        self._boot_error: RoomUnavailable | None = None
        self._left = False  # the room's user is done with it (its `with` ended)
        self._state = threading.Lock()

    def __enter__(self) -> "CleanRoom":
        gid = qemu_gid(self.session.config.share_user)
        passable_dir(self.dir.parent, gid)
        passable_dir(self.dir, gid)
        return self

    def __exit__(self, *exc) -> None:
        with self._state:
            self._left = True
            if self._booting is not None and self._booting.is_alive():
                return  # the boot's thread tears the room down when the boot ends
        self._tear_down()

    def _tear_down(self) -> None:
        machine, self.machine = self.machine, None
        if machine is not None:
            try:
                machine.destroy()
            except Exception as error:  # the sweep destroys it once the session is closed
                self.session.record.append("machine", event="room_not_destroyed", room=self.label,
                                           error=sentence(error, "destroy failed"))
        shutil.rmtree(self.dir, ignore_errors=True)

    def boot_beside(self, desktop: bool = False) -> None:
        """Boot the room's machine in a thread of its own; `run` waits for it."""

        def boot() -> None:
            try:
                self.boot(desktop)
            except RoomUnavailable as exc:
                self._boot_error = exc
            except Exception as exc:  # never lost in the thread: `run` raises it as the room's
                self._boot_error = RoomUnavailable(sentence(exc, "the fresh machine did not boot"))
            with self._state:
                left = self._left
            if left:
                self._tear_down()

        self._booting = threading.Thread(target=boot, name=f"room-{self.label}", daemon=True)
        self._booting.start()

    def _booted(self) -> SessionMachine:
        if self._booting is not None:
            self._booting.join()
            if self._boot_error is not None:
                raise self._boot_error
        return self.machine or self.boot()

    def lay_out(self, repo: Repository, commit: str | None, overlay: dict[str, bytes] | None = None) -> None:
        try:
            lay_out(repo, commit, self.project, overlay or {}, share_owner(self.session.config.share_user))
        except (OSError, RepositoryError, subprocess.SubprocessError) as exc:
            raise RoomUnavailable(sentence(exc, "the project could not be laid out for the fresh machine")) from None

    def boot(self, desktop: bool = False) -> SessionMachine:
        s = self.session.s
        spec = MachineSpec(session_id=s.id, os=s.os, name=f"{s.machine_name or 'vmagent-' + s.id}-{self.label}",
                           workdir=self.dir / "machine", project_dir=self.project, egress=s.egress,
                           host=self.session.machines.host(s.host), for_check=True)
        try:
            self.machine = self.session.machines.create(spec)
            self.machine.ready(self.session.boot_timeout, desktop=desktop)
        except Exception as exc:
            raise RoomUnavailable(sentence(exc, "the fresh machine did not boot")) from None
        return self.machine

    def run(self, setup: str | None, command: str, expect_exit: int, timeout: float,
            sink: check.OutputSink, tail_chars: int) -> RoomRun:
        """Boot the room's machine, run `setup` (its exit is reported, never taken as the
        check's) and then the check in the project folder."""
        machine = self._booted()
        cwd = machine.project_path
        setup_run = None
        try:
            if setup:
                setup_run = check.run_check(machine.guest, setup, 0, cwd, timeout, sink, tail_chars)
            run = check.run_check(machine.guest, command, expect_exit, cwd, timeout, sink, tail_chars)
        except Exception as exc:  # the room's guest went away under the check (a reboot, a crash)
            raise RoomUnavailable(sentence(exc, "the fresh machine stopped answering during the check")) from None
        return RoomRun(setup=setup_run, check=run, project_path=cwd, came=getattr(machine, "came", "cold"),
                       seconds=round(time.monotonic() - self.started, 3))
