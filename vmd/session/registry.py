"""The live sessions of one vmd, by id: opened, attached (loaded from disk when vmd does
not hold it), adopted at vmd's start, and released once closed."""

from __future__ import annotations

import threading
import time

from vmd.config import VmdConfig
from vmd.contract.params import SESSION_ID, SessionOpen
from vmd.machines.port import MachineFactory
from vmd.private_fs import passable_dir, qemu_gid, state_root
from vmd.projects.store import ProjectStore
from vmd.session import boot
from vmd.session.session import Session
from vmd.session.state import SessionState


class Sessions:
    """The live sessions of one vmd, by id; loads a session from disk on attach."""

    def __init__(self, config: VmdConfig, machines: MachineFactory, store: ProjectStore | None = None):
        self.config = config
        self.machines = machines
        self.store = store or ProjectStore(config)
        self._live: dict[str, Session] = {}
        self._lock = threading.Lock()
        state_root(config.state_dir)
        passable_dir(config.sessions_dir, qemu_gid(config.share_user))

    def open(self, params: SessionOpen) -> Session:
        session = Session.open(params, self.config, self.machines, self.store)
        boot.start_machine(session, attach=False)
        if params.wait:
            session.boot_done.wait(session.boot_timeout)
        with self._lock:
            self._live[session.s.id] = session
        return session

    def attach(self, session_id: str) -> Session:
        with self._lock:
            session = self._live.get(session_id)
            if session is None:
                session = self._load(session_id)
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
            if not SESSION_ID.fullmatch(session_id):
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
                session = self._load(session_id, adopt=True)
                # Its clients were those of the vmd that died: none is bound now, and the
                # grace period of the reaper counts from this start.
                session.s.clients, session.s.detached_at = 0, time.time()
                self._live[session_id] = session
            adopted.append(session)
        return adopted

    def _load(self, session_id: str, adopt: bool = False) -> Session:
        """A session from its session.json; one not closed gets its machine re-bound in the
        background (vmd/session/boot.py)."""
        session = Session.load(session_id, self.config, self.machines, self.store, adopt=adopt)
        if session.s.state != "closed":
            boot.start_machine(session, attach=True)
        else:
            session.boot_done.set()
        return session

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
