"""The live output of a command in the guest, sent to the connection as notifications."""

from __future__ import annotations

from typing import Callable

Notify = Callable[[str, dict], None]


def output_sink(notify: Notify | None) -> Callable[[str, str], None] | None:
    if notify is None:
        return None

    def sink(stream: str, line: str) -> None:
        try:
            notify("output", {"stream": stream, "line": line})
        except Exception:  # a watcher never breaks the work
            pass
    return sink
