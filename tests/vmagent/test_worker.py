"""The job worker as the service runs it: a process writing NDJSON frames, with the
screen watched for the live preview between the agent's own screenshots."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.loop_harness import call, calls, running_vmd
from tests.support.ollama_server import start_ollama

SCRIPT = [
    call("plan_tasks", {"tasks": ["wait a moment"]}),
    call("run", {"command": "sleep 2; echo waited > waited.txt"}),
    call("update_task", {"id": 1, "status": "done", "note": "waited"}),
    # A check that needs the work: vmd refuses one that also passes on the project before.
    call("finish", {"summary": "waited", "verification": {"command": "grep -qx waited waited.txt"}}),
]


def run_worker(tmp_path, vmd, server, watch_s: str) -> list[dict]:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({
        "spec": {"task": "wait a moment", "project": "waiting"}, "mode": "run", "vmd_socket": vmd.socket}))
    env = dict(os.environ, OLLAMA_HOST=server.url, VMAGENT_MODEL="qwen3:32b", VMAGENT_RETRIES="0",
               VMAGENT_SCREEN_WATCH_S=watch_s)
    done = subprocess.run([sys.executable, "-m", "vmagent.worker", "--job-dir", str(job_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_screen_is_watched_between_the_agents_own_screenshots(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(list(SCRIPT)) as server:
        frames = run_worker(tmp_path, vmd, server, watch_s="0.2")
        session_id = next(f["session_id"] for f in frames if f["type"] == "session")
        record = vmd.record(session_id)
    watched = [f for f in frames if f["type"] == "screenshot"]
    assert watched and all(f.get("watch") for f in watched)  # the agent never took one
    assert watched[0]["png_base64"]
    # Only changes are sent: the stand-in screen never changes, so one frame, not ten.
    assert len(watched) == 1
    assert frames[-1]["type"] == "done" and frames[-1]["outcome"]["state"] == "done"
    assert not any(e.get("verb") == "peek" for e in record)  # looks are not in the record


def test_watching_can_be_turned_off(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(list(SCRIPT)) as server:
        frames = run_worker(tmp_path, vmd, server, watch_s="0")
    assert not [f for f in frames if f["type"] == "screenshot"]
    assert frames[-1]["outcome"]["state"] == "done"


def test_a_job_file_that_is_not_one_ends_the_worker_with_a_report_that_says_why(tmp_path):
    # The worker reads job.json through its one reader (vmagent/job_file.py): a file without
    # a spec is refused there, with the field, before any model or vmd is asked.
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({"mode": "run", "vmd_socket": str(tmp_path / "none.sock")}))
    done = subprocess.run([sys.executable, "-m", "vmagent.worker", "--job-dir", str(job_dir)],
                          capture_output=True, text=True, timeout=60)
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 2 and [f["type"] for f in frames] == ["done"]
    report = frames[0]["outcome"]["report"]
    assert frames[0]["outcome"]["state"] == "failed"
    assert f"could not read {job_dir / 'job.json'}" in report and "spec" in report and "Field required" in report


def test_the_job_file_is_written_whole_and_private_and_read_back_as_written(tmp_path):
    from vmagent.job_file import JobFile, JobSpec

    written = JobFile(job_id="j1", spec=JobSpec(task="t", project="p", web=False), mode="resume",
                      answer="yes", approved=True, vmd_socket="/run/vmd/a.sock")
    written.write(tmp_path)
    assert (tmp_path / "job.json").stat().st_mode & 0o777 == 0o600
    assert JobFile.read(tmp_path) == written
    # A field a newer service added is left aside, not refused (a cluster upgraded host by host).
    (tmp_path / "job.json").write_text(json.dumps({**json.loads((tmp_path / "job.json").read_text()), "new": 1}))
    assert JobFile.read(tmp_path) == written


def test_only_the_job_file_module_names_the_job_file():
    # job.json was written in two places and read in three, each with its own idea of its
    # fields; now one model reads and writes it (vmagent/job_file.py) and no other module of
    # vmagent names the file (docstrings aside).
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "vmagent"
    naming = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        naming += [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and "job.json" in node.value
                   and id(node) not in docstrings]
    assert [place.split(":")[0] for place in naming] == ["job_file.py"], naming
