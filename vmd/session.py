"""A session: one task, one machine, one project folder, one record.

The rules that make the outcome vmd's and not the model's live here: machine verbs wait
for a plan, `finish` is refused while a task is open or before any command ran, and the
verification command is re-run by vmd in the guest. Everything a restarted vmd needs
to carry on (state, tasks, the question) is kept in `<state_dir>/sessions/<id>/session.json`.

All machine access goes through `SessionMachine`, made by a `MachineFactory`; the
default one drives libvirt (vmd/machine.py), tests may hand in another.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import secrets
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

from pydantic import BaseModel, Field

from vmd import verbs as V
from vmd.config import VmdConfig
from vmd.record import Record, Redactor
from vmd.report import build_report
from vmd.tasks import TaskError, TaskList

# JSON-RPC error codes beyond the standard ones (-32601 unknown verb, -32602 bad params).
FAILED = -32000  # the verb ran and failed (a guest error, a git error)
REFUSED = -32001  # a rule of the session refuses the verb now; the message says why
NO_SESSION = -32002  # the connection has no session bound
NOT_READY = -32003  # the machine is not up (still booting, or it failed)

_SESSION_ID = re.compile(r"^s-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")

Notify = Callable[[str, dict], None]


class VerbError(Exception):
    """A verb that cannot be served; `message` is a sentence the model can act on."""

    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.message = message
        self.code = code


# --- the machine adapter -----------------------------------------------------------------

@dataclass
class MachineSpec:
    session_id: str
    os: str
    name: str  # the libvirt domain name
    workdir: Path
    project_dir: Path | None
    egress: bool = False


class SessionMachine(Protocol):
    """What a session needs of a machine; the only door to the guest."""

    os_family: str
    project_path: str

    def ready(self, timeout: float, desktop: bool = False) -> dict: ...
    def run(self, command: str, timeout: float, cwd: str | None,
            on_output: Callable[[str, str], None] | None) -> dict: ...
    def read_file(self, path: str, offset: int, limit: int | None) -> dict: ...
    def write_file(self, path: str, content: str) -> int: ...
    def append_file(self, path: str, content: str) -> int: ...
    def edit_file(self, path: str, old: str, new: str) -> None: ...
    def list_dir(self, path: str) -> list[dict]: ...
    def screenshot(self) -> dict: ...  # png (bytes), width, height, scale
    def click(self, x: int, y: int, button: str, double: bool) -> None: ...
    def move(self, x: int, y: int) -> None: ...
    def scroll(self, x: int, y: int, amount: int) -> None: ...
    def type(self, text: str) -> None: ...
    def key(self, keys: str) -> None: ...
    def launch_app(self, path: str, args: list[str]) -> str: ...
    def check_internet(self) -> tuple[bool, str]: ...
    def reboot(self, timeout: float) -> float: ...
    def suspend(self) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


class MachineFactory(Protocol):
    def create(self, spec: MachineSpec) -> SessionMachine: ...
    def attach(self, spec: MachineSpec) -> SessionMachine: ...


class LibvirtMachine:
    """SessionMachine over vmd.machine.Machine (libvirt + SSH + QMP)."""

    def __init__(self, machine, image):
        self.machine = machine
        self.image = image
        self.os_family = image.os_family
        self.project_path = image.project_path

    # How long the desktop may take after SSH answers, on a KVM host (x4 under TCG); it
    # took 5-8 s under TCG here.
    DESKTOP_WAIT_S = 30.0

    def ready(self, timeout, desktop=False):
        """SSH, and the desktop when the image has one: the machine is handed over with a
        usable screen, so the agent's first screenshot shows it. A desktop that does not
        come up leaves a shell-only machine (facts say desktop false), not a failed boot."""
        from vmd.machine import DesktopMissing, timeout_scale

        try:
            facts = self.machine.ready(timeout, desktop=True,
                                       desktop_timeout=self.DESKTOP_WAIT_S * timeout_scale(self.machine.accel))
        except DesktopMissing as exc:
            facts = self.machine.read_facts()
            facts.desktop = False
            facts.seconds = round(time.monotonic() - self.machine.started, 1)
            return {**facts.model_dump(), "desktop_problem": str(exc)}
        return facts.model_dump()

    def run(self, command, timeout, cwd, on_output):
        return self.machine.guest.run(command, timeout=timeout, cwd=cwd, on_output=on_output).model_dump()

    def read_file(self, path, offset, limit):
        return self.machine.guest.read_file(path, offset, limit).model_dump()

    def run_baseline(self, command, archive, timeout):
        """The check with the project path showing the baseline (vmd/verification.py)."""
        from vmd.verification import linux_baseline_command
        if self.os_family != "linux":
            raise NotImplementedError(f"a baseline run on {self.os_family} guests")
        path = f"/tmp/vmd-baseline-{secrets.token_hex(4)}.tar"
        self.machine.guest.write_file(path, archive)
        line = linux_baseline_command(command, self.project_path, self.image.user, path)
        return self.machine.guest.run(line, timeout=timeout).model_dump()

    def write_file(self, path, content):
        return self.machine.guest.write_file(path, content)

    def append_file(self, path, content):
        return self.machine.guest.append_file(path, content)

    def edit_file(self, path, old, new):
        self.machine.guest.edit_file(path, old, new)

    def list_dir(self, path):
        return [e.model_dump() for e in self.machine.guest.list_dir(path)]

    def screenshot(self):
        shot = self.machine.screen.screenshot()
        return {"png": shot.png, "width": shot.width, "height": shot.height, "scale": shot.scale}

    def click(self, x, y, button, double):
        self.machine.screen.click(x, y, button=button, double=double)

    def move(self, x, y):
        self.machine.screen.move(x, y)

    def scroll(self, x, y, amount):
        self.machine.screen.scroll(x, y, amount)

    def type(self, text):
        self.machine.screen.type(text)

    def key(self, keys):
        self.machine.screen.key(keys)

    def launch_app(self, path, args):
        if self.os_family == "windows":
            # Programs started over SSH land in session 0 and are invisible: start them in
            # the logged-on user's session through a scheduled task run interactively.
            line = subprocess.list2cmdline([path, *args])
            command = (f"schtasks /Create /F /TN vmagent-launch /SC ONCE /ST 00:00 /IT /TR '{line}'; "
                       "schtasks /Run /TN vmagent-launch")
        else:
            command = ("DISPLAY=:0 setsid -f " + " ".join(shlex.quote(a) for a in [path, *args])
                       + " >/tmp/vmagent-launch.log 2>&1 </dev/null")
        result = self.machine.guest.run(command, timeout=30)
        if result.exit_code != 0:
            raise VerbError(f"could not start {path}: exit {result.exit_code}: "
                            f"{(result.stderr or result.stdout).strip()[-400:]}")
        return f"started {path}; take a screenshot to see its window."

    # Where check_internet tries to connect: any public host answering on port 80 will do
    # (VMD_INTERNET_PROBE overrides it, e.g. for a host behind a proxy).
    INTERNET_PROBE = os.environ.get("VMD_INTERNET_PROBE", "example.com")

    def check_internet(self):
        host = self.INTERNET_PROBE
        if self.os_family == "windows":
            command = ("try { (Invoke-WebRequest -UseBasicParsing -TimeoutSec 8 "
                       f"http://{host}/ -Method Head).StatusCode }} catch {{ exit 1 }}")
        else:
            command = f"timeout 8 bash -c 'exec 3<>/dev/tcp/{host}/80' && echo reachable"
        result = self.machine.guest.run(command, timeout=20)
        return result.exit_code == 0, (result.stdout + result.stderr).strip()[-300:]

    def reboot(self, timeout):
        return self.machine.reboot(timeout)

    def suspend(self):
        self.machine.suspend()

    def resume(self):
        self.machine.resume()

    def destroy(self):
        self.machine.destroy()

    def alive(self) -> bool:
        return self.machine.state() in ("running", "paused")

    def set_egress(self, open_: bool) -> None:
        self.machine.set_egress(open_)


class LibvirtMachines:
    """The default MachineFactory: an image from the images dir, a domain in libvirt."""

    def __init__(self, config: VmdConfig):
        self.config = config

    def timeout_scale(self) -> float:
        from vmd.machine import timeout_scale
        return timeout_scale()

    def _image(self, spec: MachineSpec):
        from vmd.images import find_image  # lazily: tests without libvirt never import it
        return find_image(spec.os, self.config.images_dir)

    def create(self, spec: MachineSpec) -> SessionMachine:
        image = self._image(spec)
        from vmd.machine import Machine
        machine = Machine.create(image, name=spec.name, workdir=spec.workdir, project_dir=spec.project_dir,
                                 uri=self.config.libvirt_uri, egress=spec.egress,
                                 qemu_user=self.config.share_user)
        return LibvirtMachine(machine, image)

    def attach(self, spec: MachineSpec) -> SessionMachine:
        image = self._image(spec)
        from vmd.machine import Machine
        machine = Machine.attach(image, name=spec.name, workdir=spec.workdir, project_dir=spec.project_dir,
                                 uri=self.config.libvirt_uri)
        return LibvirtMachine(machine, image)


# --- the project store (host-side git, vmd/publish.py) ------------------------------------

class ProjectStore:
    """Restores, commits and pushes a session's project through vmd/publish.py: the
    history lives in vmd's own repository, built from the folder's bytes."""

    def __init__(self, config: VmdConfig):
        self.config = config

    def remote(self, owner: str, project: str, description: str = ""):
        from vmd.publish import Remote
        token = self.config.gitea_token.get_secret_value()
        return Remote(owner=owner, project=project, description=description[:250],
                      gitea_url=self.config.gitea_url or None,
                      gitea_token=self.config.gitea_token if token else None,
                      state_dir=self.config.state_dir)

    def prepare(self, project_dir: Path, owner: str, project: str, description: str) -> dict:
        """-> {text, base_commit, branch}"""
        from vmd.project_tree import share_owner
        from vmd.publish import prepare_project
        prepared = prepare_project(project_dir, self.remote(owner, project, description),
                                   share_owner=share_owner(self.config.share_user))
        return prepared.model_dump()

    def commit(self, project_dir: Path, owner: str, project: str, message: str,
               allow_empty: bool = False) -> dict:
        """-> {sha, new, left_out}"""
        from vmd.project_tree import Limits
        from vmd.publish import commit_project
        limits = Limits(max_file_bytes=int(self.config.commit_max_file_mib * 1024 * 1024),
                        max_total_bytes=int(self.config.commit_max_total_mib * 1024 * 1024))
        return commit_project(project_dir, self.remote(owner, project), message, limits,
                              allow_empty=allow_empty).model_dump()

    def changed_files(self, owner: str, project: str, base: str | None) -> list[str]:
        from vmd.publish import changed_files
        return changed_files(self.remote(owner, project), base)

    def push(self, owner: str, project: str, description: str, branch: str,
             outcome: dict | None) -> dict:
        from vmd.publish import push_project
        if outcome is None:
            status, text = "pending", "vmd did not verify this commit: the session did not finish"
        elif outcome.get("passed") and outcome.get("proven"):
            status, text = "success", (f"vmd verified and proven: `{outcome['command']}` exited "
                                       f"{outcome['exit_code']} and fails without this work")
        elif outcome.get("passed"):
            status, text = "warning", (f"vmd: passed, not proven: `{outcome['command']}` exited "
                                       f"{outcome['exit_code']} but also passes without this work")
        else:
            status, text = "failure", (f"vmd verification failed: `{outcome['command']}` exited "
                                       f"{outcome['exit_code']} (expected {outcome['expect_exit']})")
        result = push_project(self.remote(owner, project, description), branch=branch or "main",
                              status=status, status_description=text[:140]).model_dump()
        web = self.config.gitea_web_url.rstrip("/")
        if web and result.get("web_url") and self.config.gitea_url:
            result["web_url"] = result["web_url"].replace(self.config.gitea_url.rstrip("/"), web, 1)
        return result


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


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def _minutes(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60} m {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class Session:
    def __init__(self, state: SessionState, config: VmdConfig, machines: MachineFactory,
                 store: ProjectStore):
        self.s = state
        self.config = config
        self.machines = machines
        self.store = store
        self.dir = config.sessions_dir / state.id
        self.record = Record(self.dir, Redactor([config.gitea_token.get_secret_value()]))
        self.tasks = TaskList.from_list(state.tasks)
        self._lock = threading.RLock()
        self.machine: SessionMachine | None = None
        self._boot_done = threading.Event()
        self._boot_error: str | None = None
        self._desktop_ready = False
        self._needs_ready = False  # attached while suspended: ready() once resumed

    # --- opening, loading, saving -----------------------------------------------------------

    @classmethod
    def open(cls, params: V.SessionOpen, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore) -> "Session":
        for what, value in (("project", params.project), ("owner", params.owner)):
            problem = value and V.name_problem(what, value)
            if problem:
                raise VerbError(problem, -32602)
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
                raise VerbError(f"the project folder could not be prepared: {_sentence(exc, 'error')}. "
                                "Nothing was started; fix the cause and open the session again.")
        else:
            state.storage = "no project folder: nothing from this session is kept after it closes"
        session.record.append("session", event="open", session_id=sid, args=params.model_dump(),
                              project_dir=state.project_dir, storage=state.storage,
                              duration=round(time.monotonic() - started, 3))
        session.save()
        session._start_machine(attach=False)
        if params.wait:
            session._boot_done.wait(session.boot_timeout)
        return session

    @classmethod
    def load(cls, session_id: str, config: VmdConfig, machines: MachineFactory,
             store: ProjectStore) -> "Session":
        path = config.sessions_dir / session_id / "session.json"
        if not _SESSION_ID.match(session_id) or not path.is_file():
            raise VerbError(f"there is no session {session_id!r} in this vmd's state dir; "
                            "open a new one with session_open.", -32602)
        session = cls(SessionState.model_validate_json(path.read_text()), config, machines, store)
        session.record.append("session", event="attach", session_id=session_id, state=session.s.state)
        if session.s.state not in ("closed",) and session.s.machine_created:
            session._start_machine(attach=True)
        else:
            session._boot_done.set()
        return session

    def save(self) -> None:
        with self._lock:
            self.s.tasks = self.tasks.to_list()
            tmp = self.dir / "session.json.tmp"
            tmp.write_text(self.s.model_dump_json(indent=1))
            os.replace(tmp, self.dir / "session.json")

    def _spec(self) -> MachineSpec:
        return MachineSpec(session_id=self.s.id, os=self.s.os, name=self.s.machine_name,
                           workdir=self.dir / "machine",
                           project_dir=Path(self.s.project_dir) if self.s.project_dir else None,
                           egress=self.s.egress)

    def _start_machine(self, attach: bool) -> None:
        self._boot_done.clear()
        self._boot_error = None
        threading.Thread(target=self._boot, args=(attach,), name=f"boot-{self.s.id}", daemon=True).start()

    def _boot(self, attach: bool) -> None:
        started = time.monotonic()
        try:
            machine = self.machines.attach(self._spec()) if attach else self.machines.create(self._spec())
            with self._lock:
                self.machine = machine
                self.s.machine_created = True
                closed = self.s.state == "closed"
                suspended = self.s.state in ("question", "unfreeze")
                self.save()
            if closed:
                machine.destroy()
                raise VerbError("the session was closed while its machine started.")
            if suspended:
                self._needs_ready = True
                self.record.append("machine", event="attached", suspended=True)
                return
            facts = machine.ready(self.boot_timeout)
            with self._lock:
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
            self._boot_error = _sentence(exc, "the machine could not be started")
            self.record.append("machine", event="failed", error=self._boot_error,
                               duration=round(time.monotonic() - started, 3))
        finally:
            self._boot_done.set()

    # --- serving a verb -------------------------------------------------------------------

    def call(self, verb: str, params: V.Params, notify: Notify | None = None) -> dict:
        if verb == "peek":  # a watcher's look, not a step of the session
            return self._v_peek(params, notify)
        started = time.monotonic()
        args = params.model_dump()
        try:
            self._gate(verb)
            result = getattr(self, f"_v_{verb}")(params, notify)
        except VerbError as exc:
            self._count(verb)
            self.record.verb(verb, args, error=exc.message, code=exc.code,
                             duration=time.monotonic() - started)
            raise
        except Exception as exc:
            self._count(verb)
            message = _sentence(exc, f"{verb} failed")
            if verb in V.MACHINE_VERBS and not self._machine_alive():
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
            with self._lock:
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

    def _machine_alive(self) -> bool:
        """False only when the machine is known to be gone (destroyed from outside, crashed)."""
        probe = getattr(self.machine, "alive", None)
        if self.machine is None or probe is None:
            return True
        try:
            return bool(probe())
        except Exception:
            return False

    def _guest(self) -> SessionMachine:
        """The machine, once it is up; waits for the boot if it is still going."""
        if not self._boot_done.wait(self.boot_timeout):
            raise VerbError(f"the machine is still booting after {self.boot_timeout:.0f} s; "
                            "call session_ready with a longer timeout.", NOT_READY)
        if self._boot_error:
            raise VerbError(self._boot_error, NOT_READY)
        if self.machine is None:
            raise VerbError("this session has no machine (it was closed).", NOT_READY)
        return self.machine

    def _project_note(self) -> str:
        return "" if self.s.project_dir else " (this session has no project folder)"

    # --- session verbs --------------------------------------------------------------------

    def _v_session_ready(self, p: V.SessionReady, notify) -> dict:
        started = time.monotonic()
        if not self._boot_done.wait(p.timeout):
            raise VerbError(f"the machine is still booting ({time.time() - self.s.created:.0f} s since the "
                            "session opened); call session_ready again — planning verbs work meanwhile.",
                            NOT_READY)
        machine = self._guest()
        if self._needs_ready:
            raise VerbError("the machine is suspended while the session waits for a person; "
                            "session_resume wakes it.", REFUSED)
        facts = self.s.facts
        if p.desktop and not self._desktop_ready:
            left = max(1.0, p.timeout - (time.monotonic() - started))
            facts = machine.ready(left, desktop=True)
            self._desktop_ready = True
            with self._lock:
                self.s.facts = facts
                self.save()
        seconds = self.s.boot_seconds or 0.0
        return {"ready": True, "seconds": seconds, "facts": facts,
                "text": f"The machine is ready ({seconds:.0f} s to boot): {facts.get('os', self.s.os)}; "
                        f"project folder at {facts.get('project_path', '-')}{self._project_note()}."}

    def _v_session_status(self, p, notify) -> dict:
        return self.status()

    def status(self) -> dict:
        s = self.s
        if self._boot_error:
            machine = f"failed: {self._boot_error}"
        elif s.state == "closed":
            machine = "destroyed"
        elif s.state in ("question", "unfreeze"):
            machine = "suspended"
        elif self._boot_done.is_set() and self.machine is not None:
            machine = "ready" if self._machine_alive() else "destroyed"
        else:
            machine = "booting"
        parts = [s.state, f"machine {machine.split(':')[0]}"]
        parts.append(self.tasks.summary_line() if self.tasks.planned else "no plan yet")
        parts += [f"{s.steps} steps", f"{s.runs} runs", _minutes(time.time() - s.created)]
        if s.outcome:
            parts.append(f"verification exit {s.outcome['exit_code']}"
                         f" ({'passed' if s.outcome['passed'] else 'failed'})")
        return {"session_id": s.id, "state": s.state, "planned": self.tasks.planned,
                "tasks": self.tasks.render(), "status_line": " · ".join(parts),
                "question": s.question if s.state == "question" else "",
                "unfreeze_request": s.unfreeze_request if s.state == "unfreeze" else "",
                "cancelled": s.cancelled, "steps": s.steps, "machine": machine,
                "outcome": s.outcome, "text": " · ".join(parts)}

    def _v_session_cancel(self, p, notify) -> dict:
        with self._lock:
            if self.s.state != "closed":
                self.s.state = "cancelled"
            self.s.cancelled = True
            self.save()
        return {"cancelled": True, "text": "The session is cancelled: stop working; session_close commits "
                                           "the project folder and ends it."}

    def _v_session_resume(self, p: V.Answer, notify) -> dict:
        with self._lock:
            state = self.s.state
            if state not in ("question", "unfreeze"):
                raise VerbError(f"REFUSED: the session is {state}, not waiting for an answer; "
                                "nothing to resume.", REFUSED)
        # After a vmd restart the machine is re-attached by a thread that session_attach
        # started; resuming before it is done would skip waking the paused guest.
        self._boot_done.wait(self.boot_timeout)
        machine = self.machine
        if machine is not None:
            machine.resume()
            if self._needs_ready:
                self.s.facts = machine.ready(self.boot_timeout)
                self._needs_ready = False
        with self._lock:
            if state == "question":
                self.s.answer = p.answer
                text = f"The user answered your question ({self.s.question!r}): {p.answer}"
                self.s.question = ""
            else:
                approved = bool(p.approved)
                text = (f"The user {'approved' if approved else 'declined'} your request "
                        f"({self.s.unfreeze_request!r})." + (f" They said: {p.answer}" if p.answer else ""))
                if approved:
                    self.s.egress = True
                    opener = getattr(machine, "set_egress", None)
                    if opener is not None:
                        opener(True)
                        text += " Network egress is open now."
                    else:
                        text += (" This vmd cannot open egress on a running machine; the approval is "
                                 "noted in the record.")
                self.s.unfreeze_request = ""
            self.s.state = self.s.resume_state if self.s.resume_state in ("booting", "ready", "finished") else "ready"
            self.save()
        self.record.append("answer", state=state, answer=p.answer, approved=p.approved)
        return {"state": self.s.state, "text": text}

    def _v_peek(self, p, notify) -> dict:
        machine = self.machine
        if (self.s.state not in ("ready", "finished") or machine is None or not self._boot_done.is_set()
                or self._boot_error):
            return {"available": False, "text": f"no screen to show while the session is {self.s.state}."}
        shot = machine.screenshot()
        return {"available": True, "png_base64": base64.b64encode(shot["png"]).decode(),
                "width": shot["width"], "height": shot["height"], "text": "the screen now."}

    def _v_note(self, p: V.Note, notify) -> dict:
        self.record.append("note", turn=p.turn, text=p.text)
        return {"ok": True, "text": "noted."}

    def _v_report(self, p, notify) -> dict:
        report = build_report(self.record.path)
        return {"markdown": report.markdown, "outcome": report.outcome}

    # --- tasks ---------------------------------------------------------------------------

    def _task_change(self, change: str, **fields) -> None:
        self.record.append("task", change=change, **fields, tasks=self.tasks.to_list())
        self.save()

    def _v_plan_tasks(self, p: V.PlanTasks, notify) -> dict:
        with self._lock:
            had_plan = self.tasks.planned
            added = self.tasks.plan(p.tasks)
            self._task_change("plan", added=[t.title for t in added])
        if had_plan:
            text = (f"A plan existed; added {len(added)} new task(s), kept the ids already given:\n"
                    if added else "A plan exists and holds these tasks already; nothing added:\n")
        else:
            text = "Planned. The machine is booting; work through the tasks and mark each one:\n"
        rendered = self.tasks.render()
        return {"tasks": rendered, "text": text + rendered}

    def _v_add_task(self, p: V.AddTask, notify) -> dict:
        with self._lock:
            try:
                task = self.tasks.add(p.title)
            except TaskError as exc:
                raise VerbError(str(exc), -32602)
            self._task_change("add", id=task.id, title=task.title)
        rendered = self.tasks.render()
        return {"id": task.id, "tasks": rendered, "text": f"Added task {task.id}.\n{rendered}"}

    def _v_update_task(self, p: V.UpdateTask, notify) -> dict:
        with self._lock:
            try:
                was = self.tasks.get(p.id).status
                task = self.tasks.update(p.id, p.status, p.note)
            except TaskError as exc:
                raise VerbError(str(exc), -32602)
            self._task_change("update", id=task.id, status=task.status, note=task.note)
        rendered = self.tasks.render()
        text = f"Task {task.id} is {task.status.replace('_', ' ')}."
        if task.status == "done" and was != "done":
            text += self._checkpoint(task)
        return {"tasks": rendered, "text": f"{text}\n{rendered}"}

    def _checkpoint(self, task) -> str:
        """A commit in vmd's repository per closed task, so the history shows the work task
        by task. A failure costs a note, never the task update."""
        if not self.s.project_dir or self.machine is None or not self._boot_done.is_set():
            return ""
        try:
            with self._frozen():
                committed = self.store.commit(Path(self.s.project_dir), self.s.owner, self.s.project or "",
                                              f"Task {task.id} done: {task.title}"[:200], allow_empty=True)
        except Exception as exc:
            self.record.append("checkpoint", task=task.id, title=task.title,
                               error=_sentence(exc, "the checkpoint commit failed"))
            return " (The checkpoint commit failed; the work stays in the folder.)"
        self.record.append("checkpoint", task=task.id, title=task.title, commit=committed["sha"])
        return f" Checkpoint {committed['sha'][:10]} committed." if committed["sha"] else ""

    # --- shell and files -----------------------------------------------------------------

    def _v_run(self, p: V.Run, notify) -> dict:
        machine = self._guest()
        result = machine.run(p.command, p.timeout, p.cwd, _output_sink(notify))
        with self._lock:
            self.s.runs += 1
            self.save()
        return {**{k: result[k] for k in ("exit_code", "stdout", "stderr", "duration", "truncated", "timed_out")},
                "text": _run_text(result)}

    def _v_read_file(self, p: V.ReadFile, notify) -> dict:
        chunk = self._guest().read_file(p.path, p.offset, p.limit)
        text = chunk["content"]
        if chunk.get("truncated"):
            end = chunk["offset"] + len(chunk["content"].encode())
            text += f"\n[vmd: showing bytes {chunk['offset']}–{end} of {chunk['size']}; read on with offset={end}]"
        return {**chunk, "text": text}

    def _v_write_file(self, p: V.WriteFile, notify) -> dict:
        n = self._guest().write_file(p.path, p.content)
        return {"path": p.path, "bytes": n, "text": f"wrote {n} bytes to {p.path}."}

    def _v_append_file(self, p: V.WriteFile, notify) -> dict:
        n = self._guest().append_file(p.path, p.content)
        return {"path": p.path, "bytes": n, "text": f"appended {n} bytes to {p.path}."}

    def _v_edit_file(self, p: V.EditFile, notify) -> dict:
        self._guest().edit_file(p.path, p.old, p.new)
        return {"path": p.path, "text": f"edited {p.path}: replaced the one match."}

    def _v_list_dir(self, p: V.ListDir, notify) -> dict:
        entries = self._guest().list_dir(p.path)
        lines = [f"{e['name']}{'/' if e['type'] == 'dir' else ''}  {e.get('size', '')}" for e in entries]
        return {"entries": entries, "text": "\n".join(lines) or f"{p.path} is empty."}

    def _v_git_commit(self, p: V.GitCommit, notify) -> dict:
        if not self.s.project_dir:
            raise VerbError("this session has no project folder to commit; open the session with a project.",
                            REFUSED)
        with self._frozen():
            committed = self.store.commit(Path(self.s.project_dir), self.s.owner, self.s.project or "",
                                          p.message)
        sha = committed["sha"]
        if sha is None:
            text = "nothing to commit: the project folder is empty."
        elif committed["new"]:
            text = f"committed {sha[:10]}."
        else:
            text = f"nothing changed since {sha[:10]}; no new commit."
        if committed["left_out"]:
            text += " Left out of the commit:\n" + "\n".join(f"- {w}" for w in committed["left_out"][:20])
        return {"commit": sha, "left_out": committed["left_out"], "text": text}

    @contextlib.contextmanager
    def _frozen(self):
        """The guest paused while vmd reads the project folder, so the tree cannot change
        under the commit; resumed after, unless it was paused already (a question)."""
        machine = self.machine
        paused = False
        if machine is not None and self._boot_done.is_set() and self.s.state not in ("question", "unfreeze"):
            try:
                machine.suspend()
                paused = True
            except Exception as exc:
                self.record.append("machine", event="pause_failed", error=_sentence(exc, "pause failed"))
        try:
            yield
        finally:
            if paused:
                try:
                    machine.resume()
                except Exception as exc:
                    self.record.append("machine", event="resume_failed", error=_sentence(exc, "resume failed"))

    # --- screen ----------------------------------------------------------------------------

    def _v_screenshot(self, p, notify) -> dict:
        shot = self._guest().screenshot()
        path = self.record.save_screenshot(shot["png"])
        return {"width": shot["width"], "height": shot["height"], "scale": shot["scale"], "path": path,
                "png_base64": base64.b64encode(shot["png"]).decode(),
                "text": f"screenshot {shot['width']}x{shot['height']} (coordinates are in these pixels)."}

    def _v_click(self, p: V.Click, notify) -> dict:
        self._guest().click(p.x, p.y, p.button, p.double)
        return {"ok": True, "text": f"{'double-' if p.double else ''}clicked {p.button} at ({p.x}, {p.y})."}

    def _v_move(self, p: V.Move, notify) -> dict:
        self._guest().move(p.x, p.y)
        return {"ok": True, "text": f"moved the pointer to ({p.x}, {p.y})."}

    def _v_type(self, p: V.TypeText, notify) -> dict:
        self._guest().type(p.text)
        return {"ok": True, "text": f"typed {len(p.text)} characters."}

    def _v_key(self, p: V.Key, notify) -> dict:
        self._guest().key(p.keys)
        return {"ok": True, "text": f"pressed {p.keys}."}

    def _v_scroll(self, p: V.Scroll, notify) -> dict:
        self._guest().scroll(p.x, p.y, p.amount)
        return {"ok": True, "text": f"scrolled {p.amount} at ({p.x}, {p.y})."}

    def _v_launch_app(self, p: V.LaunchApp, notify) -> dict:
        return {"ok": True, "text": self._guest().launch_app(p.path, p.args)}

    def _v_wait(self, p: V.Wait, notify) -> dict:
        time.sleep(p.seconds)
        return {"seconds": p.seconds, "text": f"waited {p.seconds:g} s."}

    def _v_check_internet(self, p, notify) -> dict:
        online, detail = self._guest().check_internet()
        text = ("the guest reaches the internet." if online else
                "the guest has no internet (egress is closed by default); ask with request_unfreeze "
                "if the work needs it.")
        return {"online": online, "detail": detail, "text": text}

    def _v_reboot_vm(self, p, notify) -> dict:
        seconds = self._guest().reboot(self.boot_timeout)
        self._desktop_ready = False
        return {"seconds": seconds, "text": f"the machine rebooted and answers again after {seconds:.0f} s."}

    # --- people ---------------------------------------------------------------------------

    def _wait_for_person(self, state: str, field: str, value: str) -> None:
        with self._lock:
            if self.s.state not in ("question", "unfreeze"):
                self.s.resume_state = self.s.state
            self.s.state = state
            setattr(self.s, field, value)
            self.save()
        if self.machine is not None and self._boot_done.is_set() and not self._boot_error:
            try:
                self.machine.suspend()
            except Exception as exc:  # the question stands even if the guest would not pause
                self.record.append("machine", event="suspend_failed", error=_sentence(exc, "suspend failed"))

    def _v_ask_user(self, p: V.AskUser, notify) -> dict:
        self._wait_for_person("question", "question", p.question)
        return {"state": "question", "text": "Your question is with the user. Stop here: the session "
                                             "resumes with their answer."}

    def _v_request_unfreeze(self, p: V.RequestUnfreeze, notify) -> dict:
        self._wait_for_person("unfreeze", "unfreeze_request", p.reason)
        return {"state": "unfreeze", "text": "Your request is with the user. Stop here: the session "
                                             "resumes when they decide."}

    # --- the end ---------------------------------------------------------------------------

    def _v_finish(self, p: V.Finish, notify) -> dict:
        open_tasks = self.tasks.open_tasks()
        if open_tasks:
            names = "; ".join(f"{t.id}. {t.title} ({t.status.replace('_', ' ')})" for t in open_tasks)
            return {"accepted": False, "outcome": self.s.outcome,
                    "text": f"REFUSED: tasks still open: {names}. Finish them and mark each done, or "
                            "blocked with a note saying why, then call finish again."}
        if self.s.runs == 0:
            return {"accepted": False, "outcome": self.s.outcome,
                    "text": "REFUSED: no command was ever run in this session. Run the work and its "
                            "check with `run` first; vmd does not take a finish on the model's word."}
        if p.verification is None:
            return {"accepted": False, "outcome": self.s.outcome,
                    "text": "REFUSED: name the verification: finish(summary, verification={\"command\": "
                            "\"<a command that proves the work>\", \"expect_exit\": 0}); vmd runs it itself."}
        return self._verify_and_finish(p, notify)

    def _verify_and_finish(self, p: V.Finish, notify) -> dict:
        """vmd runs the check itself. A failure is work left (refused) until the allowed
        failures are spent; a pass is checked against the baseline (vmd/verification.py)."""
        from vmd import verification as check

        machine = self._guest()
        command, expect = p.verification.command, p.verification.expect_exit
        cwd = self.s.facts.get("project_path") or machine.project_path if self.s.project_dir else None
        tail = self.config.output_tail_chars
        run = check.run_check(machine, command, expect, cwd, self.verify_timeout, _output_sink(notify), tail)
        baseline = None
        if run.passed:
            archive = check.baseline_archive(self._repository(), self.s.base_commit) if self.s.project_dir else b""
            baseline = check.run_baseline(machine, command, expect, archive, self.verify_timeout, tail)
        attempt = {"attempt": len(self.s.verifications) + 1, "command": command, "expect_exit": expect,
                   **run.model_dump(), "baseline": baseline.model_dump() if baseline else None}
        with self._lock:
            self.s.verifications.append({k: v for k, v in attempt.items() if k != "output_tail"})
            self.save()
        self.record.append("verification", **attempt)
        failures = sum(1 for v in self.s.verifications if not v["passed"])
        allowed = self.config.max_failed_verifications
        if not run.passed and failures < allowed:
            return {"accepted": False, "outcome": None, "attempt": attempt,
                    "text": check.failed_text(run, command, expect, failures, allowed)}
        proven = None
        if baseline is not None and baseline.error is None:
            proven = not baseline.passed
            if not proven and not self.s.baseline_refused:
                with self._lock:
                    self.s.baseline_refused = True
                    self.save()
                return {"accepted": False, "outcome": None, "attempt": attempt,
                        "text": check.not_proven_text(command, baseline)}
        outcome = {"command": command, "cwd": cwd, "expect_exit": expect, "exit_code": run.exit_code,
                   "passed": run.passed, "proven": proven if run.passed else None,
                   "timed_out": run.timed_out, "duration": run.duration, "output_tail": run.output_tail,
                   "baseline": baseline.model_dump() if baseline else None,
                   "attempts": len(self.s.verifications)}
        with self._lock:
            self.s.outcome = outcome
            self.s.summary = p.summary
            if self.s.state in ("ready", "booting", "finished"):
                self.s.state = "finished"
            self.save()
        self.record.append("outcome", **outcome, summary=p.summary)
        if not run.passed:
            verdict = (f"NOT verified after {failures} failed verifications — the outcome of this session "
                       "is a failure")
        elif proven:
            verdict = "verified, and proven: the check fails on the project as it was before this session"
        elif proven is False:
            verdict = ("passed, NOT proven: the check also passes on the project as it was before this "
                       "session")
        else:
            verdict = f"passed; whether the check needs the work could not be checked ({baseline.error})"
        text = (f"Finished. vmd ran `{command}` itself: exit {run.exit_code} (expected {expect}"
                f"{', timed out' if run.timed_out else ''}): {verdict}.\nOutput tail:\n{run.output_tail[-1500:]}")
        return {"accepted": True, "outcome": outcome, "text": text}

    def _repository(self):
        return self.store.remote(self.s.owner, self.s.project or "").repository()

    def _v_session_close(self, p, notify) -> dict:
        return self.close()

    def close(self) -> dict:
        with self._lock:
            if self.s.close is not None:
                return {**self.s.close, "text": "already closed. " + self.s.close["text"]}
        started = time.monotonic()
        commit = web_url = None
        push: dict = {}
        files: list[str] = []
        error = None
        left_out: list[str] = []
        if self.s.project_dir:
            project_dir = Path(self.s.project_dir)
            owner, project = self.s.owner, self.s.project or ""
            try:
                with self._frozen():
                    committed = self.store.commit(project_dir, owner, project, self._commit_message(),
                                                  allow_empty=True)
                commit, left_out = committed["sha"], committed["left_out"]
                files = self.store.changed_files(owner, project, self.s.base_commit)
                push = self.store.push(owner, project, self.s.task, self.s.branch, self.s.outcome)
                web_url = push.get("web_url")
                error = push.get("error")
            except Exception as exc:
                error = _sentence(exc, "committing the project folder failed")
        destroyed = self._destroy_machine()
        if not self.s.project_dir:
            text = "Closed. This session had no project folder: nothing was committed."
        elif commit is None and not error:
            text = "Closed. The project folder was empty: nothing to commit."
        elif push.get("pushed"):
            where = web_url or push.get("remote_display")
            text = f"Closed. Committed {commit[:10]} and pushed it to {where}."
        else:
            text = f"Closed. Committed {commit[:10] if commit else 'nothing'}; NOT pushed: {error}"
        if left_out:
            text += (f" Left out of the commit ({len(left_out)}): "
                     + " ".join(left_out[:10]) + (" …" if len(left_out) > 10 else ""))
        close = {"closed": True, "commit": commit, "web_url": web_url, "branch": push.get("branch"),
                 "remote": push.get("remote_display"), "pushed": bool(push.get("pushed")),
                 "push_error": error, "warnings": push.get("warnings") or [], "files": files,
                 "machine_destroyed": destroyed, "left_out": left_out, "text": text}
        with self._lock:
            self.s.close = close
            self.s.state = "closed"
            self.save()
        self.record.append("close", **close, duration=round(time.monotonic() - started, 3))
        return close

    def _commit_message(self) -> str:
        title = (self.s.task.strip().splitlines() or ["vmagent session"])[0][:72]
        body = [f"vmagent session {self.s.id}", "", "Tasks:", self.tasks.render()]
        if self.s.outcome:
            o = self.s.outcome
            verdict = ("verified and proven (it fails on the project as it was before)" if o.get("proven")
                       else "passed, not proven (it also passes on the project as it was before)"
                       if o.get("passed") else "FAILED")
            body += ["", f"Verification by vmd: `{o['command']}` exited {o['exit_code']} (expected "
                         f"{o['expect_exit']}): {verdict}; {o.get('attempts', 1)} attempt(s)."]
        else:
            body += ["", "Not verified by vmd: the session did not finish."]
        return title + "\n\n" + "\n".join(body)

    def _destroy_machine(self) -> bool:
        machine = self.machine
        if machine is None and self.s.machine_created and self._boot_error is None and not self._boot_done.is_set():
            self._boot_done.wait(30)  # a machine being defined right now; its thread destroys it
            machine = self.machine
        if machine is None and self.s.machine_created:
            try:
                machine = self.machines.attach(self._spec())
            except Exception:
                return False
        if machine is None:
            return False
        try:
            machine.destroy()
            return True
        except Exception as exc:
            self.record.append("machine", event="destroy_failed", error=_sentence(exc, "destroy failed"))
            return False
        finally:
            self.machine = None


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


# --- small pieces ----------------------------------------------------------------------------

def _sentence(exc: BaseException, fallback: str) -> str:
    if isinstance(exc, VerbError):
        return exc.message
    text = str(exc).strip()
    known = type(exc).__name__ in ("GuestError", "ScreenError", "MachineError", "ImageMissing",
                                   "PublishError", "GiteaError", "TaskError")
    if known and text:
        return text
    return f"{fallback}: {type(exc).__name__}: {text}" if text else f"{fallback}: {type(exc).__name__}"


def _output_sink(notify: Notify | None) -> Callable[[str, str], None] | None:
    if notify is None:
        return None

    def sink(stream: str, line: str) -> None:
        try:
            notify("output", {"stream": stream, "line": line})
        except Exception:  # a watcher never breaks the work
            pass
    return sink


def _run_text(result: dict) -> str:
    head = f"exit code {result['exit_code']} ({result['duration']:.1f} s)"
    if result.get("timed_out"):
        head += ", TIMED OUT"
    if result.get("truncated"):
        head += ", output truncated in the middle"
    parts = [head]
    if result.get("stdout"):
        parts.append("--- stdout ---\n" + result["stdout"].rstrip("\n"))
    if result.get("stderr"):
        parts.append("--- stderr ---\n" + result["stderr"].rstrip("\n"))
    return "\n".join(parts)


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
