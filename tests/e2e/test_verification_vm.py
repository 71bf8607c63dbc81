""""Done" is proof, on a real guest through `vmagent run` with a scripted model: a failed
check is work left, a check that proves nothing says so, every closed task is a
checkpoint commit, and the exit code tells the three outcomes apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.loop_harness import call, calls, tool_results
from tests.support.ollama_server import start_ollama
from tests.e2e.test_agent_vm import vmd_serve  # noqa: F401  (a fixture)

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
P = "/mnt/project"
TESTS = f"cd {P} && python3 -m unittest -q test_calc"
TREE = (f"cd {P} && find . -path ./.git -prune -o -type f -print | sort | xargs -d '\\n' sha256sum")


def vmagent_run(socket: Path, script: list, project: str, task: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "OLLAMA_"))}
    with start_ollama(script) as server:
        env.update(VMD_SOCKET=str(socket), OLLAMA_HOST=server.url, VMAGENT_RETRIES="0")
        done = subprocess.run([sys.executable, "-m", "vmagent.cli", "run", task, "--os", "debian",
                               "--project", project], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=1500)
        return done, server.chat_requests


def git_log(state: Path, project: str) -> list[str]:
    repo = state / "repos" / "local" / f"{project}.git"
    return subprocess.run(["git", "--git-dir", str(repo), "log", "--reverse", "--format=%s", "main"],
                          capture_output=True, text=True, check=True).stdout.splitlines()


def test_a_failed_check_is_work_left_and_a_real_check_is_proven_task_by_task(tmp_path, vmd_serve):
    socket, state = vmd_serve
    script = [
        call("plan_tasks", {"tasks": ["write calc.py", "write test_calc.py", "run the tests"]}),
        call("write_file", {"path": f"{P}/calc.py", "content": "def add(a, b):\n    return a - b\n"}),
        call("update_task", {"id": 1, "status": "done"}),
        call("write_file", {"path": f"{P}/test_calc.py", "content": (
            "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")}),
        call("update_task", {"id": 2, "status": "done"}),
        call("run", {"command": TESTS}),
        call("update_task", {"id": 3, "status": "done"}),
        call("finish", {"summary": "calc adds", "verification": TESTS}),  # fails: the bug
        call("write_file", {"path": f"{P}/calc.py", "content": "def add(a, b):\n    return a + b\n"}),
        call("run", {"command": TESTS}),
        call("finish", {"summary": "calc adds", "verification": TESTS}),
    ]
    done, requests = vmagent_run(socket, script, "calc", "Write calc.add with a test", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout
    report = done.stdout
    refusals = [r for req in requests for r in tool_results(req) if r.startswith("REFUSED: your verification failed")]
    assert refusals and ("FAILED" in refusals[0] or "AssertionError" in refusals[0]), refusals
    assert "verified and proven" in report.splitlines()[2], report[:500]
    assert "Attempts (2)" in report and "1. `" + TESTS + "` → exit 1" in report
    assert "fails: the check needs the work" in report
    # What the baseline run costs next to the check itself (printed for the closing figures).
    import json
    [record] = list((state / "sessions").glob("*/record.jsonl"))
    runs = [json.loads(line) for line in record.read_text().split("\n") if line.strip()]
    proven = [e for e in runs if e["kind"] == "verification" and e.get("baseline")][-1]
    print(f"\ncheck {proven['duration']:.1f} s, baseline run {proven['baseline']['duration']:.1f} s "
          f"(exit {proven['baseline']['exit_code']})")
    assert proven["baseline"]["exit_code"] not in (0, None, 125)
    # One checkpoint per closed task, in order; the candidate the second finish checked on a
    # fresh machine (the first checked the last checkpoint's files: no commit of its own);
    # then the close commit with the verification.
    assert git_log(state, "calc") == ["Task 1 done: write calc.py", "Task 2 done: write test_calc.py",
                                      "Task 3 done: run the tests", "The work as finish 2 checks it",
                                      "Write calc.add with a test"]


def test_three_failed_checks_end_the_job_failed_with_every_attempt(tmp_path, vmd_serve):
    socket, state = vmd_serve
    check = f"cd {P} && python3 app.py | grep -qx 42"
    script = [
        call("plan_tasks", {"tasks": ["write app.py"]}),
        calls(("write_file", {"path": f"{P}/app.py", "content": "print(41)\n"}),
              ("run", {"command": f"cd {P} && python3 app.py"})),
        call("update_task", {"id": 1, "status": "done"}),
        call("finish", {"summary": "prints 42", "verification": check}),
        call("finish", {"summary": "prints 42", "verification": check}),
        call("finish", {"summary": "prints 42", "verification": check}),
    ]
    done, _ = vmagent_run(socket, script, "answer", "Print 42", tmp_path)
    assert done.returncode == 1, done.stderr[-3000:] + done.stdout
    report = done.stdout
    assert "verification failed" in report.splitlines()[2]
    assert "Attempts (3)" in report
    for n in (1, 2, 3):
        assert f"{n}. `{check}` → exit 1" in report


def test_a_check_that_needs_no_work_is_refused_then_passed_not_proven(tmp_path, vmd_serve):
    socket, state = vmd_serve
    script = [
        call("plan_tasks", {"tasks": ["write notes"]}),
        calls(("write_file", {"path": f"{P}/notes.md", "content": "# notes\n"}),
              ("write_file", {"path": f"{P}/sub/deep.txt", "content": "deep\n"})),
        call("run", {"command": f"{TREE} > /tmp/tree.before"}),
        call("update_task", {"id": 1, "status": "done"}),
        call("finish", {"summary": "done", "verification": "true"}),  # refused: proves nothing
        call("run", {"command": f"{TREE} > /tmp/tree.after; cmp /tmp/tree.before /tmp/tree.after "
                                "&& echo SAME-TREE; cat /tmp/tree.after"}),
        call("finish", {"summary": "done", "verification": f"test -d {P}"}),
    ]
    done, requests = vmagent_run(socket, script, "notes", "Write notes", tmp_path)
    assert done.returncode == 3, done.stderr[-3000:] + done.stdout
    results = [r for req in requests for r in tool_results(req)]
    assert any("also passes on the project as it was before" in r for r in results)
    # The baseline run left the guest's view of the work exactly as it was.
    assert "SAME-TREE" in done.stderr and "./sub/deep.txt" in done.stderr
    report = done.stdout
    assert "passed, not proven" in report.splitlines()[2]
    assert "Attempts (2)" in report
