"""The job worker as the service runs it: a process writing NDJSON frames, with the
screen watched for the live preview between the agent's own screenshots."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.loop_harness import call, calls, running_vmd
from tests.ollama_server import start_ollama

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
