"""`vmagent run` as a person uses it: a subprocess, a vmd on a socket (stand-in machine),
the scripted Ollama server; live progress on stderr, the report on stdout, exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.loop_harness import call, calls, running_vmd
from tests.ollama_server import start_ollama
from tests.test_loop import finish_script

ROOT = Path(__file__).resolve().parent.parent


def vmagent(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmagent.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "VMD_", "OLLAMA_"))}
    env.update(VMAGENT_RETRIES="0", VMAGENT_RETRY_BACKOFF_S="0", **extra)
    return env


def test_run_shows_progress_prints_the_report_and_exits_0_when_verified(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama(finish_script()) as server:
        done = vmagent("run", "write hello.py", "--project", "hello", "--os", "debian",
                       env=environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url))
    assert done.returncode == 0, done.stderr + done.stdout
    assert "$ python3 hello.py" in done.stderr and "    hello" in done.stderr
    assert "[ ] 1. write hello.py" in done.stderr  # the task list when it changed
    assert done.stdout.startswith("# vmagent session ") and "✅ verified" in done.stdout


def test_run_exits_1_when_vmds_verification_fails(tmp_path):
    script = finish_script()
    script[-1] = call("finish", {"summary": "it works, trust me",
                                 "verification": {"command": "python3 hello.py | grep -q goodbye"}})
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        done = vmagent("run", "write hello.py", "--project", "hello",
                       env=environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url))
    assert done.returncode == 1
    assert "❌ verification failed" in done.stdout


def test_run_exits_2_when_vmd_is_not_there(tmp_path):
    done = vmagent("run", "anything", "--project", "p", env=environment(VMD_SOCKET=str(tmp_path / "none.sock")))
    assert done.returncode == 2
    assert "vmd is not listening at" in done.stderr and "VMD_SOCKET" in done.stderr


def test_run_exits_2_without_prompt_md(tmp_path):
    with running_vmd(tmp_path) as vmd:
        env = environment(VMD_SOCKET=vmd.socket, VMAGENT_PROMPTS=str(tmp_path))
        # the repo's own prompts are found as the fallback; hide them by running from a copy
        # of the package whose configs/agent is empty
        fake_root = tmp_path / "pkg"
        (fake_root / "configs" / "agent").mkdir(parents=True)
        shutil.copytree(ROOT / "vmagent", fake_root / "vmagent",
                        ignore=shutil.ignore_patterns("__pycache__"))
        done = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                               "from vmagent.cli import main; sys.exit(main(sys.argv[2:]))",
                               str(fake_root), "run", "anything", "--project", "p"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "prompt.md was not found" in done.stderr


def test_usage_errors_exit_2(tmp_path):
    assert vmagent("run", "--project", "p", env=environment()).returncode == 2
    assert vmagent("run", "  ", "--project", "p", env=environment()).returncode == 2
