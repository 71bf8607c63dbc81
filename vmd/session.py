"""A session: one task, one machine, one project folder, one record.

`Session` opens or loads a session, boots its machine in the background, keeps its state
on disk (`<state_dir>/sessions/<id>/session.json`: everything a restarted vmd needs to
carry on) and serves a verb: the gate (machine verbs wait for a plan; a closed,
cancelled or waiting session refuses), the handler from vmd/handlers/, the count and the
record. The rules of the verbs themselves (finish refused while a task is open, the
check re-run by vmd) live in their handlers.

All machine access goes through `SessionMachine` (vmd/machine_port.py), made by a
`MachineFactory`; the default one drives libvirt, tests may hand in another.

A session counts its clients (the connections bound to it) and knows when it began to
wait for a person, for vmd/lifecycle.py, which ends the sessions nobody ends. A full
disk on the host never leaves its files half written (vmd/disk.py): the session notes it
(`disk_full`), the verb answers with that sentence, and the session ends.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, Field

from vmd import disk
from vmd import verbs as V
from vmd.config import VmdConfig
from vmd.errors import INVALID_PARAMS, NOT_READY, REFUSED, VerbError, sentence
from vmd.handlers import HANDLERS
from vmd.handlers.output import Notify
from vmd.machine_port import LibvirtMachines, MachineFactory, MachineSpec, SessionMachine
from vmd.project_store import ProjectStore
from vmd.push_retry import PushState
from vmd.record import Record, Redactor
from vmd.tasks import TaskList

_SESSION_ID = re.compile(r"^s-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
# How long a close waits for a boot in progress to stop: a create under way (qemu-img, the
# domain's definition and start: seconds) must return before its domain can be destroyed,
# and a boot waiting for SSH notices its destroyed guest within its connect timeout (10 s).
BOOT_STOP_WAIT_S = 60.0
ENDED_BEFORE_READY = "the session ended before the machine was ready"
WAITING = ("question", "unfreeze")


# --- persisted state -----------------------------------------------------------------------

class SessionState(BaseModel):
    id: str
    os: str
    project: str | None = None
    owner: str = ""
    task: str = ""
    chat_id: str = ""
    created: float = Field(default_factory=time.time)
    # booting | ready | question | unfreeze | finished | cancelled | closed
    state: str = "booting"
    resume_state: str = "booting"  # where question/unfreeze go back to
    machine_name: str = ""
    machine_created: bool = False
    project_dir: str | None = None
    storage: str = ""
    base_commit: str | None = None
    branch: str = "main"  # the Gitea branch the history came from and goes back to
    tasks: list[dict] = []
    runs: int = 0
    steps: int = 0
    question: str = ""
    unfreeze_request: str = ""
    answer: str = ""
    egress: bool = False
    cancelled: bool = False
    boot_seconds: float | None = None
    facts: dict = {}
    outcome: dict | None = None
    verifications: list[dict] = []  # every run of the agent's check, in order
    baseline_refused: bool = False  # a finish was refused once for a check that proves nothing
    summary: str = ""
    close: dict | None = None
    push: PushState | None = None  # the push at close and its retries (vmd/push_retry.py)
    # Connections bound to the session as vmd last saved them, and since when none is
    # (epoch seconds): what `vmd sessions` shows; the reaper counts live ones in memory.
    clients: int = 0
    detached_at: float | None = None
    waiting_since: float | None = None  # when the session began to wait for a person


def new_session_id() -> str:
    return datetime.now(timezone.utc).strftime("s-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


class Session:
    """One session, live in this vmd: its state, record, task list and machine. The verb
    handlers (vmd/handlers/) read and change it through `s`, `tasks`, `record`, `lock`,
    `save()`, `guest()` and `frozen()`."""

    def __init__(self, state: SessionState, config: VmdConfig, machines: MachineFactory,
                 store: ProjectStore):
        self.s = state
        self.config = config
        self.machines = machines
        self.store = _WatchedStore(store, self)
        self.dir = config.sessions_dir / state.id
        self.record = Record(self.dir, Redactor([config.gitea_token.get_secret_value()],
                                                text_limit=config.record_output_chars,
                                                long_keys={"output_tail": config.record_output_tail_chars}))
        self.tasks = TaskList.from_list(state.tasks)
        self.lock = threading.RLock()
        self.machine: SessionMachine | None = None
        self.boot_done = threading.Event()
        self.boot_error: str | None = None
        self.desktop_ready = False
        self.needs_ready = False  # attached while suspended: ready() once resumed
        # The end (vmd/handlers/end_verbs.py `close`): `ending` is set when a close begins,
        # and a boot in progress stops at its next step and destroys what it made;
        # `closing` lets one close run at a time (a client's and the reaper's).
        self.ending = threading.Event()
        self.closing = threading.Lock()
        self.destroyed = False  # the machine was destroyed (by the close or the boot it stopped)
        self.boot_stopped = False  # a boot in progress was stopped by the session's end
        # Connections bound to this session (vmd/rpc.py) and since when none is (monotonic):
        # the reaper (vmd/lifecycle.py) closes a session nobody came back to.
        self.clients = 0
        self.detached_since = time.monotonic()
        self.adopted = False  # loaded by vmd at its start, not by a client
        self._full: str | None = None  # a full-disk sentence from save() or the store
        self.unsaved = False  # session.json could not be written (full disk); saved again later

    # --- opening, loading, saving -----------------------------------------------------------

    @classmethod
    def open(cls, params: V.SessionOpen, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore) -> "Session":
        for what, value in (("project", params.project), ("owner", params.owner)):
            problem = value and V.name_problem(what, value)
            if problem:
                raise VerbError(problem, INVALID_PARAMS)
        # Names Gitea reserves (`notes.wiki`, `api`, …) fail here with a sentence, not at close.
        from vmd.owners import gitea_name_problem
        problem = gitea_name_problem(config, params.owner, params.project)
        if problem:
            raise VerbError(problem, INVALID_PARAMS)
        sid = new_session_id()
        state = SessionState(id=sid, os=params.os or config.default_os, project=params.project or None,
                             owner=params.owner, task=params.task, chat_id=params.chat_id,
                             machine_name=f"vmagent-{sid}")
        session = cls(state, config, machines, store)
        started = time.monotonic()
        if state.project:
            project_dir = config.projects_dir / (state.owner or V.LOCAL_OWNER) / state.project
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
        session._start_machine(attach=False)
        if params.wait:
            session.boot_done.wait(session.boot_timeout)
        return session

    @classmethod
    def load(cls, session_id: str, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore, adopt: bool = False) -> "Session":
        """A session from its session.json. One not closed gets its machine re-bound in the
        background, also when the last vmd died before it saved `machine_created` (a
        domain made meanwhile is found by its name); `adopt`: vmd's own load at its start."""
        path = config.sessions_dir / session_id / "session.json"
        if not _SESSION_ID.match(session_id) or not path.is_file():
            raise VerbError(f"there is no session {session_id!r} in this vmd's state dir; "
                            "open a new one with session_open.", INVALID_PARAMS)
        session = cls(SessionState.model_validate_json(path.read_text()), config, machines, store)
        session.adopted = adopt
        session.record.append("session", event="adopt" if adopt else "attach", session_id=session_id,
                              state=session.s.state)
        if session.s.state not in ("closed",):
            session._start_machine(attach=True)
        else:
            session.boot_done.set()
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

    def spec(self) -> MachineSpec:
        return MachineSpec(session_id=self.s.id, os=self.s.os, name=self.s.machine_name,
                           workdir=self.dir / "machine",
                           project_dir=Path(self.s.project_dir) if self.s.project_dir else None,
                           egress=self.s.egress)

    def _start_machine(self, attach: bool) -> None:
        self.boot_done.clear()
        self.boot_error = None
        threading.Thread(target=self._boot, args=(attach,), name=f"boot-{self.s.id}", daemon=True).start()

    def _boot(self, attach: bool) -> None:
        """Creates (or re-binds) the machine and waits until it answers. A close that began
        meanwhile (`ending`) stops it at its next step: what was made is destroyed, and the
        record says the session ended before the machine was ready, not that it failed."""
        started = time.monotonic()
        machine = None
        try:
            if self.ending.is_set():
                self._stopped(created=False)
                return
            machine = self.machines.attach(self.spec()) if attach else self.machines.create(self.spec())
            with self.lock:
                ending = self.ending.is_set()
                if not ending:
                    self.machine = machine
                self.s.machine_created = True
                suspended = self.s.state in WAITING
                self.save()
            if ending:  # made after the close began: the close did not see it, so it goes here
                self._destroy(machine)
                self._stopped(created=True)
                return
            if suspended:
                self.needs_ready = True
                self.record.append("machine", event="attached", suspended=True)
                return
            facts = machine.ready(self.boot_timeout)
            with self.lock:
                ending = self.ending.is_set()
                if not ending:
                    self.s.facts = facts
                    if self.s.boot_seconds is None or attach:
                        self.s.boot_seconds = round(time.monotonic() - started if attach
                                                    else time.time() - self.s.created, 1)
                    if self.s.state == "booting":
                        self.s.state = "ready"
                        self.s.resume_state = "ready"
                    self.save()
            if ending:
                self._stopped(created=True)
                return
            self.record.append("machine", event="attached" if attach else "ready",
                               seconds=self.s.boot_seconds, facts=facts)
        except Exception as exc:
            if self.ending.is_set():
                # The close destroyed the guest under the boot (its SSH wait fails: EOFError,
                # "stopped while booting"), or a create cut short: not the machine's fault.
                if machine is None and not attach:
                    self._discard()
                self._stopped(created=machine is not None, error=sentence(exc, "the boot stopped"))
                return
            self.boot_error = sentence(exc, "the machine could not be started")
            self.record.append("machine", event="gone" if attach else "failed", error=self.boot_error,
                               duration=round(time.monotonic() - started, 3))
        finally:
            self.boot_done.set()

    def _stopped(self, created: bool, error: str | None = None) -> None:
        """The record of a boot that the session's end stopped."""
        self.boot_stopped = True
        text = ENDED_BEFORE_READY + ("; vmd destroyed what it had started" if created
                                     else "; no machine had been started yet")
        self.record.append("machine", event="stopped", created=created, text=text, cause=error)
        with self.lock:
            if self.s.close is not None and created and self.destroyed and not self.s.close.get("machine_destroyed"):
                # The close answered before this boot's create returned; now it is gone too.
                self.s.close = {**self.s.close, "machine_destroyed": True,
                                "machine": "destroyed after the close: its create had not returned yet"}
                self.save()

    def _destroy(self, machine: SessionMachine) -> str | None:
        """Destroys `machine`; None when done, else why not (also in the record)."""
        try:
            machine.destroy()
        except Exception as exc:
            problem = sentence(exc, "destroy failed")
            self.record.append("machine", event="destroy_failed", error=problem)
            return problem
        with self.lock:
            self.destroyed = True
        return None

    def _discard(self) -> None:
        """What a create cut short may have left in libvirt goes too."""
        discard = getattr(self.machines, "discard", None)
        if discard is None:
            return
        try:
            if discard(self.spec()):
                with self.lock:
                    self.destroyed = True
        except Exception as exc:
            self.record.append("machine", event="destroy_failed", error=sentence(exc, "destroy failed"))

    def stop_machine(self, wait: float | None = None) -> tuple[bool, str]:
        """Ends the machine whatever the boot is doing: destroys it if it is there, makes
        a boot in progress stop and destroy what it makes, and waits (at most `wait` s) for
        that. Returns (whether a machine was destroyed, what became of it in words)."""
        with self.lock:
            self.ending.set()
            machine, self.machine = self.machine, None
            was_ready = self.boot_done.is_set() and self.boot_error is None
        if machine is not None:
            problem = self._destroy(machine)
            if problem:
                return False, f"not destroyed: {problem}"
        wait = BOOT_STOP_WAIT_S if wait is None else wait
        if not self.boot_done.wait(wait):
            if self.destroyed:
                return True, "destroyed before it was ready"
            return False, ("still being created after the close waited "
                           f"{wait:.0f} s: vmd destroys it as soon as libvirt hands it over")
        if not self.destroyed and machine is None and self.s.machine_created and self.boot_error:
            # A machine of an earlier vmd that this one could not re-bind: one more look.
            try:
                problem = self._destroy(self.machines.attach(self.spec()))
            except Exception:
                return False, "gone already"
            if problem:
                return False, f"not destroyed: {problem}"
        if not self.destroyed:
            return False, "never started" if not self.s.machine_created else "gone already"
        return True, "destroyed" if was_ready else "destroyed before it was ready"

    # --- serving a verb -------------------------------------------------------------------

    def call(self, verb: str, params: V.Params, notify: Notify | None = None) -> dict:
        if verb == "peek":  # a watcher's look, not a step of the session
            return HANDLERS["peek"](self, params, notify)
        try:
            result = self._serve(verb, params, notify)
        except VerbError as exc:
            if self._ends_on_full_disk(verb):
                raise self._end_on_full_disk() from exc
            raise
        finally:
            self._track_waiting()
        if self._ends_on_full_disk(verb):
            raise self._end_on_full_disk()
        return result

    def _ends_on_full_disk(self, verb: str) -> bool:
        return bool(self.disk_full) and verb != "session_close" and self.s.state != "closed"

    def _end_on_full_disk(self) -> VerbError:
        """The host's disk is full: nothing more of this session can be recorded or saved,
        so vmd ends it (commit what it can, push, destroy) and tells the agent why."""
        from vmd.handlers.end_verbs import close
        reason = self.disk_full or "the host's disk is full"
        closed = close(self, reason=reason)
        # The close's text starts with the reason again; the agent reads it once.
        body = closed["text"].removeprefix(f"vmd closed the session: {reason}. ")
        return VerbError(f"{reason}. vmd ended the session, as nothing more of it could be kept: "
                         f"{body} What was committed stays committed. Free space on the host, "
                         "then open a new session to carry on.")

    def _track_waiting(self) -> None:
        """When the session began to wait for a person: the reaper keeps its guest
        question_keep_s from then."""
        with self.lock:
            waiting = self.s.state in WAITING
            if waiting == (self.s.waiting_since is not None):
                return
            self.s.waiting_since = time.time() if waiting else None
            if self.s.state != "closed":
                self.save()

    def _serve(self, verb: str, params: V.Params, notify: Notify | None) -> dict:
        started = time.monotonic()
        args = params.model_dump()
        try:
            self._gate(verb)
            result = HANDLERS[verb](self, params, notify)
        except VerbError as exc:
            self._count(verb)
            self.record.verb(verb, args, error=exc.message, code=exc.code,
                             duration=time.monotonic() - started)
            raise
        except Exception as exc:
            self._count(verb)
            message = sentence(exc, f"{verb} failed")
            if disk.full(exc):  # an OSError of this host (never a guest's own full disk)
                self.note_full(disk.sentence(f"{verb} could not write on the host", exc))
                message = self.disk_full or message
            if verb in V.MACHINE_VERBS and not self.machine_alive():
                message = ("the machine is gone (destroyed or crashed), so nothing more can run in this "
                           "session. The project folder is kept on the host: call session_close to "
                           f"commit it. ({message})")
            self.record.verb(verb, args, error=message, duration=time.monotonic() - started)
            raise VerbError(message) from exc
        self._count(verb)
        if verb not in ("report",):
            self.record.verb(verb, args, result=_for_record(verb, result),
                             duration=time.monotonic() - started)
        else:
            self.record.verb(verb, args, result={"outcome": result.get("outcome")},
                             duration=time.monotonic() - started)
        return result

    def _count(self, verb: str) -> None:
        if verb not in ("session_status", "report"):
            with self.lock:
                self.s.steps += 1
                self.save()

    def _gate(self, verb: str) -> None:
        state = self.s.state
        if state == "closed" and verb not in ("session_status", "report", "session_close", "session_cancel", "note"):
            raise VerbError(f"REFUSED: session {self.s.id} is closed; read its report(), or open a new "
                            "session to do more.", REFUSED)
        if state == "cancelled" and (verb in V.MACHINE_VERBS or verb in ("finish", "ask_user", "request_unfreeze")):
            raise VerbError("REFUSED: the session was cancelled; stop and call session_close.", REFUSED)
        if state in ("question", "unfreeze") and (verb in V.MACHINE_VERBS or verb == "finish"):
            waiting = self.s.question if state == "question" else self.s.unfreeze_request
            raise VerbError(f"REFUSED: the session waits for a person ({state}: {waiting!r}); the "
                            "machine is suspended until session_resume brings the answer.", REFUSED)
        if verb in V.MACHINE_VERBS and not self.tasks.planned:
            raise VerbError(f"REFUSED: {verb} needs a plan first: call plan_tasks with the steps of "
                            "the work (the machine boots meanwhile), then use the machine.", REFUSED)

    @property
    def boot_timeout(self) -> float:
        return self.config.boot_timeout_s * self._timeout_scale()

    @property
    def verify_timeout(self) -> float:
        return self.config.verify_timeout_s * self._timeout_scale()

    def _timeout_scale(self) -> float:
        # The configured timeouts are what a KVM host needs; without KVM (TCG, as on the
        # CI machines) the same work takes several times longer.
        scale = getattr(self.machines, "timeout_scale", None)
        return float(scale()) if scale else 1.0

    def machine_alive(self) -> bool:
        """False only when the machine is known to be gone (destroyed from outside, crashed)."""
        probe = getattr(self.machine, "alive", None)
        if self.machine is None or probe is None:
            return True
        try:
            return bool(probe())
        except Exception:
            return False

    def guest(self) -> SessionMachine:
        """The machine, once it is up; waits for the boot if it is still going."""
        if not self.boot_done.wait(self.boot_timeout):
            raise VerbError(f"the machine is still booting after {self.boot_timeout:.0f} s; "
                            "call session_ready with a longer timeout.", NOT_READY)
        if self.boot_error:
            raise VerbError(self.boot_error, NOT_READY)
        if self.machine is None:
            raise VerbError("this session has no machine (it was closed).", NOT_READY)
        return self.machine

    @contextlib.contextmanager
    def frozen(self):
        """The guest paused while vmd reads the project folder, so the tree cannot change
        under the commit; resumed after, unless it was paused already (a question)."""
        machine = self.machine
        paused = False
        if machine is not None and self.boot_done.is_set() and self.s.state not in ("question", "unfreeze"):
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


class Sessions:
    """The live sessions of one vmd, by id; loads a session from disk on attach."""

    def __init__(self, config: VmdConfig, machines: MachineFactory | None = None,
                 store: ProjectStore | None = None):
        self.config = config
        self.machines = machines or LibvirtMachines(config)
        self.store = store or ProjectStore(config)
        self._live: dict[str, Session] = {}
        self._lock = threading.Lock()
        config.sessions_dir.mkdir(parents=True, exist_ok=True)

    def open(self, params: V.SessionOpen) -> Session:
        session = Session.open(params, self.config, self.machines, self.store)
        with self._lock:
            self._live[session.s.id] = session
        return session

    def attach(self, session_id: str) -> Session:
        with self._lock:
            session = self._live.get(session_id)
            if session is None:
                session = Session.load(session_id, self.config, self.machines, self.store)
                if session.s.state != "closed":  # a closed one is read from disk each time
                    self._live[session_id] = session
        return session

    def adopt(self) -> list[Session]:
        """vmd's start: every session of the state dir that is not closed is loaded (its
        machine re-bound in the background; it waits for its client again), and so is a
        closed one whose push is still being retried."""
        adopted = []
        for path in sorted(self.config.sessions_dir.glob("s-*/session.json")):
            session_id = path.parent.name
            if not _SESSION_ID.match(session_id):
                continue
            try:
                state = SessionState.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue  # unreadable: `vmd sessions` shows it; nothing vmd can carry on
            pending = state.push is not None and state.push.state == "pending"
            if state.state == "closed" and not pending:
                continue
            with self._lock:
                if session_id in self._live:
                    continue
                session = Session.load(session_id, self.config, self.machines, self.store, adopt=True)
                # Its clients were those of the vmd that died: none is bound now, and the
                # grace period of the reaper counts from this start.
                session.s.clients, session.s.detached_at = 0, time.time()
                self._live[session_id] = session
            adopted.append(session)
        return adopted

    def live(self) -> list[Session]:
        with self._lock:
            return list(self._live.values())

    def pending_pushes(self) -> list[Session]:
        return [s for s in self.live() if s.s.push is not None and s.s.push.state == "pending"]

    def release(self, session: Session) -> None:
        """Forgets a closed session, so that closed sessions do not pile up in memory;
        the connections that hold it keep it until they end. One whose push is retried, or
        whose files a full disk held back, stays until that is done."""
        with self._lock:
            if (session.s.state == "closed" and not session.held()
                    and self._live.get(session.s.id) is session):
                del self._live[session.s.id]


class _WatchedStore:
    """The project store as one session uses it: a commit that finds the host's disk full
    is noted on the session (`note_full`) whoever catches the error (a checkpoint keeps
    its task update), so that the session ends with a report saying so."""

    def __init__(self, store: ProjectStore, session: Session):
        self._store = store
        self._session = session

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def commit(self, *args, **kwargs) -> dict:
        try:
            return self._store.commit(*args, **kwargs)
        except Exception as exc:
            if disk.full(exc, by_text=True):  # git on this host says so in words
                self._session.note_full(disk.sentence("a commit into vmd's repository failed", exc))
            raise


def _for_record(verb: str, result: dict) -> dict:
    """What the record keeps of a result: no file bodies, no images, short text."""
    kept = dict(result)
    if verb == "read_file":
        kept.pop("text", None)  # the body, again; `content` is summarised by the record
    if verb == "screenshot":
        kept.pop("png_base64", None)
    if verb in ("run",):
        kept.pop("text", None)  # stdout/stderr are kept (cut) on their own
    return kept
