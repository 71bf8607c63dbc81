"""What `vmagent run` and `vmagent eval` show in a person's terminal, and their exit codes
(the codes are said in vmagent/cli.py's docstring)."""

from __future__ import annotations

from typing import TextIO

from vmd.contract.shown_text import printable

EXIT_DONE, EXIT_NOT_DONE, EXIT_USAGE, EXIT_NOT_PROVEN = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # what a shell reports for a program ended by SIGINT


def show(text: str, out: TextIO) -> None:
    """Writes `text` and a newline to the person's terminal, as data: the guest's output,
    the model's words and the reports built from them may carry escape sequences (OSC 52
    writes the clipboard, OSC 0 the window title, CSI moves the cursor and rewrites what
    was shown), and here they are removed (`printable`). Everything the terminal commands
    show goes through this one function. Never raises (it may write to a closed pipe)."""
    try:
        print(printable(str(text)), file=out, flush=True)
    except (OSError, ValueError):
        pass
