"""Jobs placed by Ray on two vmd hosts, with real guests (issue 25; tests/support/fleet_vm_harness.py).

The job service runs its jobs with the Ray executor; the cluster has two hosts, "a" and
"b", each a Ray node with one guest slot and its own `vmd serve` on this machine's
libvirt, both keeping their projects on one stand-in Gitea. The model is the scripted
Ollama server.

A question that waits on its host and resumes there is tested on the same Ray cluster
with the stand-in machines (tests/vmagent/fleet/test_ray_executor.py), and on a real guest with the
local executor (tests/e2e/test_openwebui_vm.py): a real guest here cost CI 2 more minutes.

- A host lost: the job closed task 1 on one host (the checkpoint pushed to Gitea) and was
  on task 2 when that host died (its Ray node, its vmd and its guest gone at once). The
  job carries on on the other host from the checkpoint and finishes verified; Gitea's
  history holds the work of both hosts.
"""

from __future__ import annotations

import threading

import pytest

from tests.conftest import make_traversable
from tests.support.fleet_vm_harness import fleet, until
from tests.support.loop_harness import call, calls, user_texts
from tests.support.ollama_server import Turn

pytest.importorskip("ray")
pytestmark = [pytest.mark.vm, pytest.mark.ray]

# Guests boot under TCG here: ~65 s each to a desktop, slower while another host's guest runs.
JOB_S = 600


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, debian_image):
    work = tmp_path_factory.mktemp("fleet")
    make_traversable(work)  # QEMU (libvirt's user) reaches the sessions' files under it
    with fleet(work, debian_image.dir.parent) as f:
        yield f
        f.no_guest_left()


# --- a host lost: the job carries on on the other host from its pushed checkpoint ------------

LOST_TASK = "Greet people: greet.py prints hello, names.txt lists ada"
LOST_PROJECT = "greet-lost"
TASKS = ["write greet.py", "write names.txt and check both"]
LOST_CHECK = "cd /mnt/project && python3 greet.py | grep -qx hello && grep -qx ada names.txt"


def test_a_job_whose_host_dies_finishes_on_the_other_host_from_its_checkpoint(hosts):
    f = hosts
    asked = threading.Event()  # the model was asked for the turn after task 2 began
    lost = threading.Event()   # ...and the host is gone now

    def host_dies(body: dict) -> Turn:
        asked.set()
        lost.wait(120)
        return Turn(status=500, error="the worker's host is gone")

    f.models.play(LOST_TASK, [
        call("plan_tasks", {"tasks": TASKS}),
        calls(("write_file", {"path": "greet.py", "content": "print('hello')\n"}),
              ("run", {"command": "cd /mnt/project && python3 greet.py"}),
              ("update_task", {"id": 1, "status": "done"})),
        calls(("update_task", {"id": 2, "status": "in_progress"}),
              ("run", {"command": "echo task 2 starts"})),
        host_dies,
        # --- on the other host, in mode "rerun": the plan again, task 1 done at once ---
        call("plan_tasks", {"tasks": TASKS}),
        calls(("update_task", {"id": 1, "status": "done", "note": "greet.py came with the checkpoint"}),
              ("update_task", {"id": 2, "status": "in_progress"}),
              ("run", {"command": "cd /mnt/project && python3 greet.py"}),
              ("write_file", {"path": "names.txt", "content": "ada\n"}),
              ("update_task", {"id": 2, "status": "done"})),
        call("finish", {"summary": "greet.py greets, names.txt names ada",
                        "verification": {"command": LOST_CHECK, "expect_exit": 0}}),
    ])
    job_id = f.submit(LOST_TASK, project=LOST_PROJECT)

    assert asked.wait(JOB_S), f"the job never reached task 2\n{f.tail(job_id)}"
    first = f.host_file(job_id)["host"]
    first_session = f.job(job_id)["session_id"]
    assert f.hosts[first].has_session(first_session)
    # Task 1's checkpoint is on Gitea, and the service holds the transcript up to task 2's start.
    until(lambda: "Task 1 done: write greet.py" in f.pushed_subjects(LOST_PROJECT), 60, "task 1's checkpoint pushed")
    until(lambda: "task 2 starts" in (f.job_dir(job_id) / "transcript.json").read_text(), 30,
          "the transcript of task 2's start at the service")
    destroyed = f.lose(first)
    lost.set()
    assert destroyed == [f"vmagent-{first_session}"], destroyed

    done = f.wait(job_id, "done", timeout=JOB_S)
    assert done["verification_passed"] is True, done.get("report")
    [second] = [name for name in f.hosts if name != first]
    second_session = done["session_id"]
    assert second_session != first_session and f.hosts[second].has_session(second_session)

    # The job said where it ran and that the first host was lost; host.json keeps both runs.
    statuses = f.statuses(job_id)
    assert f"running on host {first}" in statuses and f"running on host {second}" in statuses, statuses
    assert any(s.startswith(f"host {first} lost") for s in statuses), statuses
    where = f.host_file(job_id)
    assert where["host"] == second and [run["host"] for run in where["runs"]][:1] == [first], where
    assert where["runs"][0]["why"].startswith("lost"), where
    # The model heard it in the rerun, with the checkpoint it carries on from.
    assert any("a new machine has the project as of 'Task 1 done: write greet.py'" in text
               for body in f.models.requests[LOST_TASK] for text in user_texts(body))
    # greet.py reached the second host's guest from Gitea: it was never written there.
    record = f.hosts[second].record(second_session)
    assert not [e for e in record if e.get("verb") == "write_file" and e["args"].get("path") == "greet.py"]

    # Gitea holds the work of both hosts: the first host's checkpoint with greet.py, then the
    # second host's commits with names.txt on top of it.
    subjects = f.pushed_subjects(LOST_PROJECT)
    assert subjects[0] == "Task 1 done: write greet.py", subjects
    assert "Task 2 done: write names.txt and check both" in subjects[1:], subjects
    first_commit = f.git(LOST_PROJECT, "rev-list", "--reverse", "main").split()[0]
    shown = f.git(LOST_PROJECT, "show", "--name-only", "--format=%B", first_commit)
    assert "greet.py" in shown and f"vmagent session {first_session}" in shown, shown
    bodies = f.git(LOST_PROJECT, "log", "--format=%B", "main")
    assert f"vmagent session {second_session}" in bodies
    assert f.git(LOST_PROJECT, "show", "main:greet.py") == "print('hello')\n"
    assert f.git(LOST_PROJECT, "show", "main:names.txt") == "ada\n"
    until(lambda: not f.guests(), 60, "no guest left on the remaining host")
