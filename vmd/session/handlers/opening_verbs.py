"""The verbs that give a connection its session: session_open (a new session, its machine
booting in the background) and session_attach (one vmd holds, or loads from disk). They come
before there is a session to serve them, so their handlers take vmd's live sessions
(`Sessions`) and answer the session with the result; vmd/server/rpc.py binds its connection
to it. Never gated, counted or recorded as a session's verbs (POLICY)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmd.contract.params import SessionAttach, SessionOpen

if TYPE_CHECKING:
    from vmd.session.registry import Sessions
    from vmd.session.session import Session


def session_open(sessions: Sessions, p: SessionOpen) -> tuple[Session, dict]:
    session = sessions.open(p)
    s = session.s
    return session, {
        "session_id": s.id, "os": s.os, "os_family": s.os_family, "desktop": s.desktop,
        "project": s.project,
        "project_share": bool(s.project_dir),
        "storage": s.storage, "state": s.state,
        "text": f"Session {s.id} is open; the {s.os} machine boots in the background. "
                f"Storage: {s.storage}. Plan first with plan_tasks."}


def session_attach(sessions: Sessions, p: SessionAttach) -> tuple[Session, dict]:
    session = sessions.attach(p.session_id)
    s = session.s
    return session, {
        "session_id": s.id, "state": s.state,
        "text": f"Attached to session {s.id} ({s.state}).\n{session.tasks.render()}"}


# Served before a session exists: verb -> handler(sessions, params) -> (session, dict)
# (handlers/table.py); the connection is bound to the session answered.
BINDING = {"session_open": session_open, "session_attach": session_attach}
