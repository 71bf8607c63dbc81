"""The session's task list: what the agent planned, and how far each task got.

Ids are the integers 1, 2, … in the order tasks were planned and added; they never
change, so a model can refer to "task 3" for the whole session.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from vmd.errors import WordedError

STATUSES = ("pending", "in_progress", "done", "blocked")
OPEN_STATUSES = ("pending", "in_progress")
_MARKS = {"pending": "[ ]", "in_progress": "[~]", "done": "[x]", "blocked": "[!]"}


class TaskError(WordedError, ValueError):
    """A task change that cannot be made; the message says what to do instead."""


@dataclass
class Task:
    id: int
    title: str
    status: str = "pending"
    note: str = ""

    def render(self) -> str:
        line = f"{_MARKS[self.status]} {self.id}. {self.title}"
        if self.status == "in_progress":
            line += " (in progress)"
        if self.note:
            line += f" — {self.note}"
        return line


@dataclass
class TaskList:
    tasks: list[Task] = field(default_factory=list)

    @property
    def planned(self) -> bool:
        return bool(self.tasks)

    def plan(self, titles: list[str]) -> list[Task]:
        """Sets the plan; a later plan adds the titles not already in the list (models
        re-plan often, and ids already handed out must keep their meaning)."""
        known = {t.title.strip().lower() for t in self.tasks}
        added = []
        for title in titles:
            title = title.strip()
            if title and title.lower() not in known:
                added.append(self.add(title))
                known.add(title.lower())
        return added

    def add(self, title: str) -> Task:
        title = title.strip()
        if not title:
            raise TaskError("a task needs a title.")
        task = Task(id=len(self.tasks) + 1, title=title)
        self.tasks.append(task)
        return task

    def get(self, task_id: int) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        if not self.tasks:
            raise TaskError(f"there is no task {task_id}: no plan yet; call plan_tasks first.")
        raise TaskError(f"there is no task {task_id}; the ids are 1 to {len(self.tasks)}.")

    def update(self, task_id: int, status: str, note: str = "") -> Task:
        if status not in STATUSES:
            raise TaskError(f"unknown status '{status}'; use one of {', '.join(STATUSES)}.")
        task = self.get(task_id)
        note = note.strip()
        if status == "blocked" and not (note or task.note):
            raise TaskError(
                f"task {task_id} cannot be blocked without a note: say what blocks it "
                "(update_task with status blocked and a note)."
            )
        task.status = status
        if note:
            task.note = note
        return task

    def open_tasks(self) -> list[Task]:
        return [t for t in self.tasks if t.status in OPEN_STATUSES]

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for t in self.tasks if t.status == s) for s in STATUSES}

    def render(self) -> str:
        if not self.tasks:
            return "(no plan yet)"
        return "\n".join(t.render() for t in self.tasks)

    def summary_line(self) -> str:
        c = self.counts()
        return f"{c['done']}/{len(self.tasks)} done" + "".join(
            f", {c[s]} {s.replace('_', ' ')}" for s in ("in_progress", "blocked") if c[s]
        )

    def to_list(self) -> list[dict]:
        return [asdict(t) for t in self.tasks]

    @classmethod
    def from_list(cls, items: list[dict]) -> "TaskList":
        return cls([Task(**item) for item in items])
