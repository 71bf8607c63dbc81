"""`vmagent run` as a person uses it: a subprocess, a vmd on a socket (stand-in machine),
the scripted Ollama server; live progress on stderr, the report on stdout, exit codes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.loop_harness import call, running_vmd
from tests.support.ollama_server import start_ollama, unused_port
from tests.support.openai_server import start_openai
from tests.vmagent.loop.test_loop import finish_script
from vmagent.cli import exit_code
from vmagent.loop import Outcome, Verification

ROOT = Path(__file__).resolve().parents[2]


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
    assert done.stdout.startswith("# vmagent session ") and "✅ verified and proven" in done.stdout


def test_run_speaks_to_an_openai_compatible_server_chosen_by_the_environment(tmp_path):
    key = "sk-cli-test-key"
    with running_vmd(tmp_path) as vmd, start_openai(finish_script(), key=key, model_name="served") as server:
        done = vmagent("run", "write hello.py", "--project", "hello", "--model", "served",
                       env=environment(VMD_SOCKET=vmd.socket, VMAGENT_MODEL_API="openai",
                                       VMAGENT_MODEL_URL=server.base_url, VMAGENT_MODEL_KEY=key))
    assert done.returncode == 0, done.stderr + done.stdout
    assert "✅ verified and proven" in done.stdout and server.script_done
    assert key not in done.stdout + done.stderr


def test_run_exits_2_before_any_machine_when_the_model_server_is_not_there(tmp_path):
    url = f"http://127.0.0.1:{unused_port()}/v1"
    with running_vmd(tmp_path) as vmd:
        done = vmagent("run", "anything", "--project", "p",
                       env=environment(VMD_SOCKET=vmd.socket, VMAGENT_MODEL_API="openai", VMAGENT_MODEL_URL=url))
        assert vmd.machines.machines == {}  # no machine was asked for
    assert done.returncode == 2, done.stderr
    assert f"Could not reach the model server at {url}" in done.stderr and "VMAGENT_MODEL_URL" in done.stderr


def test_run_exits_1_when_vmds_verification_fails(tmp_path):
    # A failed check is refused and the agent goes on; the third failure ends the job failed.
    script = finish_script()
    script[-1:] = [call("finish", {"summary": "it works, trust me",
                                   "verification": {"command": f"python3 hello.py | grep -q goodbye{n}"}})
                   for n in range(3)]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        done = vmagent("run", "write hello.py", "--project", "hello",
                       env=environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url))
    assert done.returncode == 1, done.stderr + done.stdout
    assert "❌ verification failed" in done.stdout.splitlines()[2]
    assert "state: failed" in done.stderr


def test_run_exits_3_when_the_check_passes_but_proves_nothing(tmp_path):
    # `python3 --version` passes on the project as it was before the job too: refused once,
    # then the job ends passed, not proven.
    script = finish_script()
    script[-1:] = [call("finish", {"summary": "done", "verification": {"command": "python3 --version"}})] * 2
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        done = vmagent("run", "write hello.py", "--project", "hello",
                       env=environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url))
    assert done.returncode == 3, done.stderr + done.stdout
    assert "passed, not proven" in done.stdout.splitlines()[2]
    assert "state: done" in done.stderr


@pytest.mark.parametrize("state, passed, proven, code", [
    ("done", True, True, 0),
    ("done", True, False, 3),
    ("done", True, None, 3),  # vmd could not run the check on the baseline: not proven
    ("failed", False, None, 1),
    ("done", None, None, 1),
    ("cancelled", None, None, 1),
    ("question", None, None, 1),
])
def test_the_exit_code_follows_vmds_verdict(state, passed, proven, code):
    outcome = Outcome(state=state, report="", session_id=None, question=None, verification_passed=passed,
                      verification=Verification(passed=passed, proven=proven, attempts=1), steps=1)
    assert exit_code(outcome) == code


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


def test_the_guest_defaults_to_the_default_os_setting(monkeypatch):
    from tests.support.vmd_fakes import short_socket_dir
    from vmagent import cli, loop

    top = short_socket_dir()
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(top / "vmd.sock"))
    listening.listen(4)
    for name in [k for k in os.environ if k.startswith(("VMAGENT_", "VMD_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VMD_SOCKET", str(top / "vmd.sock"))
    monkeypatch.setenv("VMD_DEFAULT_OS", "ubuntu")
    asked = []

    def run_job(spec, **_):
        asked.append(spec.os)
        return Outcome(state="done", report="report", session_id=None, question=None, verification_passed=True,
                       verification=Verification(passed=True, proven=True, attempts=1), steps=1)

    monkeypatch.setattr(loop, "run_job", run_job)
    try:
        with start_ollama([]) as model_server:  # `vmagent run` asks it for the model first
            monkeypatch.setenv("OLLAMA_HOST", model_server.url)
            assert cli.main(["run", "anything", "--project", "p"]) == 0
            assert cli.main(["run", "anything", "--project", "p", "--os", "debian"]) == 0
    finally:
        listening.close()
        shutil.rmtree(top, ignore_errors=True)
    assert asked == ["ubuntu", "debian"], "VMD_DEFAULT_OS when --os is not given"
