"""Jobs and their events in SQLite (WAL), so that a restart of the service loses nothing.

One row per job; one row per event the job's worker wrote (screenshots are kept as the
newest PNG in the job's folder, the event row only says that one arrived).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from .private_files import open_private, private_dir, private_file

JOB_STATES = ("queued", "running", "needs_input", "needs_approval", "done", "failed", "cancelled")
# States in which no worker runs and none will start by itself.
RESTING_STATES = ("needs_input", "needs_approval", "done", "failed", "cancelled")
FINAL_STATES = ("done", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    chat_id TEXT NOT NULL DEFAULT '',
    message_id TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL,
    os TEXT NOT NULL,
    project TEXT,
    model TEXT,
    state TEXT NOT NULL,
    question TEXT,
    report TEXT,
    session_id TEXT,
    verification_passed INTEGER,
    verification_proven INTEGER,
    verification_attempts INTEGER NOT NULL DEFAULT 0,
    steps INTEGER NOT NULL DEFAULT 0,
    tool_calls INTEGER NOT NULL DEFAULT 0,
    status_line TEXT NOT NULL DEFAULT '',
    tasks_text TEXT NOT NULL DEFAULT '',
    preview_ready INTEGER NOT NULL DEFAULT 0,
    screenshot_seq INTEGER NOT NULL DEFAULT 0,
    preview_secret TEXT NOT NULL,
    worker_pid INTEGER,
    frames_offset INTEGER NOT NULL DEFAULT 0,
    push_json TEXT,
    machine_came TEXT,
    machine_seconds REAL,
    web INTEGER NOT NULL DEFAULT 1,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    ended REAL
);
CREATE INDEX IF NOT EXISTS jobs_owner_chat ON jobs (owner, chat_id, created);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, created);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"""

_COLUMNS = (
    "id", "owner", "chat_id", "message_id", "task", "os", "project", "model", "state",
    "question", "report", "session_id", "verification_passed", "verification_proven",
    "verification_attempts", "steps", "status_line", "tasks_text", "preview_ready",
    "screenshot_seq", "preview_secret", "worker_pid", "frames_offset", "created", "updated",
    "ended", "push_json", "machine_came", "machine_seconds", "web", "tool_calls",
)
# Columns added after the first release, added to an older database: (name, SQL type,
# the value its rows get, as SQL over their other columns; None leaves the default).
_ADDED_COLUMNS = (
    ("ended", "REAL", None),
    # vmd did not run checks on the baseline then: whether a check proved anything is unknown.
    ("verification_proven", "INTEGER", None),
    # vmd then ran the check once, at the finish it accepted.
    ("verification_attempts", "INTEGER NOT NULL DEFAULT 0",
     "CASE WHEN verification_passed IS NULL THEN 0 ELSE 1 END"),
    # vmd's push at close, as JSON; jobs from before it was kept have none.
    ("push_json", "TEXT", None),
    # How the job's machine came (vmd's warm pool or a cold boot) and in how many seconds.
    ("machine_came", "TEXT", None),
    ("machine_seconds", "REAL", None),
    # Whether the person let the job use the web tools (the Open WebUI user valve): older jobs did.
    ("web", "INTEGER NOT NULL DEFAULT 1", None),
    # The tool calls of the model's turns (`steps` counts the turns); older jobs kept none.
    ("tool_calls", "INTEGER NOT NULL DEFAULT 0", None),
)


class Store:
    """Thread-safe: the HTTP handlers and the worker readers share one connection under a lock."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        # Called with (job_id, seq) after each event is stored: live watchers wake on it.
        self.listeners: list[Callable[[str, int], None]] = []
        self.jobs_dir = private_dir(private_dir(self.data_dir) / "jobs")
        self._lock = threading.RLock()
        db_path = self.data_dir / "jobs.sqlite3"
        # SQLite creates its file 0644 (less the umask); made here first, it stays 0600, and
        # SQLite gives the -wal and -shm files the database's own mode.
        os.close(open_private(db_path, os.O_RDWR))
        self._db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        present = {row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")}
        for name, kind, backfill in _ADDED_COLUMNS:
            if name not in present:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
                if backfill:
                    self._db.execute(f"UPDATE jobs SET {name} = {backfill}")
        # A database from before modes were set: its side files may be wider than 0600.
        for side in ("-wal", "-shm"):
            private_file(db_path.with_name(db_path.name + side))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    # --- jobs ----------------------------------------------------------------------

    def create_job(self, *, owner: str, task: str, os: str, project: str | None,
                   chat_id: str = "", message_id: str = "", model: str | None = None, web: bool = True) -> dict:
        now = time.time()
        job = {
            "id": uuid.uuid4().hex[:16], "owner": owner, "chat_id": chat_id or "",
            "message_id": message_id or "", "task": task, "os": os, "project": project,
            "model": model, "state": "queued", "question": None, "report": None,
            "session_id": None, "verification_passed": None, "verification_proven": None,
            "verification_attempts": 0, "steps": 0, "status_line": "queued",
            "tasks_text": "", "preview_ready": 0, "screenshot_seq": 0,
            "preview_secret": secrets.token_hex(32), "worker_pid": None, "frames_offset": 0,
            "created": now, "updated": now, "ended": None, "push_json": None,
            "machine_came": None, "machine_seconds": None, "web": 1 if web else 0, "tool_calls": 0,
        }
        # Other threads start any queued job they see (WorkerPool.pump: another request's, a
        # finishing job's follower). So the folder comes first, and the row, its first event
        # and the read of it returned are one hold of the lock. Seen before its folder
        # existed, a job failed to start (FileNotFoundError writing its job file: a 500 for
        # the request that pumped); started before this read, it was set back to queued by
        # WorkerPool.submit, which takes the state it is given.
        private_dir(self.job_dir(job["id"]))
        with self._lock:
            self._db.execute(
                f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})",
                [job[c] for c in _COLUMNS],
            )
            self.add_event(job["id"], {"type": "state", "state": "queued"})
            return self.get_job(job["id"])

    def get_job(self, job_id: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return dict(row) if row else None

    def update_job(self, job_id: str, **fields: Any) -> dict | None:
        unknown = set(fields) - set(_COLUMNS)
        if unknown:
            raise KeyError(f"unknown job fields: {sorted(unknown)}")
        fields["updated"] = time.time()
        assignments = ", ".join(f"{k} = ?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", [*fields.values(), job_id])
        return self.get_job(job_id)

    def set_state(self, job_id: str, state: str, **fields: Any) -> dict | None:
        """Change state and record the change as an event, so watchers see it too."""
        if state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}")
        # When it ended: preview links stop working a grace period later.
        fields["ended"] = time.time() if state in FINAL_STATES else None
        job = self.update_job(job_id, state=state, **fields)
        event: dict = {"type": "state", "state": state}
        if job and job.get("question") and state in ("needs_input", "needs_approval"):
            event["question"] = job["question"]
        self.add_event(job_id, event)
        return job

    def list_jobs(self, *, owner: str | None = None, chat_id: str | None = None,
                  states: tuple[str, ...] | None = None, limit: int = 100) -> list[dict]:
        clauses, args = [], []
        if owner is not None:
            clauses.append("owner = ?")
            args.append(owner)
        if chat_id is not None:
            clauses.append("chat_id = ?")
            args.append(chat_id)
        if states:
            clauses.append(f"state IN ({', '.join('?' for _ in states)})")
            args.extend(states)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM jobs {where} ORDER BY created DESC LIMIT ?", [*args, limit]
            ).fetchall()
        return [dict(r) for r in rows]

    def queued_jobs(self) -> list[dict]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM jobs WHERE state = 'queued' ORDER BY created ASC"
            ).fetchall()
        return [dict(r) for r in rows]

    # --- events --------------------------------------------------------------------

    def add_event(self, job_id: str, event: dict) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
            ).fetchone()
            seq = int(row[0]) + 1
            self._db.execute(
                "INSERT INTO events (job_id, seq, ts, data) VALUES (?, ?, ?, ?)",
                (job_id, seq, time.time(), json.dumps(event)),
            )
        for listener in list(self.listeners):
            try:
                listener(job_id, seq)
            except Exception:  # a view never breaks the work
                pass
        return seq

    def replace_event(self, job_id: str, seq: int, event: dict) -> None:
        """Rewrites a stored event in place (a notice whose count grows); watchers that
        already read it are not told again."""
        with self._lock:
            self._db.execute("UPDATE events SET data = ? WHERE job_id = ? AND seq = ?",
                             (json.dumps(event), job_id, seq))

    def count_events(self, job_id: str, kind: str) -> int:
        """How many events of type `kind` the job has stored."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM events WHERE job_id = ? AND json_extract(data, '$.type') = ?",
                (job_id, kind)).fetchone()
        return int(row[0])

    def events(self, job_id: str, after: int = 0, limit: int | None = None) -> list[tuple[int, dict]]:
        sql = "SELECT seq, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq"
        args: list = [job_id, after]
        if limit:
            sql += " LIMIT ?"
            args.append(limit)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [(int(r["seq"]), json.loads(r["data"])) for r in rows]

    def tail_events(self, job_id: str, count: int) -> list[tuple[int, dict]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, data FROM events WHERE job_id = ? ORDER BY seq DESC LIMIT ?",
                (job_id, count),
            ).fetchall()
        return [(int(r["seq"]), json.loads(r["data"])) for r in reversed(rows)]

    def iter_events(self, job_id: str) -> Iterator[tuple[int, dict]]:
        after = 0
        while True:
            batch = self.events(job_id, after=after, limit=500)
            if not batch:
                return
            yield from batch
            after = batch[-1][0]
