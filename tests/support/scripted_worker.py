"""A stand-in job worker for the service tests: same command line, job.json and frames as
`python -m vmagent.worker`, but it plays a script chosen by words in the task instead of
running the turn loop. Words: `question`, `unfreeze`, `slow`, `stubborn` (ignores SIGTERM),
`crash` (dies mid-job without a report), `not proven` (done: the check passed but also
passed on the project before), `check fails` (failed: vmd's check failed three times);
anything else finishes at once, verified and proven.

Tests that use it say so with `uses_scripted_worker`; those must move to the real worker
(`vmagent.worker` + the loop + tests/support/ollama_server.py + vmd) once they can.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import struct
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

from vmagent.job_file import JobFile


def tiny_png(width: int = 320, height: int = 200, rgb=(40, 90, 160)) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(rgb) * width
    # A light band across the middle so that a rendered page shows the image really arrived.
    band = b"\x00" + bytes((230, 230, 230)) * width
    rows = b"".join(band if height // 3 < y < 2 * height // 3 else row for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True, type=Path)
    args = parser.parse_args()
    job = JobFile.read(args.job_dir)  # the worker's own reader (vmagent/job_file.py)
    task = job.spec.task
    transcript_path = args.job_dir / "transcript.json"
    cancel = threading.Event()
    if "stubborn" in task:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    if job.cancel:
        cancel.set()

    def emit(event: dict) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    def outcome(state: str, report: str, **extra) -> None:
        verified = extra.get("verified")
        verification = extra.get("verification") or {
            "passed": verified, "proven": True if verified else None, "attempts": 0 if verified is None else 1}
        emit({"type": "done", "outcome": {"state": state, "report": report,
                                           "session_id": extra.get("session_id", "sess-1"),
                                           "question": extra.get("question"),
                                           "verification_passed": verification["passed"],
                                           "verification": verification,
                                           "steps": extra.get("steps", 3)}})

    if job.mode == "resume":
        saved = json.loads(transcript_path.read_text())
        if cancel.is_set():
            outcome("cancelled", f"# Job cancelled\n\nCancelled while waiting. boot_id={saved['boot_id']}")
            return 0
        emit({"type": "status", "text": "resumed"})
        emit({"type": "speech", "text": f"Carrying on with answer={job.answer!r} "
                                        f"approved={job.approved!r}"})
        emit({"type": "command", "command": "cat /proc/sys/kernel/random/boot_id"})
        emit({"type": "output", "stream": "stdout", "line": saved["boot_id"]})
        outcome("done", f"# Job done\n\nanswer={job.answer!r} approved={job.approved!r} "
                        f"boot_id={saved['boot_id']}", verified=True, steps=7)
        return 0

    boot_id = str(uuid.uuid4())
    transcript_path.write_text(json.dumps({"boot_id": boot_id, "task": task}))
    emit({"type": "status", "text": "planning"})
    emit({"type": "tasks", "text": "1. [in_progress] write main.py\n2. [pending] run the tests"})
    emit({"type": "command", "command": "python3 main.py"})
    emit({"type": "output", "stream": "stdout", "line": "hello from the guest"})
    emit({"type": "output", "stream": "stderr", "line": "warning: something on stderr"})
    png = tiny_png()
    emit({"type": "screenshot", "png_base64": base64.b64encode(png).decode(), "width": 320, "height": 200})
    emit({"type": "status", "text": "working"})

    if "question" in task:
        outcome("question", "# Waiting for an answer\n\nWhich port should the server use?",
                question="Which port should the server use?")
        return 0
    if "unfreeze" in task:
        outcome("unfreeze", "# Waiting for approval\n\nNetwork access to the package index is needed.",
                question="Network access to the package index is needed to install requests.")
        return 0
    if "crash" in task:
        emit({"type": "command", "command": "make build"})
        emit({"type": "output", "stream": "stdout", "line": "compiling 3 files"})
        print("scripted worker: crashing on purpose", file=sys.stderr)
        os._exit(3)
    if "slow" in task or "stubborn" in task:
        for i in range(600):
            if cancel.wait(0.1):
                outcome("cancelled", "# Job cancelled\n\nStopped by a person after "
                                     f"{i} ticks. boot_id={boot_id}")
                return 0
            emit({"type": "output", "stream": "stdout", "line": f"tick {i}"})
        outcome("done", "# Job done\n\nslow job finished", verified=True)
        return 0
    if "not proven" in task:
        outcome("done", "# vmagent session sess-1\n\n**Outcome: ⚠️ passed, not proven** — vmd ran `true`.",
                verification={"passed": True, "proven": False, "attempts": 2})
        return 0
    if "check fails" in task:
        outcome("failed", "# vmagent session sess-1\n\n**Outcome: ❌ verification failed** — vmd ran `pytest`.",
                verification={"passed": False, "proven": None, "attempts": 3})
        return 0
    emit({"type": "tasks", "text": "1. [done] write main.py\n2. [done] run the tests"})
    outcome("done", f"# Job done: {task}\n\nChanged main.py; `python3 main.py` printed hello. "
                    "Verification `pytest` exited 0.", verified=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
