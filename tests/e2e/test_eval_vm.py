"""`vmagent eval` on a real guest: two tasks of evals/ played from their reference solutions
by the scripted model, through a real `vmd serve` and real guests. What the stand-in machines
cannot show: vmd writes the hidden check's files into the guest outside the project folder
and runs them there after the job; a Python package installs offline with the guest's own pip;
a Tk window on the guest's desktop is clicked by the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.eval_player import Player
from tests.support.loop_harness import agent_config
from tests.support.ollama_server import start_ollama
from tests.support.vmd_process import VmdProcess
from vmagent.eval.runner import run_all
from vmagent.eval.scores import row_of
from vmagent.eval.tasks import load_tasks

pytestmark = pytest.mark.vm

EVALS = Path(__file__).resolve().parents[2] / "evals"
TASKS = ("pkg-textstats", "gui-tk-save-button")


def test_two_tasks_of_the_set_are_solved_and_proven_on_a_real_guest(tmp_path, debian_image):
    tasks = [t for t in load_tasks(EVALS) if t.name in TASKS]
    assert sorted(t.name for t in tasks) == sorted(TASKS)
    vmd = VmdProcess(tmp_path, debian_image.dir.parent, VMD_BOOT_TIMEOUT_S="900", VMD_VERIFY_TIMEOUT_S="300").start()
    try:
        with start_ollama([], default=Player(tasks)) as server:
            out = tmp_path / "out"
            runs = run_all(tasks, repeat=1, concurrency=1, out_dir=out,
                           config=agent_config(server, request_timeout_s=120, vmd_reconnect_s=60),
                           socket=str(vmd.socket))
        rows = {row.task: row for row in (row_of(run, out) for run in runs)}
        for name in TASKS:
            row = rows[name]
            assert (row.outcome, row.hidden, row.check) == ("done", "passed", "verified and proven"), (name, row)
        requests = "\n".join(str(body) for body in server.chat_requests)
        assert "CHECK_DIR" not in requests and "click.sh" not in requests, "the model never sees the check"
    finally:
        vmd.stop()
