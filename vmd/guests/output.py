"""A command's output kept within bounds: the head and tail of each stream, and its
lines handed to a watcher as they come. Used by every guest's `run`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from vmd.config import VmdConfig
from vmd.guests.guest import OutputCallback


@dataclass(frozen=True)
class OutputBounds:
    """What a command may return to the caller before the middle is cut, in bytes of each
    stream's head and tail: VmdConfig.output_head_bytes and output_tail_bytes, with why."""
    head: int
    tail: int

    @classmethod
    def of(cls, config: VmdConfig) -> "OutputBounds":
        return cls(config.output_head_bytes, config.output_tail_bytes)


# For a guest made without vmd's config (tests, the benchmark): the config's defaults.
DEFAULT_BOUNDS = OutputBounds.of(VmdConfig())


class _CappedStream:
    """Keeps the head and tail of a stream and counts what was dropped in between."""

    def __init__(self, head: int = DEFAULT_BOUNDS.head, tail: int = DEFAULT_BOUNDS.tail):
        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail.append(data)
        self.tail_size += len(data)
        while self.tail_size - len(self.tail[0]) >= self.tail_limit:
            first = self.tail.popleft()
            self.tail_size -= len(first)
            self.dropped += len(first)
        if self.tail_size > self.tail_limit:
            first = self.tail[0]
            cut = self.tail_size - self.tail_limit
            self.tail[0] = first[cut:]
            self.tail_size -= cut
            self.dropped += cut

    def text(self) -> str:
        head = bytes(self.head).decode("utf-8", "replace")
        tail = b"".join(self.tail).decode("utf-8", "replace")
        if self.dropped:
            return f"{head}\n[... {self.dropped} bytes of output cut here; the head and tail are kept ...]\n{tail}"
        return head + tail


class _LineSplitter:
    def __init__(self, stream: str, callback: OutputCallback | None):
        self.stream, self.callback, self.partial = stream, callback, b""

    def feed(self, data: bytes) -> None:
        if self.callback is None:
            return
        self.partial += data
        *lines, self.partial = self.partial.split(b"\n")
        for line in lines:
            self._emit(line)
        if len(self.partial) > 4096:  # a progress bar without newlines still shows
            self._emit(self.partial)
            self.partial = b""

    def flush(self) -> None:
        if self.partial:
            self._emit(self.partial)
            self.partial = b""

    def _emit(self, line: bytes) -> None:
        try:
            self.callback(self.stream, line.decode("utf-8", "replace").rstrip("\r"))
        except Exception:  # a view never breaks the work
            pass
