"""End to end on a real guest, the way a person runs it: `vmd serve` and `vmagent run` as
processes, the model played by a scripted server: Ollama's protocol, or an OpenAI-compatible
one (VMAGENT_MODEL_API=openai: tests/support/openai_server.py, the stream shaped as vLLM's and
llama.cpp's).

The agent plans while the guest boots, writes and runs code in the project, has its
first finish refused while a task is open, recovers, finishes; vmd re-runs the check,
commits and pushes (to the local bare repository, no Gitea configured), and the report
printed by `vmagent run` carries the commit and vmd's exit code."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.loop_harness import call, calls, tool_results
from tests.support.ollama_server import start_ollama
from tests.support.openai_server import start_openai
from tests.support.vmd_fakes import short_socket_dir

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
CHECK = "cd /mnt/project && python3 greet.py | grep -qx 'hello from the guest'"

SCRIPT = [
    call("plan_tasks", {"tasks": ["write greet.py", "check that it prints the greeting"]},
         content="Planning while the machine boots."),
    calls(("update_task", {"id": 1, "status": "in_progress"}),
          ("write_file", {"path": "/mnt/project/greet.py", "content": "print('hello from the guest')\n"})),
    call("run", {"command": "cd /mnt/project && python3 greet.py && uname -s"}),
    call("finish", {"summary": "greet.py prints the greeting", "verification": {"command": CHECK}}),
    calls(("update_task", {"id": 1, "status": "done", "note": "written"}),
          ("update_task", {"id": 2, "status": "done", "note": "python3 greet.py printed it"})),
    call("finish", {"summary": "greet.py prints the greeting", "verification": CHECK}),
]


@pytest.fixture
def vmd_serve(tmp_path, debian_image):
    socket = short_socket_dir() / "vmd.sock"
    state = tmp_path / "state"
    env = {**os.environ, "VMD_BOOT_TIMEOUT_S": "900", "VMD_VERIFY_TIMEOUT_S": "300"}
    for name in ("VMD_CONFIG", "GITEA_URL", "GITEA_TOKEN"):
        env.pop(name, None)
    log = open(tmp_path / "vmd.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "vmd.server.cli", "serve", "--socket", str(socket),
                             "--state-dir", str(state), "--images-dir", str(debian_image.dir.parent)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not socket.exists():
        assert proc.poll() is None, (tmp_path / "vmd.log").read_text()
        assert time.monotonic() < deadline, "vmd serve did not listen within 30 s"
        time.sleep(0.1)
    yield socket, state
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@contextlib.contextmanager
def scripted_model(api: str):
    """The scripted model server and the settings that choose it."""
    if api == "ollama":
        with start_ollama(SCRIPT) as server:
            yield server, {"OLLAMA_HOST": server.url}
    else:
        with start_openai(SCRIPT) as server:
            yield server, {"VMAGENT_MODEL_API": "openai", "VMAGENT_MODEL_URL": server.base_url,
                           "VMAGENT_MODEL": server.model_name}


@pytest.mark.parametrize("api", ["ollama", "openai"])
def test_vmagent_run_on_a_real_guest(tmp_path, vmd_serve, api):
    socket, state = vmd_serve
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "OLLAMA_"))}
    with scripted_model(api) as (server, settings):
        env.update(VMD_SOCKET=str(socket), VMAGENT_RETRIES="0", **settings)
        done = subprocess.run([sys.executable, "-m", "vmagent.cli", "run", "Add greet.py that prints a greeting",
                               "--os", "debian", "--project", "greeting", "--transcript",
                               str(tmp_path / "transcript.json")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout
    report = done.stdout

    # planned while the guest booted: the plan is in the record before the machine was ready
    session_id = json.loads((tmp_path / "transcript.json").read_text())["session_id"]
    record = [json.loads(line) for line in
              (state / "sessions" / session_id / "record.jsonl").read_text().splitlines()]
    kinds = [(e["kind"], e.get("event") or e.get("verb")) for e in record]
    assert kinds.index(("verb", "plan_tasks")) < kinds.index(("machine", "ready"))

    # commands ran in the guest and their output came live
    assert "$ cd /mnt/project && python3 greet.py && uname -s" in done.stderr
    assert "hello from the guest" in done.stderr and "Linux" in done.stderr
    # the first finish was refused while a task was open; the loop recovered
    after_refusal = server.chat_requests[4]
    assert any(r.startswith("REFUSED: tasks still open") for r in tool_results(after_refusal))

    # vmd's own re-run decides; the commit is pushed; the report says so
    assert "✅ verified" in report and "exit code **0**" in report and CHECK in report
    project = state / "projects" / "local" / "greeting"
    assert (project / "greet.py").read_text() == "print('hello from the guest')\n"
    bare = state / "repos" / "local" / "greeting.git"
    head = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "main"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert head[:12] in report and str(bare) in report and "`A greet.py`" in report
