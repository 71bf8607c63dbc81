"""`JobHost`: the Ray actor that runs one job's worker on the vmd host Ray placed it on.

The job service's shim (vmagent/service/ray_worker.py) creates it holding one `vm_slot`,
hands it the job's job.json and last transcript (`start`), and long-polls its frames
(`read`). On the host it runs the very worker the local executor runs (`python -m
vmagent.worker --job-dir DIR`) in a private folder of its own, against this host's vmd
(the node's `vmagent-vmd-socket` label). The worker dies with the actor's process
(PR_SET_PDEATHSIG): a host that drops out of Ray leaves no worker driving its guest, so a
re-run elsewhere is the only one working on the job.

The class is plain Python; vmagent/fleet/placement.py makes it a Ray actor (threaded, so
`read` long-polls while `cancel` still gets through), which keeps Ray out of every import
the service makes without the "ray" executor.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from vmagent.job_file import JobFile
from vmagent.link import Vmd

from .host_labels import HostLabels, MissingHostLabels, vmagent_version

# Transcript snapshots go back at most this often while the job runs (and always at its end):
# the loop saves after every step, and a transcript grows to megabytes.
TRANSCRIPT_EVERY_S = 2.0
# One `read` answers at most about this many bytes of frames (a screenshot frame is ~1 MB).
READ_BYTES = 8 * 1024 * 1024
# What a failed worker's report quotes from its stderr.
LOG_TAIL_CHARS = 3000
PR_SET_PDEATHSIG = 1
# vmd answers host_info from its own state in milliseconds (as hosts.VMD_WAIT_S): a vmd that
# takes longer is stuck, and the host unusable for a job now.
VMD_WAIT_S = 3.0


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL when the thread that started it goes away (the
    actor's process dies with its host). Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class JobHost:
    def __init__(self) -> None:
        import ray

        context = ray.get_runtime_context()
        self.node_id: str = context.get_node_id()
        self.labels: HostLabels | None = None
        self.label_problem: str | None = None
        try:
            self.labels = HostLabels.from_labels(context.get_node_labels())
        except MissingHostLabels as exc:
            # Said through where(), not raised: a raise here reads to the shim as a lost host.
            self.label_problem = str(exc)
        self.job_dir: Path | None = None
        self.popen: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.start_problem: str | None = None
        self._frames: list[str] = []
        self._base = 0  # the cursor of _frames[0]: frames the shim has are dropped
        self._ended = False
        self._cond = threading.Condition()
        self._sent_mtime: float | None = None
        self._sent_at = 0.0

    # --- called by the shim ----------------------------------------------------------

    def where(self) -> dict:
        """Where the actor runs and whether a job can run there: the shim compares the
        version with its own, and takes any problem as "this host is unusable" (its labels,
        or its vmd not answering at the labelled socket)."""
        problem = self.label_problem
        if problem is None and self.labels is not None:
            problem = _vmd_problem(self.labels.vmd_socket)
        return {"node_id": self.node_id, "host": self.labels.host if self.labels else None,
                "vmd_socket": self.labels.vmd_socket if self.labels else None,
                "vmagent_version": vmagent_version(), "problem": problem}

    def start(self, job: dict, transcript_text: str | None, worker_command: list[str] | None,
              env: dict[str, str]) -> dict:
        """Writes the job's folder on this host and starts its worker in a thread that lives
        as long as the worker (PR_SET_PDEATHSIG follows the thread that forked)."""
        if self.labels is None:
            raise MissingHostLabels(self.label_problem or "no host labels")
        self.job_dir = Path(tempfile.mkdtemp(prefix="vmagent-job-"))  # 0700
        JobFile.model_validate({**job, "vmd_socket": self.labels.vmd_socket}).write(self.job_dir)
        if transcript_text is not None:
            _write(self.job_dir / "transcript.json", transcript_text)
            self._sent_mtime = _mtime(self.job_dir / "transcript.json")
        command = list(worker_command or [sys.executable, "-m", "vmagent.worker"])
        command += ["--job-dir", str(self.job_dir)]
        env = {key: value for key, value in env.items() if key != "VMD_SOCKET"}
        env.update({"VMD_SOCKET": self.labels.vmd_socket, "PYTHONUNBUFFERED": "1"})
        started = threading.Event()
        threading.Thread(target=self._run, args=(command, env, started), daemon=True,
                         name="job-worker").start()
        started.wait(30)
        return {"job_dir": str(self.job_dir), "pid": self.popen.pid if self.popen else None,
                "problem": self.start_problem}

    def read(self, cursor: int, wait_s: float = 1.0) -> dict:
        """Frames from `cursor` on (waiting up to wait_s for one), the transcript when it
        changed, and whether the worker ended and every frame was handed over."""
        deadline = time.monotonic() + max(0.0, wait_s)
        with self._cond:
            # What the shim acknowledged by asking from `cursor` is not kept any longer.
            drop = min(max(0, cursor - self._base), len(self._frames))
            del self._frames[:drop]
            self._base += drop
            while not self._frames and not self._ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            frames, size = [], 0
            for line in self._frames:
                if frames and size + len(line) > READ_BYTES:
                    break
                frames.append(line)
                size += len(line)
            ended = self._ended and len(frames) == len(self._frames)
        answer = {"frames": frames, "cursor": self._base + len(frames), "ended": ended,
                  "transcript": self._transcript(final=ended)}
        if ended:
            answer.update(exit_code=self.exit_code, log_tail=self._log_tail(),
                          problem=self.start_problem)
        return answer

    def cancel(self) -> bool:
        """SIGTERM to the worker: the loop breaks off and writes its report."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            return True
        return False

    def cleanup(self) -> None:
        """The shim has everything: stop a worker still running and remove the folder."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
        if self.job_dir is not None:
            shutil.rmtree(self.job_dir, ignore_errors=True)

    # --- on this host ----------------------------------------------------------------

    def _run(self, command: list[str], env: dict[str, str], started: threading.Event) -> None:
        assert self.job_dir is not None
        try:
            with open(self.job_dir / "worker.log", "ab") as log:
                self.popen = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                    env=env, cwd=self.job_dir, umask=0o077, start_new_session=True,
                    preexec_fn=_die_with_parent)
        except OSError as exc:
            self.start_problem = f"the worker command `{' '.join(command)}` failed to start: {exc}"
            with self._cond:
                self._ended = True
                self._cond.notify_all()
            started.set()
            return
        started.set()
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            if not line.strip():
                continue
            with self._cond:
                self._frames.append(line)
                self._cond.notify_all()
        self.exit_code = self.popen.wait()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def _transcript(self, final: bool) -> str | None:
        if self.job_dir is None:
            return None
        path = self.job_dir / "transcript.json"
        mtime = _mtime(path)
        now = time.monotonic()
        if mtime is None or mtime == self._sent_mtime:
            return None
        if not final and now - self._sent_at < TRANSCRIPT_EVERY_S:
            return None
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return None
        self._sent_mtime, self._sent_at = mtime, now
        return text

    def _log_tail(self) -> str:
        if self.job_dir is None:
            return ""
        try:
            text = (self.job_dir / "worker.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL_CHARS:]


def _vmd_problem(vmd_socket: str) -> str | None:
    """Why this host's vmd cannot take a job (no socket there, or no answer to host_info
    within VMD_WAIT_S); None when it answered."""
    try:
        with Vmd(vmd_socket, timeout=VMD_WAIT_S) as vmd:
            vmd.call("host_info")
    except Exception as exc:  # VmdUnavailable, VmdError, OSError: said, not raised
        return f"its vmd did not answer host_info at {vmd_socket}: {' '.join(str(exc).split())[:300]}"
    return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
