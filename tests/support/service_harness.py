"""Runs the job service as a real process on a free port, for tests over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vmd.projects.repository import repository_path

REPO = Path(__file__).resolve().parents[2]
SCRIPTED_WORKER = [sys.executable, str(REPO / "tests" / "support" / "scripted_worker.py")]
REAL_WORKER = [sys.executable, "-m", "vmagent.worker"]

ALICE, BOB, SERVICE = "alice-token", "bob-token", "openwebui-service-token"


def uses_scripted_worker(test):
    """Marks a test that runs tests/support/scripted_worker.py as its job process; it switches to
    REAL_WORKER once the loop, tests/support/ollama_server.py and vmd can run jobs in the suite."""
    test.uses_scripted_worker = True
    return test


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    def __init__(self, data_dir: Path, worker_command: list[str] | None = None,
                 env: dict[str, str] | None = None, log_level: str = "warning", **settings):
        self.data_dir = Path(data_dir)
        self.extra_env = dict(env or {})
        self.log_level = log_level
        self.port = free_port()
        self.config = {
            "data_dir": str(self.data_dir), "host": "127.0.0.1", "port": self.port,
            "tokens": {ALICE: "alice", BOB: "bob"}, "service_token": SERVICE, "operators": ["alice"],
            "max_concurrent": 2, "worker_command": worker_command or SCRIPTED_WORKER,
            **settings,
        }
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServiceProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.data_dir / "service.json"
        config_path.write_text(json.dumps(self.config))
        # The environment would override the config file (VMD_SOCKET, VMD_STATE_DIR, tokens).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VMAGENT_", "OLLAMA_", "VMD_"))}
        env.update(self.extra_env)
        log = open(self.data_dir / "service.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "vmagent.service", "--config", str(config_path),
                                      "--log-level", self.log_level],
                                     cwd=REPO, env=env, stdout=log, stderr=log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {(self.data_dir / 'service.log').read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the service did not come up in 20 s")

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self, token: str = ALICE, headers: dict | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=15,
                            headers={"Authorization": f"Bearer {token}", **(headers or {})})


def vmd_project_repo(state_dir: Path, owner: str, project: str,
                     commits: list[tuple[str, dict[str, str]]]) -> Path:
    """vmd's bare repository of `owner/project` under `state_dir` (where the service reads a
    job's history), built with git from `commits`: (message, {path: text}) each, on main."""
    repo = repository_path(state_dir, owner, project)
    repo.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        git = lambda *args: subprocess.run(["git", "-C", work, *args], check=True, capture_output=True)
        git("init", "-q", "-b", "main")
        for message, files in commits:
            for path, text in files.items():
                (Path(work) / path).parent.mkdir(parents=True, exist_ok=True)
                (Path(work) / path).write_text(text)
            git("add", "-A")
            git("-c", "user.name=vmd", "-c", "user.email=vmd@localhost", "commit", "-qm", message)
        subprocess.run(["git", "clone", "-q", "--bare", work, str(repo)], check=True, capture_output=True)
    return repo


def real_worker_env(ollama_url: str) -> dict[str, str]:
    """What the real worker's AgentConfig reads: the scripted Ollama, no retries, short waits."""
    return {"OLLAMA_HOST": ollama_url, "VMAGENT_MODEL": "qwen3:32b", "VMAGENT_RETRIES": "0",
            "VMAGENT_RETRY_BACKOFF_S": "0", "VMAGENT_REQUEST_TIMEOUT_S": "20"}


def wait_for_state(client: httpx.Client, job_id: str, states: set[str] | str, timeout: float = 30) -> dict:
    wanted = {states} if isinstance(states, str) else set(states)
    deadline = time.time() + timeout
    job = {}
    while time.time() < deadline:
        job = client.get(f"/jobs/{job_id}").json()
        if job.get("state") in wanted:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stayed {job.get('state')!r}, wanted {wanted}: {job}")


def stop_workers(svc: ServiceProcess) -> None:
    """Workers outlive the service by design; a test cleans up the ones it started."""
    db = svc.data_dir / "jobs.sqlite3"
    if not db.exists():
        return
    with sqlite3.connect(db) as conn:
        pids = [r[0] for r in conn.execute("SELECT worker_pid FROM jobs WHERE worker_pid IS NOT NULL")]
    for pid in pids:
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if str(svc.data_dir).encode() in cmdline:
            os.kill(pid, signal.SIGKILL)
