"""The task verbs: plan_tasks, add_task, update_task; a task marked done is a checkpoint
commit in vmd's repository."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vmd import verbs as V
from vmd.errors import INVALID_PARAMS, VerbError, sentence
from vmd.session.tasks import TaskError

if TYPE_CHECKING:
    from vmd.session.session import Session


def _task_change(session: Session, change: str, **fields) -> None:
    session.record.append("task", change=change, **fields, tasks=session.tasks.to_list())
    session.save()


def plan_tasks(session: Session, p: V.PlanTasks, notify) -> dict:
    with session.lock:
        had_plan = session.tasks.planned
        added = session.tasks.plan(p.tasks)
        _task_change(session, "plan", added=[t.title for t in added])
    if had_plan:
        text = (f"A plan existed; added {len(added)} new task(s), kept the ids already given:\n"
                if added else "A plan exists and holds these tasks already; nothing added:\n")
    else:
        text = "Planned. The machine is booting; work through the tasks and mark each one:\n"
    rendered = session.tasks.render()
    return {"tasks": rendered, "text": text + rendered}


def add_task(session: Session, p: V.AddTask, notify) -> dict:
    with session.lock:
        try:
            task = session.tasks.add(p.title)
        except TaskError as exc:
            raise VerbError(str(exc), INVALID_PARAMS)
        _task_change(session, "add", id=task.id, title=task.title)
    rendered = session.tasks.render()
    return {"id": task.id, "tasks": rendered, "text": f"Added task {task.id}.\n{rendered}"}


def update_task(session: Session, p: V.UpdateTask, notify) -> dict:
    with session.lock:
        try:
            was = session.tasks.get(p.id).status
            task = session.tasks.update(p.id, p.status, p.note)
        except TaskError as exc:
            raise VerbError(str(exc), INVALID_PARAMS)
        _task_change(session, "update", id=task.id, status=task.status, note=task.note)
    rendered = session.tasks.render()
    text = f"Task {task.id} is {task.status.replace('_', ' ')}."
    if task.status == "done" and was != "done":
        text += _checkpoint(session, task)
    return {"tasks": rendered, "text": f"{text}\n{rendered}"}


def _checkpoint(session: Session, task) -> str:
    """A commit in vmd's repository per closed task, so the history shows the work task
    by task. A failure costs a note, never the task update."""
    if not session.s.project_dir or session.machine is None or not session.boot_done.is_set():
        return ""
    try:
        with session.frozen():
            committed = session.store.commit(Path(session.s.project_dir), session.s.owner, session.s.project or "",
                                             f"Task {task.id} done: {task.title}"[:200], allow_empty=True)
    except Exception as exc:
        session.record.append("checkpoint", task=task.id, title=task.title,
                              error=sentence(exc, "the checkpoint commit failed"))
        return " (The checkpoint commit failed; the work stays in the folder.)"
    session.record.append("checkpoint", task=task.id, title=task.title, commit=committed["sha"])
    return f" Checkpoint {committed['sha'][:10]} committed." if committed["sha"] else ""


HANDLERS = {
    "plan_tasks": plan_tasks,
    "add_task": add_task,
    "update_task": update_task,
}
