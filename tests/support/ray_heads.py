"""A Ray head on 127.0.0.1 started the way a person starts one, for the auth tests
(tests/vmagent/fleet/test_ray_auth.py): `vmagent ray-node head` (token auth, its token made at first
start) or a bare `ray start --head` without auth (an open cluster, as Ray 2.60 starts one
by default). Each head runs in a process session of its own with its own RAY_TMPDIR, and is
stopped by killing every process whose command line names that folder: Ray's daemons,
whatever session they put themselves in (never `ray stop`, which stops every Ray on the
machine)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tests.support.service_harness import REPO, free_port

STARTED_WITHIN_S = 90


@dataclass
class Head:
    address: str
    temp_dir: Path
    log: Path
    proc: subprocess.Popen

    def logs_text(self) -> str:
        """Everything the head and Ray's daemons logged so far (the command's own output and
        Ray's session logs)."""
        parts = [self.log.read_text(errors="replace")]
        for path in self.temp_dir.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.suffix in (".log", ".out", ".err", ".txt", ""):
                with contextlib.suppress(OSError):
                    parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(extra)
    return env


def _wait_started(head: Head) -> None:
    host, _, port = head.address.rpartition(":")
    deadline = time.monotonic() + STARTED_WITHIN_S
    import socket

    while time.monotonic() < deadline:
        if head.proc.poll() is not None:
            raise AssertionError(f"the head exited ({head.proc.returncode}):\n{head.log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            socket.create_connection((host, int(port)), timeout=1).close()
            # The GCS takes connections before the head's raylet has registered.
            if "Ray runtime started" in head.log.read_text(errors="replace"):
                return
        time.sleep(0.5)
    raise AssertionError(f"the head did not start within {STARTED_WITHIN_S} s:\n{head.log.read_text()[-3000:]}")


def stop_processes_under(folder: Path) -> None:
    """SIGKILL to every process whose command line names `folder` (this test's own Ray)."""
    mark = str(folder).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if mark in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


@contextlib.contextmanager
def _running(command: list[str], env: dict[str, str], temp_dir: Path, address: str) -> Iterator[Head]:
    log = temp_dir / "head.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=REPO, start_new_session=True)
    head = Head(address, temp_dir, log, proc)
    try:
        _wait_started(head)
        yield head
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        stop_processes_under(temp_dir)


@contextlib.contextmanager
def vmagent_head(token_file: Path) -> Iterator[Head]:
    """`vmagent ray-node head --address 127.0.0.1` with its token at `token_file`."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-h-", dir="/tmp"))  # short: Ray's sockets live under it
    port = free_port()
    try:
        command = [sys.executable, "-m", "vmagent.cli", "ray-node", "head", "--address", "127.0.0.1",
                   "--port", str(port), "--token-file", str(token_file), "--object-store-mb", "80"]
        with _running(command, _clean_env(RAY_TMPDIR=str(temp_dir), HOME=str(temp_dir)), temp_dir,
                      f"127.0.0.1:{port}") as head:
            yield head
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def open_head() -> Iterator[Head]:
    """A head as `ray start --head` makes one with RAY_AUTH_MODE=disabled: no token asked."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-o-", dir="/tmp"))
    port = free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    try:
        command = [ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                   "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats",
                   f"--object-store-memory={80 * 1024 * 1024}"]
        env = _clean_env(RAY_TMPDIR=str(temp_dir), HOME=str(temp_dir), RAY_AUTH_MODE="disabled",
                         RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        with _running(command, env, temp_dir, f"127.0.0.1:{port}") as head:
            yield head
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
