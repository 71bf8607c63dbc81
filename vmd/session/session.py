"""A session: one task, one machine, one project folder, one record.

`Session` opens or loads a session and keeps its state on disk (vmd/session/state.py),
its record, its task list and its machine. It serves no verb itself: vmd/session/serving.py
does (the gate, the handler from vmd/session/handlers/, the check of its result against the
contract, the count and the record), and the handlers read and change the session. The
machine boots in the background and stops with the session's end (vmd/session/boot.py);
vmd's live sessions, which start the boot, are vmd/session/registry.py.

All machine access goes through `SessionMachine` (vmd/machines/port.py: its `guest`,
its `screen`, its life cycle), made by a `MachineFactory`; the default one drives
libvirt, tests may hand in another.

A session counts its clients (the connections bound to it) and knows when it began to
wait for a person, for vmd/server/lifecycle.py, which ends the sessions nobody ends. A full
disk on the host never leaves its files half written (vmd/session/disk.py): the session notes it
(`disk_full`), the verb answers with that sentence, and the session ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from vmd.config import VmdConfig
from vmd.contract.bounds import LOCAL_OWNER, name_problem
from vmd.contract.errors import INVALID_PARAMS, NOT_READY
from vmd.contract.params import SESSION_ID, SessionOpen
from vmd.contract.policy import POLICY, WAITING_STATES
from vmd.errors import VerbError, sentence
from vmd.machines.port import MachineFactory, MachineSpec, SessionMachine, Stall
from vmd.private_fs import passable_dir, qemu_gid
from vmd.projects.owners import gitea_name_problem
from vmd.projects.store import ProjectStore, Publication
from vmd.session import disk
from vmd.session.record import Record, Redactor
from vmd.session.state import SessionState, new_session_id
from vmd.session.tasks import TaskList


class Session:
    """One session, live in this vmd: its state, record, task list and machine. The verb
    handlers (vmd/session/handlers/) read and change it through `s`, `tasks`, `record`, `lock`,
    `save()`, `ready_machine()`, `frozen()` and `publication()`."""

    def __init__(self, state: SessionState, config: VmdConfig, machines: MachineFactory,
                 store: ProjectStore):
        self.s = state
        self.config = config
        self.machines = machines
        self.store = store
        self.dir = config.sessions_dir / state.id
        # 0710 with QEMU's group: QEMU reaches the guest's disk below it, lists nothing.
        passable_dir(self.dir, qemu_gid(config.share_user))
        self.record = Record(self.dir, Redactor([config.gitea_token.get_secret_value()],
                                                text_limit=config.record_output_chars,
                                                long_keys={"output_tail": config.record_output_tail_chars}))
        self.tasks = TaskList.from_list(state.tasks)
        self.lock = threading.RLock()
        # The machine and its boot, set by vmd/session/boot.py.
        self.machine: SessionMachine | None = None
        self.boot_done = threading.Event()
        self.boot_error: str | None = None
        self.desktop_ready = False
        self.needs_ready = False  # attached while suspended: ready() once resumed
        # The screen as a person's wait began (vmd/session/handlers/people_verbs.py): a suspended
        # guest draws nothing new, and `peek` shows this frame until session_resume drops it.
        self.kept_frame = None
        # The end (vmd/session/handlers/end_verbs.py `close`): `ending` is set when a close begins,
        # and a boot in progress stops at its next step and destroys what it made;
        # `closing` lets one close run at a time (a client's and the reaper's).
        self.ending = threading.Event()
        self.closing = threading.Lock()
        self.destroyed = False  # the machine was destroyed (by the close or the boot it stopped)
        self.boot_stopped = False  # a boot in progress was stopped by the session's end
        # Connections bound to this session (vmd/server/rpc.py) and since when none is (monotonic):
        # the reaper (vmd/server/lifecycle.py) closes a session nobody came back to.
        self.clients = 0
        self.detached_since = time.monotonic()
        self.adopted = False  # loaded by vmd at its start, not by a client
        self._full: str | None = None  # a full-disk sentence from save() or the store
        self.unsaved = False  # session.json could not be written (full disk); saved again later

    # --- opening, loading, saving -----------------------------------------------------------

    @classmethod
    def open(cls, params: SessionOpen, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore) -> "Session":
        for what, value in (("project", params.project), ("owner", params.owner)):
            problem = value and name_problem(what, value)
            if problem:
                raise VerbError(problem, INVALID_PARAMS)
        # Names Gitea reserves (`notes.wiki`, `api`, …) fail here with a sentence, not at close.
        problem = gitea_name_problem(config, params.owner, params.project)
        if problem:
            raise VerbError(problem, INVALID_PARAMS)
        sid = new_session_id()
        state = SessionState(id=sid, os=params.os or config.default_os, project=params.project or None,
                             owner=params.owner, task=params.task, chat_id=params.chat_id,
                             machine_name=f"vmagent-{sid}", host=machines.host().name)
        state.os_family = machines.os_family(state.os)
        state.desktop = machines.image_desktop(state.os)
        session = cls(state, config, machines, store)
        started = time.monotonic()
        if state.project:
            project_dir = config.projects_dir / (state.owner or LOCAL_OWNER) / state.project
            state.project_dir = str(project_dir)
            try:
                prepared = store.prepare(project_dir, state.owner, state.project, state.task)
                state.storage = prepared["text"]
                state.base_commit = prepared["base_commit"]
                state.branch = prepared["branch"]
            except Exception as exc:
                raise VerbError(f"the project folder could not be prepared: {sentence(exc, 'error')}. "
                                "Nothing was started; fix the cause and open the session again.")
        else:
            state.storage = "no project folder: nothing from this session is kept after it closes"
        session.record.append("session", event="open", session_id=sid, args=params.model_dump(),
                              project_dir=state.project_dir, storage=state.storage,
                              duration=round(time.monotonic() - started, 3))
        session.save()
        if session.disk_full:
            raise VerbError(f"{session.disk_full}. Nothing was started; free space on the host, then open "
                            "the session again.")
        return session

    @classmethod
    def load(cls, session_id: str, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore, adopt: bool = False) -> "Session":
        """A session from its session.json. One not closed gets its machine re-bound in the
        background, also when the last vmd died before it saved `machine_created` (a
        domain made meanwhile is found by its name); `adopt`: vmd's own load at its start."""
        path = config.sessions_dir / session_id / "session.json"
        if not SESSION_ID.fullmatch(session_id) or not path.is_file():
            raise VerbError(f"there is no session {session_id!r} in this vmd's state dir; "
                            "open a new one with session_open.", INVALID_PARAMS)
        session = cls(SessionState.model_validate_json(path.read_text()), config, machines, store)
        session.adopted = adopt
        session.record.append("session", event="adopt" if adopt else "attach", session_id=session_id,
                              state=session.s.state)
        return session

    def save(self) -> None:
        """session.json, replaced whole (never left truncated). A full disk does not raise:
        the state stays in memory, `disk_full` says so and the session ends; vmd saves it
        again once there is room (`flush`)."""
        with self.lock:
            self.s.tasks = self.tasks.to_list()
            try:
                disk.replace(self.dir / "session.json", self.s.model_dump_json(indent=1))
            except OSError as exc:
                if not disk.full(exc):
                    raise
                self.unsaved = True
                self.note_full(disk.sentence(f"vmd could not save {self.dir / 'session.json'}", exc))
                return
            self.unsaved = False

    # --- the host's disk ----------------------------------------------------------------

    @property
    def disk_full(self) -> str | None:
        """A sentence once the host's disk was found full for this session, else None."""
        return self._full or self.record.full

    def note_full(self, text: str) -> None:
        if self._full is None:
            self._full = text

    def flush(self) -> bool:
        """Writes what a full disk held back (record events, session.json); True when all is on disk."""
        written = self.record.flush()
        if self.unsaved:
            self.save()
        return written and not self.unsaved

    def held(self) -> bool:
        """Whether vmd must keep this session in memory after its close: its push is still
        being retried, or a full disk kept part of it from its files."""
        pending = self.s.push is not None and self.s.push.state == "pending"
        return pending or self.unsaved or bool(self.record.unwritten)

    # --- clients ------------------------------------------------------------------------

    def client_joined(self) -> None:
        with self.lock:
            self.clients += 1
            self.s.clients, self.s.detached_at = self.clients, None
            if self.s.state != "closed":
                self.save()

    def client_left(self) -> None:
        with self.lock:
            self.clients = max(0, self.clients - 1)
            self.s.clients = self.clients
            if self.clients == 0:
                self.detached_since = time.monotonic()
                self.s.detached_at = time.time()
            if self.s.state != "closed":
                self.save()

    def detached_for(self) -> float | None:
        """Seconds since the last client went, or None while one is bound."""
        return None if self.clients else time.monotonic() - self.detached_since

    # --- what serving a verb changes (vmd/session/serving.py) ------------------------------

    def count(self, verb: str) -> None:
        if POLICY[verb].counts_as_step:
            with self.lock:
                self.s.steps += 1
                self.save()

    def track_waiting(self) -> None:
        """When the session began to wait for a person: the reaper keeps its guest
        question_keep_s from then."""
        with self.lock:
            waiting = self.s.state in WAITING_STATES
            if waiting == (self.s.waiting_since is not None):
                return
            self.s.waiting_since = time.time() if waiting else None
            if self.s.state != "closed":
                self.save()

    def spec(self) -> MachineSpec:
        return MachineSpec(session_id=self.s.id, os=self.s.os, name=self.s.machine_name,
                           workdir=self.dir / "machine",
                           project_dir=Path(self.s.project_dir) if self.s.project_dir else None,
                           egress=self.s.egress, host=self.machines.host(self.s.host))

    @property
    def boot_timeout(self) -> float:
        return self.config.boot_timeout_s * self._timeout_scale()

    @property
    def verify_timeout(self) -> float:
        return self.config.verify_timeout_s * self._timeout_scale()

    def _timeout_scale(self) -> float:
        # The configured timeouts are what a KVM host needs; without KVM (TCG, as on the
        # CI machines) the same work takes several times longer.
        return float(self.machines.timeout_scale())

    def machine_alive(self) -> bool:
        """False only when the machine is known to be gone (destroyed from outside, crashed)."""
        machine = self.machine
        if machine is None:
            return True
        try:
            return bool(machine.alive())
        except Exception:
            return False

    def machine_stalled(self) -> Stall | None:
        """Why QEMU paused the guest on its own (a write to its disk failed on the host),
        or None."""
        machine = self.machine
        if machine is None:
            return None
        try:
            return machine.stalled()
        except Exception:
            return None

    def ready_machine(self) -> SessionMachine:
        """The machine, once it is up; waits for the boot if it is still going. The
        handlers use its `guest` and `screen` (vmd/machines/port.py)."""
        if not self.boot_done.wait(self.boot_timeout):
            raise VerbError(f"the machine is still booting after {self.boot_timeout:.0f} s; "
                            "call session_ready with a longer timeout.", NOT_READY)
        if self.boot_error:
            raise VerbError(self.boot_error, NOT_READY)
        if self.machine is None:
            raise VerbError("this session has no machine (it was closed).", NOT_READY)
        return self.machine

    def publication(self) -> Publication:
        """The session's project on its way out, its remote resolved once: what a close, a
        checkpoint or a git_commit commits (and pushes) through."""
        return _WatchedPublication(self.store.publication(self.s.owner, self.s.project or "", self.s.task),
                                   self)

    @contextlib.contextmanager
    def frozen(self):
        """The guest paused while vmd reads the project folder, so the tree cannot change
        under the commit; resumed after, unless it was paused already (a question)."""
        machine = self.machine
        paused = False
        if machine is not None and self.boot_done.is_set() and self.s.state not in WAITING_STATES:
            try:
                machine.suspend()
                paused = True
            except Exception as exc:
                self.record.append("machine", event="pause_failed", error=sentence(exc, "pause failed"))
        try:
            yield
        finally:
            if paused:
                try:
                    machine.resume()
                except Exception as exc:
                    self.record.append("machine", event="resume_failed", error=sentence(exc, "resume failed"))


class _WatchedPublication:
    """A publication as one session uses it: a commit that finds the host's disk full is
    noted on the session (`note_full`) whoever catches the error (a checkpoint keeps its
    task update), so that the session ends with a report saying so."""

    def __init__(self, publication: Publication, session: Session):
        self._publication = publication
        self._session = session

    def __getattr__(self, name: str):
        return getattr(self._publication, name)

    def commit(self, *args, **kwargs) -> dict:
        try:
            return self._publication.commit(*args, **kwargs)
        except Exception as exc:
            if disk.full(exc, by_text=True):  # git on this host says so in words
                self._session.note_full(disk.sentence("a commit into vmd's repository failed", exc))
            raise
