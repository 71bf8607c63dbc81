"""A session: one task, one machine, one project folder, one record.

`Session` opens or loads a session, boots its machine in the background, keeps its state
on disk (`<state_dir>/sessions/<id>/session.json`: everything a restarted vmd needs to
carry on) and serves a verb: the gate (machine verbs wait for a plan; a closed,
cancelled or waiting session refuses), the handler from vmd/handlers/, the count and the
record. The rules of the verbs themselves (finish refused while a task is open, the
check re-run by vmd) live in their handlers.

All machine access goes through `SessionMachine` (vmd/machine_port.py), made by a
`MachineFactory`; the default one drives libvirt, tests may hand in another.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, Field

from vmd import verbs as V
from vmd.config import VmdConfig
from vmd.errors import INVALID_PARAMS, NOT_READY, REFUSED, VerbError, sentence
from vmd.handlers import HANDLERS
from vmd.handlers.output import Notify
from vmd.machine_port import LibvirtMachines, MachineFactory, MachineSpec, SessionMachine
from vmd.project_store import ProjectStore
from vmd.record import Record, Redactor
from vmd.tasks import TaskList

_SESSION_ID = re.compile(r"^s-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")


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
        self.store = store
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
        session._start_machine(attach=False)
        if params.wait:
            session.boot_done.wait(session.boot_timeout)
        return session

    @classmethod
    def load(cls, session_id: str, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore) -> "Session":
        path = config.sessions_dir / session_id / "session.json"
        if not _SESSION_ID.match(session_id) or not path.is_file():
            raise VerbError(f"there is no session {session_id!r} in this vmd's state dir; "
                            "open a new one with session_open.", INVALID_PARAMS)
        session = cls(SessionState.model_validate_json(path.read_text()), config, machines, store)
        session.record.append("session", event="attach", session_id=session_id, state=session.s.state)
        if session.s.state not in ("closed",) and session.s.machine_created:
            session._start_machine(attach=True)
        else:
            session.boot_done.set()
        return session

    def save(self) -> None:
        with self.lock:
            self.s.tasks = self.tasks.to_list()
            tmp = self.dir / "session.json.tmp"
            tmp.write_text(self.s.model_dump_json(indent=1))
            os.replace(tmp, self.dir / "session.json")

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
        started = time.monotonic()
        try:
            machine = self.machines.attach(self.spec()) if attach else self.machines.create(self.spec())
            with self.lock:
                self.machine = machine
                self.s.machine_created = True
                closed = self.s.state == "closed"
                suspended = self.s.state in ("question", "unfreeze")
                self.save()
            if closed:
                machine.destroy()
                raise VerbError("the session was closed while its machine started.")
            if suspended:
                self.needs_ready = True
                self.record.append("machine", event="attached", suspended=True)
                return
            facts = machine.ready(self.boot_timeout)
            with self.lock:
                self.s.facts = facts
                if self.s.boot_seconds is None or attach:
                    self.s.boot_seconds = round(time.monotonic() - started if attach
                                                else time.time() - self.s.created, 1)
                if self.s.state == "booting":
                    self.s.state = "ready"
                    self.s.resume_state = "ready"
                self.save()
            self.record.append("machine", event="attached" if attach else "ready",
                               seconds=self.s.boot_seconds, facts=facts)
        except Exception as exc:
            self.boot_error = sentence(exc, "the machine could not be started")
            self.record.append("machine", event="failed", error=self.boot_error,
                               duration=round(time.monotonic() - started, 3))
        finally:
            self.boot_done.set()

    # --- serving a verb -------------------------------------------------------------------

    def call(self, verb: str, params: V.Params, notify: Notify | None = None) -> dict:
        if verb == "peek":  # a watcher's look, not a step of the session
            return HANDLERS["peek"](self, params, notify)
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

    def release(self, session: Session) -> None:
        """Forgets a closed session, so that closed sessions do not pile up in memory;
        the connections that hold it keep it until they end."""
        with self._lock:
            if session.s.state == "closed" and self._live.get(session.s.id) is session:
                del self._live[session.s.id]


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
