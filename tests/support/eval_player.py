"""A scripted model that plays each task of evals/ from its reference solution (solution/),
for the scripted Ollama server (tests/support/ollama_server.py, as its `default` turn): it reads
which task it is given from the opening message and how far it got from the assistant
turns so far, so runs of several tasks at once need no shared state. It plans, asks the
person first where the task says so, writes the solution's files, runs a command,
closes its task and finishes with a check that needs the work (the sha256 of the first
file it wrote); for a task whose obvious check proves nothing it finishes with the old
tests first, as a model would, and vmd refuses that."""

from __future__ import annotations

import hashlib

from tests.support.loop_harness import call, calls, is_summary_request
from tests.support.ollama_server import Turn
from vmagent.eval.tasks import EvalTask
from vmd.session.verification import TEST_NAME

OBVIOUS = "python3 -m unittest"


def solution_files(task: EvalTask) -> dict[str, str]:
    root = task.folder / "solution"
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file()}


def proof(path: str, text: str) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()
    return (f"python3 -c \"import hashlib, sys; sys.exit(hashlib.sha256(open('{path}', 'rb').read()).hexdigest() "
            f"!= '{digest}')\"")


def turns_for(task: EvalTask) -> list[Turn]:
    files = solution_files(task)
    turns = [call("ask_user", {"question": "Which one do you want?"})] if task.meta.kind == "needs-answer" else []
    turns.append(call("plan_tasks", {"tasks": [f"do {task.name}"]}))
    if files:
        turns.append(calls(*[("write_file", {"path": p, "content": t}) for p, t in files.items()]))
    turns += [call("run", {"command": "ls"}), call("update_task", {"id": 1, "status": "done", "note": "written"})]
    if task.meta.kind == "check-proves-nothing":
        turns.append(call("finish", {"summary": "the tests pass", "verification": OBVIOUS}))
    if files:
        # A file of the work, not a test: vmd lays the work's tests over the baseline (they
        # are the check's own), so a digest of one would pass there too.
        path, text = next(((p, t) for p, t in files.items() if not TEST_NAME.search(p)), next(iter(files.items())))
        turns.append(call("finish", {"summary": "done", "verification": proof(path, text)}))
    else:
        turns.append(call("finish", {"summary": "nothing to change: the tests pass", "verification": OBVIOUS}))
    return turns


class Player:
    """The `default` of the scripted server: the next turn of whichever task the request is for."""

    def __init__(self, tasks: list[EvalTask]):
        self.tasks = tasks
        self.turns = {task.name: turns_for(task) for task in tasks}

    def __call__(self, body: dict) -> Turn:
        if is_summary_request(body):
            return Turn(content="The work so far: the plan is made and the files are being written.")
        messages = body.get("messages") or []
        opening = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        task = next((t for t in self.tasks if t.text.splitlines()[0] in opening), None)
        if task is None:
            return Turn(content="I do not know this task.")
        done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        script = self.turns[task.name]
        return script[done] if done < len(script) else Turn(content="Nothing more to do.")


def tasks_without_a_desktop(tasks: list[EvalTask]) -> list[EvalTask]:
    # The GUI task's check clicks a window on the guest's X display: the stand-in machines have none.
    return [t for t in tasks if t.meta.kind != "gui"]

