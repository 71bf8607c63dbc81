"""`vmd serve` as its own process, for the tests where stopping it must be a real stop:
a restart, a SIGKILL, a client that finds it gone. Its state dir, socket and log are the
test's; settings of the fault under test come as environment variables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.vmd_fakes import ROOM_TEMPLATES, short_socket_dir
from vmagent.link import Vmd

ROOT = Path(__file__).resolve().parents[2]


class VmdProcess:
    """`vmd serve` as its own process, with the settings of the fault under test."""

    def __init__(self, work: Path, images_dir: Path, **env: str):
        self.socket = short_socket_dir() / "vmd.sock"
        self.state = work / "state"
        self.log_path = work / "vmd.log"
        self.images_dir = images_dir
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> "VmdProcess":
        env = {**os.environ, "VMD_BOOT_TIMEOUT_S": "900", "VMD_VERIFY_TIMEOUT_S": "300",
               "VMD_REAPER_INTERVAL_S": "1", "VMD_WARM_POOL_SIZE": "0",  # a test that wants a pool says so
               "VMD_ROOM_TEMPLATES_DIR": str(ROOM_TEMPLATES)}
        for name in ("VMD_CONFIG", "GITEA_URL", "GITEA_TOKEN", "VMD_STATE_DIR", "VMD_SOCKET",
                     "VMD_ORPHAN_GRACE_S", "VMD_QUESTION_KEEP_S"):
            env.pop(name, None)
        env.update(self.env)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vmd.server.cli", "serve", "--socket", str(self.socket),
                 "--state-dir", str(self.state), "--images-dir", str(self.images_dir)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "vmd serve did not listen within 60 s"
            with contextlib.suppress(OSError):
                with Vmd(self.socket, timeout=5):
                    return self
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as when the host's OOM killer takes it."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def session(self, sid: str) -> dict:
        return json.loads((self.state / "sessions" / sid / "session.json").read_text())

    def record(self, sid: str) -> list[dict]:
        path = self.state / "sessions" / sid / "record.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def repo_files(self, project: str, owner: str = "local") -> str:
        git_dir = self.state / "repos" / owner / f"{project}.git"
        return subprocess.run(["git", "--git-dir", str(git_dir), "log", "--name-only", "--format=", "main"],
                              capture_output=True, text=True, check=True).stdout
