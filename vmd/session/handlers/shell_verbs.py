"""The shell and file verbs: run, read_file, write_file, append_file, edit_file, list_dir
(the machine's guest, vmd/guests/guest.py; each result made here from what the guest returns),
git_commit (a commit built by vmd from the folder's bytes, vmd/projects/publish.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vmd.contract.params import EditFile, GitCommit, ListDir, ReadFile, Run, WriteFile
from vmd.errors import refused
from vmd.session.handlers.output import streamed

if TYPE_CHECKING:
    from vmd.guests.guest import CommandResult
    from vmd.session.session import Session


def run(session: Session, p: Run, notify) -> dict:
    with streamed(notify) as sink:
        result = session.ready_machine().guest.run(p.command, timeout=p.timeout, cwd=p.cwd, on_output=sink)
    with session.lock:
        session.s.runs += 1
        session.save()
    return {**result.model_dump(), "text": _run_text(result)}


def read_file(session: Session, p: ReadFile, notify) -> dict:
    chunk = session.ready_machine().guest.read_file(p.path, p.offset, p.limit)
    text = chunk.content
    if chunk.truncated:
        end = chunk.offset + len(chunk.content.encode())
        text += f"\n[vmd: showing bytes {chunk.offset}–{end} of {chunk.size}; read on with offset={end}]"
    return {**chunk.model_dump(), "text": text}


def write_file(session: Session, p: WriteFile, notify) -> dict:
    n = session.ready_machine().guest.write_file(p.path, p.content)
    return {"path": p.path, "bytes": n, "text": f"wrote {n} bytes to {p.path}."}


def append_file(session: Session, p: WriteFile, notify) -> dict:
    n = session.ready_machine().guest.append_file(p.path, p.content)
    return {"path": p.path, "bytes": n, "text": f"appended {n} bytes to {p.path}."}


def edit_file(session: Session, p: EditFile, notify) -> dict:
    session.ready_machine().guest.edit_file(p.path, p.old, p.new)
    return {"path": p.path, "text": f"edited {p.path}: replaced the one match."}


def list_dir(session: Session, p: ListDir, notify) -> dict:
    entries = session.ready_machine().guest.list_dir(p.path)
    lines = [f"{e.name}{'/' if e.type == 'dir' else ''}  {e.size}" for e in entries]
    note = getattr(entries, "note", "")  # the guest's listing was cut (vmd/guests/guest.py DirListing)
    if note:
        lines.append(f"[vmd: {note}.]")
    return {"entries": [e.model_dump() for e in entries], "text": "\n".join(lines) or f"{p.path} is empty."}


def git_commit(session: Session, p: GitCommit, notify) -> dict:
    if not session.s.project_dir:
        raise refused("this session has no project folder to commit; open the session with a project.")
    with session.frozen():
        committed = session.publication().commit(Path(session.s.project_dir), p.message)
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


def _run_text(result: CommandResult) -> str:
    head = f"exit code {result.exit_code} ({result.duration:.1f} s)"
    if result.timed_out:
        head += ", TIMED OUT"
    if result.truncated:
        head += ", output truncated in the middle"
    parts = [head]
    if result.stdout:
        parts.append("--- stdout ---\n" + result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("--- stderr ---\n" + result.stderr.rstrip("\n"))
    return "\n".join(parts)


HANDLERS = {
    "run": run,
    "read_file": read_file,
    "write_file": write_file,
    "append_file": append_file,
    "edit_file": edit_file,
    "list_dir": list_dir,
    "git_commit": git_commit,
}
