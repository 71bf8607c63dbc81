"""The jobs the compose fleet test plays (tests/e2e/test_fleet_stack.py), and the model that plays
them: docker/ci/standins.py serves `model` as the fleet's Ollama (`ollama-fleet`). Standard
library only (the stand-in's container has python3 and git, not vmagent).

Each turn is chosen from the conversation it is asked in, so the script survives what the
test does to the fleet: a host killed mid-command (the job runs again elsewhere, told so by
the loop's "The machine was lost with its host" message, and plans again), the job service
killed and started again (the job's shim and worker never noticed).

- MOVES: writes notes.txt and marks it done (a checkpoint vmd pushes to Gitea at once),
  then runs LONG_COMMAND, during which the test kills the host running it. On the new
  machine it reads notes.txt (from the checkpoint), counts the notes into count.txt and
  finishes with a check that needs both files.
- STAYS: runs a command long enough for the test to kill the job service under it, then
  writes hello.txt and finishes.
- LOAD (bench/load.py --fleet): plan, write hello.txt with a command, mark it done, finish.
"""

from __future__ import annotations

from typing import Any

from tests.support.ollama_server import Turn

MOVES = "Keep notes in notes.txt and count them (fleet: a host dies)"
STAYS = "Write hello.txt while the service restarts (fleet)"
LONG_MARK = "long-command-started"
LONG_COMMAND = f"echo {LONG_MARK}; sleep 900"
STAY_MARK = "service-kill-window"
STAY_SECONDS = 40
LOAD = "Write hello.txt holding hello (fleet load job"  # + " N)"
LOAD_CHECK = "cd /mnt/project && grep -qx hello hello.txt"
LOST_WORDS = "The machine was lost with its host"  # vmagent/loop/words.py host_lost
NOTE = "first note"
MOVES_CHECK = "cd /mnt/project && grep -qx 'first note' notes.txt && grep -qx 1 count.txt"
STAYS_CHECK = "cd /mnt/project && grep -qx hello hello.txt"


def call(*pairs: tuple[str, dict], content: str = "") -> Turn:
    return Turn(content=content, tool_calls=[{"name": name, "arguments": args} for name, args in pairs])


def _users(body: dict) -> list[str]:
    return [str(m.get("content", "")) for m in body.get("messages") or [] if m.get("role") == "user"]


def _turns_since(body: dict, marker: str | None) -> int:
    """Assistant turns after the last user message holding `marker` (all when None)."""
    messages = body.get("messages") or []
    start = 0
    if marker:
        for i, m in enumerate(messages):
            if m.get("role") == "user" and marker in str(m.get("content", "")):
                start = i
    return sum(1 for m in messages[start:] if m.get("role") == "assistant")


def moves(body: dict) -> Turn:
    plan = call(("plan_tasks", {"tasks": ["write notes.txt", "count the notes"]}), content="Planning.")
    if any(LOST_WORDS in text for text in _users(body)):
        after = [plan,
                 call(("run", {"command": "cat /mnt/project/notes.txt"})),
                 call(("update_task", {"id": 1, "status": "done", "note": "notes.txt came with the checkpoint"}),
                      ("update_task", {"id": 2, "status": "in_progress"}),
                      ("run", {"command": "grep -c . /mnt/project/notes.txt > /mnt/project/count.txt; "
                                          "cat /mnt/project/count.txt"})),
                 call(("update_task", {"id": 2, "status": "done", "note": "counted"})),
                 call(("finish", {"summary": "notes.txt holds the note and count.txt counts it",
                                  "verification": {"command": MOVES_CHECK}}))]
        return after[min(_turns_since(body, LOST_WORDS), len(after) - 1)]
    before = [plan,
              call(("update_task", {"id": 1, "status": "in_progress"}),
                   ("write_file", {"path": "/mnt/project/notes.txt", "content": NOTE + "\n"})),
              call(("update_task", {"id": 1, "status": "done", "note": "written"})),
              call(("update_task", {"id": 2, "status": "in_progress"}),
                   ("run", {"command": LONG_COMMAND, "timeout": 1200}))]
    n = _turns_since(body, None)
    if n < len(before):
        return before[n]
    return Turn(status=400, error="the long command ended: the test should have killed its host")


def stays(body: dict) -> Turn:
    turns = [call(("plan_tasks", {"tasks": ["write hello.txt"]}), content="Planning."),
             call(("update_task", {"id": 1, "status": "in_progress"}),
                  ("run", {"command": f"echo {STAY_MARK}; sleep {STAY_SECONDS}; "
                                      "echo hello > /mnt/project/hello.txt", "timeout": 600})),
             call(("update_task", {"id": 1, "status": "done", "note": "hello.txt written"})),
             call(("finish", {"summary": "hello.txt says hello", "verification": {"command": STAYS_CHECK}}))]
    return turns[min(_turns_since(body, None), len(turns) - 1)]


def load(body: dict) -> Turn:
    turns = [call(("plan_tasks", {"tasks": ["write hello.txt"]}), content="Planning while the machine boots."),
             call(("update_task", {"id": 1, "status": "in_progress"}),
                  ("run", {"command": "echo hello > /mnt/project/hello.txt"})),
             call(("update_task", {"id": 1, "status": "done", "note": "hello.txt written"})),
             call(("finish", {"summary": "hello.txt holds hello", "verification": {"command": LOAD_CHECK}}))]
    # On a new machine (its host was lost) the same again, from the loss on.
    since = LOST_WORDS if any(LOST_WORDS in text for text in _users(body)) else None
    return turns[min(_turns_since(body, since), len(turns) - 1)]


def model(body: dict) -> Any:
    """One turn of whichever job asks (its task is in its first user message)."""
    messages = body.get("messages") or []
    if messages and str(messages[0].get("content", "")).startswith("You condense"):  # compaction
        return Turn(content="Summary: the job planned, wrote its files and went on.")
    users = _users(body)
    first = users[0] if users else ""
    if MOVES in first:
        return moves(body)
    if STAYS in first:
        return stays(body)
    if LOAD in first:
        return load(body)
    return Turn(status=400, error="no script for this task in tests/support/fleet_jobs.py")
