"""One worker process per job, a concurrency limit with a queue, and cancel.

A worker writes NDJSON frames on its stdout. The service points that stdout at a file in
the job's folder and tails it, rather than holding a pipe: a worker then outlives a
restart of the service, and the new service re-attaches by reading on from the offset it
stored. The file is read a bounded piece at a time and a job stores a bounded number of
output lines (frames.py); everything the service and the worker write there is private
(private_files.py). A worker that ends without a `done` frame leaves a failed (or, when
cancel was asked, cancelled) job whose report is built from what is known (salvage.py) —
never one stuck running. One worker as the service sees it (its environment, its job file,
its pid) is in worker_process.py.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from vmagent.job_file import JOB_FILE, JobFile, JobFileUnreadable
from vmagent.link import VmdCall, VmdUnavailable

from .config import ServiceConfig
from .frames import FrameReader, OutputCap
from .job_vmd import JobVmd, job_vmd
from .private_files import WORKER_UMASK, open_private_append, private_dir, write_private
from .salvage import build_salvage_report
from .store import Store
from .worker_process import Worker, job_spec, pid_runs_job, worker_environment

log = logging.getLogger("vmagent.service")

OUTCOME_TO_STATE = {
    "done": "done",
    "question": "needs_input",
    "unfreeze": "needs_approval",
    "cancelled": "cancelled",
    "failed": "failed",
}
# Long lines bloat the store and the preview; a person reads the tail anyway.
MAX_LINE_CHARS = 4000
# How often a reader looks for new frames when the file has none.
TAIL_INTERVAL_S = 0.05

class WorkerPool:
    def __init__(self, store: Store, config: ServiceConfig):
        self.store = store
        self.config = config
        self._lock = threading.RLock()
        self._running: dict[str, Worker] = {}
        self._closed = False

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Re-attach to workers a previous service left running, fail the dead ones, start the queue."""
        for job in self.store.list_jobs(states=("running",), limit=100000):
            job_dir = self.store.job_dir(job["id"])
            if pid_runs_job(job["worker_pid"], job_dir):
                log.info("re-attaching to job %s (worker pid %s)", job["id"], job["worker_pid"])
                worker = Worker(job["id"], job["worker_pid"], None)
                with self._lock:
                    self._running[job["id"]] = worker
                threading.Thread(target=self._follow, args=(worker,), daemon=True,
                                 name=f"job-{job['id']}").start()
            else:
                # Read what it wrote before it died: its done frame may be there.
                worker = Worker(job["id"], job["worker_pid"] or 0, None)
                self._ingest_all(worker)
                if not worker.got_done:
                    self._fail_without_report(
                        worker, "the job service stopped while this job ran, and its worker "
                        "process is gone")
        self.pump()

    def close(self) -> None:
        """Stop following workers; they keep running and a new service re-attaches to them."""
        self._closed = True

    def running_count(self) -> int:
        with self._lock:
            return len(self._running)

    # --- queue ---------------------------------------------------------------------

    def submit(self, job: dict, *, answer: str | None = None, approved: bool | None = None,
               resume: bool = False, cancel: bool = False) -> None:
        """Write the job file for a fresh run or a resume, queue the job, start what fits."""
        job_dir = private_dir(self.store.job_dir(job["id"]))
        JobFile(job_id=job["id"], spec=job_spec(job), mode="resume" if resume else "run", cancel=cancel,
                vmd_socket=self.config.vmd_socket, answer=answer if resume else None,
                approved=approved if resume else None).write(job_dir)
        if job["state"] != "queued":
            self.store.set_state(job["id"], "queued", status_line="queued", question=None)
        if cancel:
            # Closing a suspended guest is short and must not wait behind the queue.
            self._spawn(self.store.get_job(job["id"]))
        else:
            self.pump()

    def pump(self) -> None:
        if self._closed:
            return
        with self._lock:
            for job in self.store.queued_jobs():
                if len(self._running) >= self.config.max_concurrent:
                    break
                if job["id"] in self._running:
                    continue
                self._spawn(job)

    def _spawn(self, job: dict) -> None:
        job_dir = self.store.job_dir(job["id"])
        frames_path = job_dir / "frames.ndjson"
        command = self.config.resolved_worker_command() + ["--job-dir", str(job_dir)]
        env = worker_environment(self.config)
        if self.config.executor == "ray":
            # The shim is a Ray driver: token auth and the token's place, which a local worker,
            # and the worker the shim starts on a host, never get (shipped_environment).
            env.update(self.config.ray_auth_env())
        frames = errors = None
        # A job that cannot start fails with the reason: raised, the error would end whichever
        # thread pumped, a request for some other job (a 500) or a job's follower.
        try:
            if not (job_dir / JOB_FILE).exists():
                JobFile(job_id=job["id"], spec=job_spec(job), vmd_socket=self.config.vmd_socket).write(job_dir)
            offset = frames_path.stat().st_size if frames_path.exists() else 0
            frames = open_private_append(frames_path)
            errors = open_private_append(job_dir / "worker.log")
            popen = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=frames, stderr=errors, env=env,
                # Its own session: a Ctrl-C or stop of the service does not reach it.
                start_new_session=True, umask=WORKER_UMASK,
            )
        except OSError as exc:
            why = (f"The worker command `{' '.join(command)}` failed to start: {exc}. Check "
                   "`worker_command` in the service config." if errors is not None else
                   f"The service could not write the job's files in {job_dir}: {exc}. Check that "
                   "the service's data_dir has room and belongs to the service's user.")
            self.store.set_state(job["id"], "failed", report=f"# The job could not start\n\n{why}")
            return
        finally:
            for fd in (frames, errors):
                if fd is not None:
                    os.close(fd)
        worker = Worker(job["id"], popen.pid, popen)
        with self._lock:
            self._running[job["id"]] = worker
        self.store.update_job(job["id"], worker_pid=popen.pid, frames_offset=offset)
        self.store.set_state(job["id"], "running", status_line="starting")
        threading.Thread(target=self._follow, args=(worker,), daemon=True,
                         name=f"job-{job['id']}").start()

    # --- cancel --------------------------------------------------------------------

    def cancel(self, job_id: str) -> dict | None:
        job = self.store.get_job(job_id)
        if job is None:
            return None
        with self._lock:
            worker = self._running.get(job_id)
        if worker is not None and worker.got_done:
            # Its done frame is in (the job waits for an answer, say) and it is only exiting:
            # a SIGTERM now reaches no one. Wait for the exit, then cancel by the job's state.
            worker = self._wait_exited(job_id)
            job = self.store.get_job(job_id) or job
        if worker is not None:
            worker.cancel_requested = True
            self.store.add_event(job_id, {"type": "status", "text": "cancelling"})
            self._signal(worker, signal.SIGTERM)
            timer = threading.Timer(self.config.cancel_grace_s, self._kill_if_alive, args=(worker,))
            timer.daemon = True
            timer.start()
            return self.store.get_job(job_id)
        if job["state"] == "queued" and _mode(self.store.job_dir(job_id)) != "resume":
            return self.store.set_state(job_id, "cancelled", status_line="cancelled", report=(
                f"# Job cancelled\n\nTask: {job['task']}\n\nThe job was cancelled before it "
                "started; no machine was used."))
        if job["state"] in ("needs_input", "needs_approval", "queued"):
            # A suspended guest waits: a worker resumes it with cancel set, so the loop
            # closes the session (commit + push) and writes the report.
            self.submit(job, resume=True, cancel=True)
            return self.store.get_job(job_id)
        return job

    def _wait_exited(self, job_id: str, timeout: float = 10.0) -> Worker | None:
        """The job's worker once its follower let it go (None), or still it after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                worker = self._running.get(job_id)
            if worker is None or time.monotonic() > deadline:
                return worker
            time.sleep(TAIL_INTERVAL_S)

    def _signal(self, worker: Worker, sig: int) -> None:
        try:
            os.kill(worker.pid, sig)
        except ProcessLookupError:
            pass

    def _kill_if_alive(self, worker: Worker) -> None:
        if worker.alive(self.store.job_dir(worker.job_id)):
            log.warning("job %s: worker %s ignored SIGTERM; killing it", worker.job_id, worker.pid)
            self._signal(worker, signal.SIGKILL)

    # --- frames --------------------------------------------------------------------

    def _follow(self, worker: Worker) -> None:
        job_dir = self.store.job_dir(worker.job_id)
        try:
            while not self._closed:
                read_any = self._ingest_available(worker)
                if read_any:
                    continue
                if not worker.alive(job_dir):
                    self._ingest_all(worker)
                    break
                time.sleep(TAIL_INTERVAL_S)
            if self._closed:
                return
            if worker.popen is not None:
                worker.exit_code = worker.popen.wait()
            if not worker.got_done:
                if worker.cancel_requested:
                    self._fail_without_report(worker, "it was cancelled and its worker was "
                                              "stopped before it wrote a report",
                                              state="cancelled")
                else:
                    self._fail_without_report(worker, "its worker process ended before it wrote "
                                              "a report")
        except Exception as exc:  # never leave a job running because a reader broke
            log.exception("job %s: following the worker failed", worker.job_id)
            self._fail_without_report(worker, f"the service lost track of its worker ({exc})")
        finally:
            if not self._closed:
                with self._lock:
                    self._running.pop(worker.job_id, None)
                self.pump()

    def _ingest_all(self, worker: Worker) -> None:
        """Reads to the end of what the worker wrote (it has ended)."""
        while self._ingest_available(worker):
            pass

    def _ingest_available(self, worker: Worker) -> bool:
        """Reads one bounded piece past the stored offset and handles its complete frames;
        True if any bytes were read."""
        if worker.reader is None:
            job = self.store.get_job(worker.job_id)
            if job is None:
                return False
            worker.reader = FrameReader(self.store.job_dir(worker.job_id) / "frames.ndjson",
                                        job["frames_offset"])
            worker.output = OutputCap(self.store, worker.job_id)
        before = worker.reader.offset

        def on_line(raw: bytes) -> None:
            if raw.strip():
                self._handle_frame(worker, raw)

        read_any = worker.reader.read(on_line)
        worker.output.flush()
        if worker.reader.offset != before:
            self.store.update_job(worker.job_id, frames_offset=worker.reader.offset)
        return read_any

    def _handle_frame(self, worker: Worker, raw: bytes) -> None:
        job_id = worker.job_id
        try:
            frame = json.loads(raw)
            if not isinstance(frame, dict):
                raise ValueError("not an object")
        except ValueError:
            frame = {"type": "output", "stream": "worker", "line": raw.decode(errors="replace")}
        kind = frame.get("type")
        if not worker.preview_opened:
            # The preview (status, tasks, terminal) opens with the job's first event, while
            # the machine still boots: a person sees the plan being made, not a blank chat.
            worker.preview_opened = True
            self.store.update_job(job_id, preview_ready=1)
        if worker.output is not None:
            if kind == "output":
                if not worker.output.admit():
                    return  # counted into the command's notice
            elif kind == "command":
                worker.output.next_command()
            else:  # the notice's count is final before anything after it is stored
                worker.output.flush()
        if kind == "screenshot":
            self._save_screenshot(job_id, frame)
            return
        if kind == "done":
            self._finish(worker, frame.get("outcome") or {})
            return
        for key in ("line", "text", "command"):
            value = frame.get(key)
            if isinstance(value, str) and len(value) > MAX_LINE_CHARS:
                frame[key] = value[:MAX_LINE_CHARS] + " …"
        self.store.add_event(job_id, frame)
        if kind == "status" and isinstance(frame.get("text"), str):
            counts = {}  # the loop's status lines carry its counts (the turn under way included)
            if isinstance(frame.get("turns"), int) and isinstance(frame.get("tool_calls"), int):
                counts = {"steps": frame["turns"], "tool_calls": frame["tool_calls"]}
            self.store.update_job(job_id, status_line=frame["text"], **counts)
        elif kind == "tasks" and isinstance(frame.get("text"), str):
            self.store.update_job(job_id, tasks_text=frame["text"])
        elif kind == "state" and frame.get("question"):
            self.store.update_job(job_id, question=str(frame["question"]))
        elif kind == "session" and frame.get("session_id"):
            self.store.update_job(job_id, session_id=str(frame["session_id"]))
        elif kind == "machine" and frame.get("came") in ("warm", "cold"):
            seconds = frame.get("seconds")
            self.store.update_job(job_id, machine_came=frame["came"],
                                  machine_seconds=float(seconds) if isinstance(seconds, (int, float)) else None)

    def _save_screenshot(self, job_id: str, frame: dict) -> None:
        try:
            png = base64.b64decode(frame.get("png_base64") or "", validate=False)
        except (ValueError, TypeError):
            png = b""
        if not png.startswith(b"\x89PNG"):
            self.store.add_event(job_id, {"type": "status", "text": "a screenshot arrived unreadable"})
            return
        write_private(self.store.job_dir(job_id) / "screen.png", png)
        event = {"type": "screenshot", "width": frame.get("width"), "height": frame.get("height")}
        if frame.get("kept"):
            event["kept"] = True  # the frame vmd kept as the guest paused for a person
        seq = self.store.add_event(job_id, event)
        self.store.update_job(job_id, screenshot_seq=seq)

    def _finish(self, worker: Worker, outcome: dict) -> None:
        worker.got_done = True
        job_id = worker.job_id
        state = OUTCOME_TO_STATE.get(str(outcome.get("state")), "failed")
        report = outcome.get("report") or "The job ended without a report."
        self.store.add_event(job_id, {"type": "done", "outcome": outcome})
        fields = {
            "report": report,
            "question": outcome.get("question") if state in ("needs_input", "needs_approval") else None,
            **verification_fields(outcome),
            "steps": int(outcome.get("steps") or 0),
            "tool_calls": int(outcome.get("tool_calls") or 0),
            "status_line": {"needs_input": "waiting for an answer",
                            "needs_approval": "waiting for approval"}.get(state, state),
        }
        if outcome.get("session_id"):
            fields["session_id"] = outcome["session_id"]
        if isinstance(outcome.get("push"), dict):
            fields["push_json"] = json.dumps(outcome["push"])
        self.store.set_state(job_id, state, **fields)

    def _fail_without_report(self, worker: Worker, why: str, state: str = "failed") -> None:
        job = self.store.get_job(worker.job_id)
        if job is None:
            return
        salvage = build_salvage_report(self.store, job, why, worker.exit_code, state)
        report = salvage
        if job.get("session_id"):
            # The loop never reached its own close: do it here, so the work is committed and
            # pushed, the machine does not run on, and the report is vmd's from its record.
            closed = close_session(job_vmd(self.config, self.store.job_dir(job["id"])), job["session_id"])
            if closed:
                report = closed + "\n\n---\n\n" + salvage
        self.store.set_state(worker.job_id, state, report=report, status_line=state)


def verification_fields(outcome: dict) -> dict:
    """The job's verification columns from a worker's outcome: its `verification`
    {passed, proven, attempts}, or only `verification_passed` from an older worker."""
    def flag(value) -> int | None:
        return None if value is None else int(bool(value))

    verification = outcome.get("verification")
    verification = verification if isinstance(verification, dict) else {}
    passed = verification.get("passed", outcome.get("verification_passed"))
    attempts = verification.get("attempts")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        attempts = 0 if passed is None else 1
    return {"verification_passed": flag(passed), "verification_proven": flag(verification.get("proven")),
            "verification_attempts": attempts}


def _mode(job_dir: Path) -> str | None:
    """The mode of the job's file (run, resume, rerun); None when there is none to read."""
    try:
        return JobFile.read(job_dir).mode
    except JobFileUnreadable:
        return None


def close_session(vmd: JobVmd, session_id: str) -> str | None:
    """Close a vmd session whose worker died, in the job's vmd (job_vmd.py: the service's,
    or its host's); vmd's report, or None if that vmd can't be reached or refuses."""
    calls = [VmdCall(verb="session_attach", params={"session_id": session_id}),
             VmdCall(verb="session_close"), VmdCall(verb="report")]
    try:
        answers = vmd(calls, 300, True)
    except (VmdUnavailable, OSError, ValueError) as exc:
        log.warning("could not close vmd session %s after its worker died: %s", session_id, exc)
        return None
    if len(answers) < len(calls) or answers[-1].error:
        log.warning("could not close vmd session %s after its worker died: %s", session_id,
                    next((a.error for a in answers if a.error), "vmd refused"))
        return None
    return answers[-1].result["markdown"]


def push_status(vmd: JobVmd, session_id: str) -> dict | None:
    """Where vmd's push of a closed session stands now ({state, attempts, pushed_at, ...}),
    or None when vmd cannot say: vmd retries a push Gitea could not take after the job
    ended, and the job's owner asks the service, not vmd. `vmd`: the job's (job_vmd.py)."""
    calls = [VmdCall(verb="session_attach", params={"session_id": session_id}), VmdCall(verb="session_status")]
    try:
        answers = vmd(calls, 10, True)
    except (VmdUnavailable, OSError, ValueError) as exc:
        log.info("could not ask vmd about the push of session %s: %s", session_id, exc)
        return None
    if len(answers) < len(calls) or answers[-1].error:
        log.info("could not ask vmd about the push of session %s: %s", session_id,
                 next((a.error for a in answers if a.error), "vmd refused"))
        return None
    return answers[-1].result.get("push")
