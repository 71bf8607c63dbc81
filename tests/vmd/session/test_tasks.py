"""The task list (vmd/session/tasks.py): ids that never change, a re-plan that only adds, and
statuses a finish can rely on."""

from __future__ import annotations

import pytest

from vmd.session.tasks import TaskError, TaskList


def test_a_plan_numbers_its_tasks_from_one_in_order():
    tasks = TaskList()
    added = tasks.plan(["write the code", "  test it  ", ""])
    assert [(t.id, t.title) for t in added] == [(1, "write the code"), (2, "test it")]
    assert tasks.planned and tasks.render() == "[ ] 1. write the code\n[ ] 2. test it"


def test_a_second_plan_adds_only_new_titles_and_keeps_the_ids_given():
    tasks = TaskList()
    tasks.plan(["write the code", "test it"])
    added = tasks.plan(["Write the code", "document it"])
    assert [(t.id, t.title) for t in added] == [(3, "document it")]
    assert [t.id for t in tasks.tasks] == [1, 2, 3]


def test_an_empty_list_says_there_is_no_plan_yet():
    tasks = TaskList()
    assert not tasks.planned and tasks.render() == "(no plan yet)"
    with pytest.raises(TaskError, match="plan_tasks"):
        tasks.get(1)


def test_an_unknown_id_or_status_is_refused_with_what_exists():
    tasks = TaskList()
    tasks.plan(["one", "two"])
    with pytest.raises(TaskError, match="1 to 2"):
        tasks.update(3, "done")
    with pytest.raises(TaskError, match="pending, in_progress, done, blocked"):
        tasks.update(1, "finished")
    with pytest.raises(TaskError, match="title"):
        tasks.add("   ")


def test_a_task_is_blocked_only_with_a_note_saying_why():
    tasks = TaskList()
    tasks.plan(["reach the API"])
    with pytest.raises(TaskError, match="note"):
        tasks.update(1, "blocked")
    task = tasks.update(1, "blocked", "  no network  ")
    assert task.status == "blocked" and task.note == "no network"
    assert tasks.render() == "[!] 1. reach the API — no network"


def test_open_tasks_are_the_pending_and_in_progress_ones():
    tasks = TaskList()
    tasks.plan(["a", "b", "c", "d"])
    tasks.update(1, "done")
    tasks.update(2, "in_progress")
    tasks.update(3, "blocked", "waits for a person")
    assert [t.id for t in tasks.open_tasks()] == [2, 4]
    assert tasks.summary_line() == "1/4 done, 1 in progress, 1 blocked"
    assert "[~] 2. b (in progress)" in tasks.render()


def test_the_list_survives_a_round_trip_through_session_json():
    tasks = TaskList()
    tasks.plan(["a", "b"])
    tasks.update(2, "done", "checked")
    again = TaskList.from_list(tasks.to_list())
    assert again == tasks and again.render() == tasks.render()
