"""Text from a guest or a model, made safe to show: part of the contract, so both sides
render it by one rule.

The guest is an attacker and the model repeats what the guest printed. Their text reaches a
person's terminal (`vmagent run`), vmd's log, error messages and markdown reports. There it
must stay data: an escape sequence (OSC 52 writes the clipboard, OSC 0 the window title,
CSI moves the cursor and rewrites what was shown) must not reach a terminal, and a line
of backticks must not close a report's fence and turn the rest into markdown (images,
links). Stdlib only.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and C1 controls (U+0080-U+009F: a terminal reads
# U+009B as CSI and U+009D as OSC on its own). Carriage return goes too: it lets a later
# part of a line overwrite what was shown before it.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A whole escape sequence goes, not only its ESC, so that no half of it is shown as text:
# CSI (ESC [ … final), OSC/DCS/APC/PM/SOS (ESC ] … BEL or ST), and two-byte escapes.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?"
                      r"|\x9b[0-?]*[ -/]*[@-~]|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x9c|\x1b\\)?")


def printable(text: str) -> str:
    """`text` with escape sequences and control characters removed, tab and newline kept."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def one_line(text: str) -> str:
    """`text` for a single line of a log or an error message: printable, newlines as spaces."""
    return printable(text.replace("\r\n", "\n").replace("\n", " ").replace("\t", " "))


def fence(text: str, info: str = "text") -> str:
    """`text` as a fenced markdown block that nothing inside it can close: the fence is one
    backtick longer than the longest run of backticks in the text (CommonMark's rule)."""
    text = printable(text).rstrip()
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    marks = "`" * max(3, longest + 1)
    return f"{marks}{info}\n{text}\n{marks}"
