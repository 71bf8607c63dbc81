"""The task verbs: plan_tasks, add_task, update_task; a task marked done is a checkpoint
commit in vmd's repository."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vmd.contract.errors import INVALID_PARAMS
from vmd.contract.params import AddTask, PlanTasks, UpdateTask
from vmd.errors import VerbError, sentence
from vmd.session.tasks import TaskError

if TYPE_CHECKING:
    from vmd.projects.store import Publication
    from vmd.session.session import Session


def _task_change(session: Session, change: str, **fields) -> None:
    session.record.append("task", change=change, **fields, tasks=session.tasks.to_list())
    session.save()


def plan_tasks(session: Session, p: PlanTasks, notify) -> dict:
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


def add_task(session: Session, p: AddTask, notify) -> dict:
    with session.lock:
        try:
            task = session.tasks.add(p.title)
        except TaskError as exc:
            raise VerbError(str(exc), INVALID_PARAMS)
        _task_change(session, "add", id=task.id, title=task.title)
    rendered = session.tasks.render()
    return {"id": task.id, "tasks": rendered, "text": f"Added task {task.id}.\n{rendered}"}


def update_task(session: Session, p: UpdateTask, notify) -> dict:
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
    by task; with Gitea, pushed at once (`_push_checkpoint`). A failure costs a note,
    never the task update."""
    if not session.s.project_dir or session.machine is None or not session.boot_done.is_set():
        return ""
    # The session's id in the body: a job run again elsewhere after its host was lost tells
    # its own checkpoints from an older job's commits (vmagent/loop/rerun.py).
    message = f"Task {task.id} done: {task.title}"[:200] + f"\n\nvmagent session {session.s.id}"
    publication = session.publication()
    try:
        with session.frozen():
            committed = publication.commit(Path(session.s.project_dir), message, allow_empty=True)
    except Exception as exc:
        session.record.append("checkpoint", task=task.id, title=task.title,
                              error=sentence(exc, "the checkpoint commit failed"))
        return " (The checkpoint commit failed; the work stays in the folder.)"
    session.record.append("checkpoint", task=task.id, title=task.title, commit=committed["sha"])
    if not committed["sha"]:
        return ""
    return f" Checkpoint {committed['sha'][:10]} committed." + _push_checkpoint(session, publication, task, committed["sha"])


def _push_checkpoint(session: Session, publication: Publication, task, sha: str) -> str:
    """The checkpoint on Gitea as soon as it is made (after the freeze: the guest runs on
    while git talks to Gitea), so that when this host is lost another host's vmd opens the
    project at it. Its commit status is pending until the close's push says what the check
    found; the close pushes again, a fast-forward from here. A push that fails is a line in
    the record and a sentence in the answer: the commit stays in vmd's repository, and the
    close pushes it with the rest."""
    try:
        if not publication.uses_gitea:
            return ""  # vmd's own repository is where the project lives
        pushed = publication.push_checkpoint(session.s.branch)
        error = None if pushed.get("pushed") else (pushed.get("error") or "the push did not land")
    except Exception as exc:
        pushed, error = {}, sentence(exc, "the push failed")
    if error:
        session.record.append("checkpoint", event="not_pushed", task=task.id, sha=sha,
                              text=f"checkpoint {sha[:10]} of task {task.id} not pushed: {error}")
        return " It was not pushed now (the close pushes it with the rest)."
    session.record.append("checkpoint", event="pushed", task=task.id, sha=pushed.get("sha") or sha,
                          branch=pushed.get("branch"), web_url=pushed.get("web_url"))
    return " Pushed."


HANDLERS = {
    "plan_tasks": plan_tasks,
    "add_task": add_task,
    "update_task": update_task,
}
