"""One job's process: `python -m vmagent.worker --job-dir DIR`.

Reads DIR/job.json (vmagent/job_file.py `JobFile`: the spec, the mode "run" | "resume" |
"rerun", a person's answer, cancel, the vmd socket, a rerun's lost host), runs the turn loop
(a fresh job, the resume of one that asked a question, or a job whose host was lost, run
again from its last checkpoint: vmagent/loop/rerun.py), and writes every event as one NDJSON frame on stdout, flushed at once. The
transcript lives at DIR/transcript.json. SIGTERM sets the cancel event: the loop breaks
off what is in flight after cancel_grace_s and ends with a report. A vmd restart is
ridden out by the loop (and by the screen watcher). Whatever happens, the last frame is
{"type": "done", "outcome": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from vmagent.job_file import JOB_FILE, JobFile, JobFileUnreadable


class FrameWriter:
    """NDJSON frames on the real stdout; anything else printed goes to stderr instead."""

    def __init__(self) -> None:
        # Keep the original stdout for frames and point fd 1 at stderr, so a stray print
        # in a library cannot corrupt the frame stream the service parses.
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._lock = threading.Lock()
        self.done_written = False

    def write(self, event: dict) -> None:
        try:
            line = json.dumps(event, default=str)
        except (TypeError, ValueError) as exc:
            line = json.dumps({"type": "status", "text": f"an event could not be encoded: {exc}"})
        with self._lock:
            if event.get("type") == "done":
                if self.done_written:
                    return
                self.done_written = True
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):
                pass  # the service went away; the job goes on and its record stays in vmd


# How long the job's end waits for the watcher's last look (one peek of a kept frame).
LAST_LOOK_S = 15.0


class ScreenWatcher:
    """Keeps the preview's screen live between the agent's own screenshots.

    On its own vmd connection it asks for `peek` (a look that is not a step of the
    session and not in its record) every `interval` seconds, and sends a frame only when
    the screen changed. Anything that goes wrong here only stops the watching."""

    def __init__(self, vmd_socket: str | None, emit, interval: float):
        self.vmd_socket, self.emit, self.interval = vmd_socket, emit, interval
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.last_look = False  # one more look after stop: the frame vmd kept for a person's wait

    def stop_after_last_look(self, timeout: float = LAST_LOOK_S) -> None:
        """The session waits for a person: show the frame vmd kept before it paused the guest
        (peek's `kept`), so the preview shows what the question is about, then stop. Waits
        for that look, so that it lands before the job's last frame."""
        self.last_look = True
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def watch(self, session_id: str) -> None:
        if self.interval <= 0 or self.thread is not None:
            return
        self.thread = threading.Thread(target=self._run, args=(session_id,), name="screen-watch", daemon=True)
        self.thread.start()

    def _look(self, vmd, last: str | None) -> str | None:
        """One peek; emits the screen if it changed. Returns the newest picture sent."""
        # Imported here, as the loop is: the Ray shim imports this module for its frames alone.
        from vmagent.link import VmdError, VmdUnavailable

        try:
            seen = vmd.call("peek")
        except VmdError:
            return last  # closed, or not up yet: try again next tick
        except VmdUnavailable:
            # vmd restarts: the next look opens a fresh connection and re-attaches it first
            # (vmagent/link/); the loop waits for vmd in the meantime.
            return last
        picture = seen.png_base64
        if not seen.available or not picture or picture == last:
            return last
        self.emit({"type": "screenshot", "png_base64": picture, "width": seen.width,
                   "height": seen.height, "watch": True, **({"kept": True} if seen.kept else {})})
        return picture

    def _run(self, session_id: str) -> None:
        # Imported here, as the loop is: the Ray shim imports this module for its frames alone.
        from vmagent.link import Vmd, VmdError, VmdUnavailable

        last: str | None = None
        try:
            with Vmd(self.vmd_socket) as vmd:
                vmd.call("session_attach", session_id=session_id)
                while not self.stop.wait(self.interval):
                    last = self._look(vmd, last)
                if self.last_look:
                    self._look(vmd, last)
        except (VmdUnavailable, VmdError, OSError, ValueError) as exc:
            print(f"screen watching stopped: {exc}", file=sys.stderr)


def _outcome_dict(outcome) -> dict:
    if hasattr(outcome, "model_dump"):
        return outcome.model_dump()
    return dict(outcome)


def failed_outcome(report: str) -> dict:
    return {"state": "failed", "report": report, "session_id": None, "question": None,
            "verification_passed": None,
            "verification": {"passed": None, "proven": None, "attempts": 0}, "steps": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmagent.worker")
    parser.add_argument("--job-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    frames = FrameWriter()
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, lambda *_: cancel.set())

    job_dir: Path = args.job_dir
    transcript = job_dir / "transcript.json"
    try:
        job = JobFile.read(job_dir)
    except JobFileUnreadable as exc:
        frames.write({"type": "done", "outcome": failed_outcome(
            f"# Job failed\n\nThe worker could not read {job_dir / JOB_FILE}: {exc}.")})
        return 2
    if job.cancel:
        cancel.set()
    vmd_socket = job.vmd_socket or None

    watcher = ScreenWatcher(vmd_socket, frames.write, _screen_watch_s())

    def on_event(event: dict) -> None:
        if event.get("type") == "session" and event.get("session_id"):
            watcher.watch(str(event["session_id"]))
        elif event.get("type") == "state" and event.get("state") in ("question", "unfreeze"):
            watcher.stop_after_last_look()  # waiting: the kept frame, then nothing new to watch
        elif event.get("type") in ("state", "done"):
            watcher.stop.set()  # the session is ending: nothing more to watch
        frames.write(event)

    try:
        # Imported here, not at the top: the loop pulls in the model client and more, and
        # the service must be able to start workers (and its tests run) without them.
        from vmagent import loop

        if job.mode == "rerun":
            # The job's host was lost (the Ray shim says how, vmagent/service/ray_worker.py): a
            # new session from the last pushed checkpoint, with the transcript it had; a
            # person's answer that was to resume it on that host comes along.
            outcome = loop.rerun_job(transcript, lost=job.lost, on_event=on_event, cancel=cancel,
                                     vmd_socket=vmd_socket, answer=job.answer, approved=job.approved)
        elif job.mode == "resume":
            outcome = loop.resume_job(transcript, answer=job.answer, approved=job.approved,
                                      on_event=on_event, cancel=cancel, vmd_socket=vmd_socket)
        else:
            outcome = loop.run_job(job.spec, on_event=on_event, cancel=cancel,
                                   transcript_path=transcript, vmd_socket=vmd_socket)
        watcher.stop.set()
        frames.write({"type": "done", "outcome": _outcome_dict(outcome)})
        return 0
    except BaseException as exc:  # every exit produces a result
        detail = "".join(traceback.format_exception(exc))
        print(detail, file=sys.stderr)
        frames.write({"type": "done", "outcome": failed_outcome(
            "# Job failed\n\nThe worker stopped on an error before the loop could write its "
            f"report: {type(exc).__name__}: {exc}\n\nThe full traceback is in the job's worker.log.")})
        return 1


def _screen_watch_s() -> float:
    """The live preview's interval from the agent's config (vmagent/config.py)."""
    # Imported here, as the loop is: the Ray shim imports this module for its frames alone.
    from vmagent.config import AgentConfig, ConfigError

    try:
        return AgentConfig.load().screen_watch_s
    except ConfigError:  # the loop loads the config again and reports what is wrong with it
        return AgentConfig().screen_watch_s


if __name__ == "__main__":
    sys.exit(main())
