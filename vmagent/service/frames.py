"""A worker's frames read in bounded pieces, and the bound on the output lines a job stores.

Measured before these bounds (issue 20): a guest's `yes '' | head -n 200000` became 10.2 MB
of frames and 28.6 MB in the jobs database, 11 s to ingest, and the unread tail of the
frames file was read into memory whole. Every newline a guest prints is one frame, so one
guest could fill the service's disk and memory. Now a reader holds at most one read and
one frame in memory, and a job stores a bounded number of output lines; past the bound
the lines are counted, and one notice per command says how many were not stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .store import Store

# One read of the frames file. 1 MiB is about 20,000 short output frames: the job's row
# (its offset) is written once per read, not once per frame.
READ_BYTES = 1024 * 1024
# The longest frame kept whole. A screenshot frame carries a PNG in base64, and vmd takes
# PNGs of up to 16 MiB (vmd/machines/screen_text.py, MAX_PNG_BYTES): 21.4 MiB in base64
# plus its JSON. A longer line is cut: its first CUT_FRAME_BYTES are kept and the rest
# skipped as it is read, never buffered.
MAX_FRAME_BYTES = 24 * 1024 * 1024
CUT_FRAME_BYTES = 8000

# Output lines stored per job, and per command of it. The preview shows the last 200
# lines, the salvage report 40 and /ask reads 600; the whole output of a command is in its
# result (the model's, and vmd's record). 1,000 lines a command keep a build log readable
# while one flood cannot crowd out every later command's lines; 5,000 a job are about
# 0.7 MB of database at 143 bytes an empty line (measured), more with long lines.
MAX_OUTPUT_LINES_PER_COMMAND = 1000
MAX_OUTPUT_LINES_PER_JOB = 5000


def dropped_notice(count: int) -> dict:
    lines = "line" if count == 1 else "lines"
    return {"type": "output", "stream": "service", "dropped": count,
            "line": f"({count:,} more {lines} not stored; the full output is in the command's result)"}


class FrameReader:
    """Complete lines of a frames file from an offset, READ_BYTES at a time.

    `offset` is where the next unread line starts (the job's stored frames_offset); a
    partial last line waits in memory, up to MAX_FRAME_BYTES, for the rest of it."""

    def __init__(self, path: Path, offset: int):
        self.path = Path(path)
        self.offset = offset  # after the last complete line handed out
        self._pos = offset  # where the next read starts
        self._partial = bytearray()
        self._cut = False  # the partial line passed MAX_FRAME_BYTES: the rest is skipped
        self.cut_frames = 0

    def read(self, on_line: Callable[[bytes], None]) -> bool:
        """Reads once; calls `on_line` for each complete line. True if any bytes came."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read(READ_BYTES)
        except FileNotFoundError:
            return False
        if not data:
            return False
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            self._take(piece)
            if end < 0:
                break
            line = bytes(self._partial)
            self.offset = self._pos + end + 1
            self._partial.clear()
            if self._cut:
                self._cut = False
                self.cut_frames += 1
                line = line + b" ... (a frame longer than %d bytes, cut)" % MAX_FRAME_BYTES
            on_line(line)
            start = end + 1
        self._pos += len(data)
        return True

    def _take(self, piece: bytes) -> None:
        if self._cut:
            return
        if len(self._partial) + len(piece) > MAX_FRAME_BYTES:
            keep = max(0, CUT_FRAME_BYTES - len(self._partial))
            self._partial += piece[:keep]
            del self._partial[CUT_FRAME_BYTES:]
            self._cut = True
            return
        self._partial += piece


class OutputCap:
    """Which output lines of one job are stored: MAX_OUTPUT_LINES_PER_COMMAND a command,
    MAX_OUTPUT_LINES_PER_JOB the job (counted from the store, so a resumed job or a
    restarted service goes on from what is stored). The rest are counted into one notice
    per command, written when the first line is dropped and rewritten with its count
    (`flush`, once per read and before any other event)."""

    def __init__(self, store: Store, job_id: str):
        self.store = store
        self.job_id = job_id
        self.job_lines = store.count_events(job_id, "output")
        self.command_lines = 0
        self.dropped = 0
        self._notice_seq: int | None = None
        self._written = 0

    def admit(self) -> bool:
        """True if the next output line is stored; False if it is counted instead."""
        if self.command_lines < MAX_OUTPUT_LINES_PER_COMMAND and self.job_lines < MAX_OUTPUT_LINES_PER_JOB:
            self.command_lines += 1
            self.job_lines += 1
            return True
        self.dropped += 1
        if self._notice_seq is None:
            self._notice_seq = self.store.add_event(self.job_id, dropped_notice(self.dropped))
            self._written = self.dropped
        return False

    def flush(self) -> None:
        if self._notice_seq is not None and self._written != self.dropped:
            self.store.replace_event(self.job_id, self._notice_seq, dropped_notice(self.dropped))
            self._written = self.dropped

    def next_command(self) -> None:
        self.flush()
        self.command_lines = 0
        self.dropped = 0
        self._notice_seq = None
        self._written = 0
