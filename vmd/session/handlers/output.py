"""The live output of a command in the guest, sent to the connection as notifications:
capped and rate-limited per command, each line cut and made printable.

Every line streamed is an event that the watcher shows and the job service stores: on a
real guest `yes '' | head -n 1000000` put 1,000,090 lines on the operator's terminal, and
in the job service 200,000 empty lines became 28.6 MB of its database. The watcher is
shown what a person can follow; the rest is counted and said once when the command ends.
The command's result keeps its own head and tail of the output (vmd/guests/output.py).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from vmd.contract.shown_text import printable

Notify = Callable[[str, dict], None]

# Lines streamed per command at most: a build's progress fits, a flood does not.
STREAM_LINES = 2000
# A token bucket: a burst of BURST_LINES at once (a compiler's error block, a test
# summary), then RATE_LINES a second, about what a person can still read scroll by.
BURST_LINES = 200
RATE_LINES = 50.0
# Characters of one streamed line; the job service keeps 4,000 of a line, a terminal
# shows a few hundred.
LINE_CHARS = 1000


class OutputSink:
    """`sink(stream, line)` for a running command (vmd/guests/guest.py's on_output); `close()`
    when it ended sends one notice of the lines that were not streamed."""

    def __init__(self, notify: Notify, *, lines: int = STREAM_LINES, burst: int = BURST_LINES,
                 rate: float = RATE_LINES, clock: Callable[[], float] = time.monotonic):
        self.notify, self.clock = notify, clock
        self.lines, self.burst, self.rate = lines, burst, rate
        self.tokens = float(burst)
        self.last = clock()
        self.streamed = 0
        self.held = 0  # lines not streamed: past the cap or the rate
        self.closed = False

    def _allowed(self) -> bool:
        if self.streamed >= self.lines:
            return False
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def __call__(self, stream: str, line: str) -> None:
        if self.closed or not self._allowed():
            self.held += 1
            return
        line = printable(line)
        if len(line) > LINE_CHARS:
            line = f"{line[:LINE_CHARS]} [... {len(line) - LINE_CHARS} more characters]"
        self.streamed += 1
        self._send(stream if stream in ("stdout", "stderr") else "stdout", line)

    def close(self) -> None:
        """Says once how many lines were not streamed; later lines are counted, not sent."""
        if self.closed:
            return
        self.closed = True
        if self.held:
            self._send("stderr", f"[vmd: {self.held} more lines not streamed; the full output is in the result]")

    def _send(self, stream: str, line: str) -> None:
        try:
            self.notify("output", {"stream": stream, "line": line})
        except Exception:  # a watcher never breaks the work
            pass


def output_sink(notify: Notify | None) -> OutputSink | None:
    return None if notify is None else OutputSink(notify)


@contextlib.contextmanager
def streamed(notify: Notify | None) -> Iterator[OutputSink | None]:
    """The sink for one command, closed when it ends: the lines it held back are said once."""
    sink = output_sink(notify)
    try:
        yield sink
    finally:
        if sink is not None:
            sink.close()
