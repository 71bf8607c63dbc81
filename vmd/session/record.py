"""The session record: an append-only JSONL file of what vmd served, as served.

One line per event under `<state_dir>/sessions/<id>/record.jsonl`; screenshots are PNG
files beside it. Reports are built from this file alone, so it says everything a
report needs (the verification outcome, task changes, the commit) and nothing secret:
the Gitea token and anything that looks like a credential are redacted, and file
bodies are summarised rather than stored.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from vmd.private_fs import private_dir, write_private
from vmd.session import disk

REDACTED = "[redacted]"
# Argument and result keys whose values are file bodies: summarised, never stored.
BODY_KEYS = {"content", "png_base64", "markdown"}
# Keys whose values are secrets wherever they appear.
SECRET_KEY = re.compile(r"(?i)(token|password|passwd|secret|api[_-]?key|authorization|credential)")
# Secrets inside free text: `TOKEN=abc`, `password: abc`, `Authorization: Bearer abc`,
# and tokens with well-known prefixes.
SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b([\w-]*(?:token|password|passwd|secret|api[_-]?key)[\w-]*)(\s*[=:]\s*|\s+)(['\"]?)([^\s'\"]{4,})"
)
SECRET_HEADER = re.compile(r"(?i)(authorization:\s*(?:bearer|token|basic)\s+)(\S+)")
SECRET_PREFIXED = re.compile(r"\b(ghp_|gho_|github_pat_|glpat-|sk-|xox[abp]-)[A-Za-z0-9_-]{8,}")
# Long strings in the record are cut to this many characters, and the keys below to
# theirs: the defaults of vmd/config/settings.py's record_output_chars and record_output_tail_chars,
# which vmd passes in.
TEXT_LIMIT = 2000
LONG_KEYS = {"output_tail": 8000}


def body_summary(value: str | bytes) -> str:
    data = value.encode() if isinstance(value, str) else value
    first = data.split(b"\n", 1)[0][:80].decode(errors="replace")
    return f"<{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}…, first line: {first!r}>"


class Redactor:
    """Removes known secret values and credential-looking text from anything JSON."""

    def __init__(self, secrets: Iterable[str] = (), text_limit: int = TEXT_LIMIT,
                 long_keys: dict[str, int] | None = None):
        self.secrets = [s for s in secrets if s and len(s) >= 4]
        self.text_limit = text_limit
        self.long_keys = LONG_KEYS if long_keys is None else long_keys

    def text(self, value: str) -> str:
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        value = SECRET_HEADER.sub(lambda m: m[1] + REDACTED, value)
        value = SECRET_ASSIGNMENT.sub(lambda m: f"{m[1]}{m[2]}{m[3]}{REDACTED}", value)
        return SECRET_PREFIXED.sub(REDACTED, value)

    def value(self, value: Any, key: str = "", limit: int | None = None) -> Any:
        limit = self.text_limit if limit is None else limit
        if isinstance(value, dict):
            return {k: self.value(v, k, self.long_keys.get(k, limit)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, key, limit) for v in value]
        if isinstance(value, bytes):
            return body_summary(value)
        if isinstance(value, str):
            if key and SECRET_KEY.search(key) and value:
                return REDACTED
            if key in BODY_KEYS:
                return body_summary(self.text(value))
            value = self.text(value)
            if len(value) > limit:
                value = value[: limit // 2] + f"\n…[{len(value) - limit} characters cut]…\n" + value[-limit // 2:]
            return value
        return value


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Record:
    """Appends events to one session's record; safe to share between threads.

    A full disk does not raise: the event is kept in memory (`unwritten`, in order, written
    first by the next append or `flush()` once there is room again) and `full` says what
    happened in a sentence, which the session turns into the end of the session. Any other
    error raises as before."""

    def __init__(self, session_dir: Path, redactor: Redactor | None = None):
        self.dir = Path(session_dir)
        if not self.dir.is_dir():  # the session's folder is made (with its modes) by Session
            private_dir(self.dir)
        self.path = self.dir / "record.jsonl"
        self.redactor = redactor or Redactor()
        self._lock = threading.Lock()
        self.unwritten: list[dict] = []
        self.full: str | None = None  # the first full-disk sentence, once one happened

    def append(self, kind: str, **fields: Any) -> dict:
        event = {"time": now_iso(), "kind": kind, **self.redactor.value(fields)}
        with self._lock:
            self.unwritten.append(event)
            try:
                self._write_unwritten()
            except OSError:
                self.unwritten.pop()  # not a full disk: raise as before, keep no copy
                raise
        return event

    def flush(self) -> bool:
        """Writes what a full disk held back; True when nothing is left in memory."""
        with self._lock:
            self._write_unwritten()
            return not self.unwritten

    def events(self) -> list[dict]:
        """Every event: those on disk, then those still held in memory."""
        events = read_record(self.path) if self.path.exists() else []
        with self._lock:
            return events + list(self.unwritten)

    def _write_unwritten(self) -> None:
        if not self.unwritten:
            return
        data = "".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in self.unwritten)
        try:
            disk.append(self.path, data.encode("utf-8"))
        except OSError as exc:
            if not disk.full(exc):
                raise
            if self.full is None:
                self.full = disk.sentence(f"vmd could not write the session's record {self.path}", exc)
            return
        self.unwritten.clear()

    def verb(self, verb: str, args: dict, *, result: dict | None = None, error: str | None = None,
             duration: float = 0.0, **extra: Any) -> dict:
        fields: dict[str, Any] = {"verb": verb, "args": args, "duration": round(duration, 3)}
        if error is not None:
            fields["error"] = error
        else:
            fields["result"] = result or {}
        fields.update(extra)
        return self.append("verb", **fields)

    def save_screenshot(self, png: bytes) -> str:
        """Stores a PNG beside the record; returns its path relative to the session dir."""
        folder = self.dir / "screenshots"
        if not folder.is_dir():
            private_dir(folder)
        with self._lock:
            number = len(list(folder.glob("*.png"))) + 1
            name = f"screenshots/{number:04d}-{int(time.time())}.png"
            write_private(self.dir / name, png)
        return name


def read_record(path: str | Path) -> list[dict]:
    """All events of a record; a torn last line (vmd killed mid-write) is skipped."""
    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events
