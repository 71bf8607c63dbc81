"""`vmagent run` shows the guest's output, the model's words and the report as data: an
escape sequence a guest prints (OSC 52 writes the operator's clipboard, OSC 0 the window
title, CSI clears and rewrites the screen) never reaches the operator's terminal."""

from __future__ import annotations

import io

from tests.support.loop_harness import call, calls, running_vmd
from tests.support.ollama_server import start_ollama
from tests.vmagent.test_cli import environment, vmagent
from vmagent.cli import TerminalView

# The payloads go with their escapes, so a test can tell a removed sequence from a cut one.
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"
TITLE = "\x1b]0;owned-title\x1b\\"
CLEAR = "\x1b[2J\x1b[H"
C1_CSI = "\u009b31m"
HOSTILE = CLIPBOARD + "hello" + TITLE + CLEAR + C1_CSI


def assert_no_escapes(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b\x9d\r"), repr(text[:2000])
    assert "cm0gLXJmIH4" not in text and "owned-title" not in text


def test_escape_sequences_in_guest_output_never_reach_the_terminal(tmp_path):
    printer = HOSTILE.encode("unicode_escape").decode("ascii")  # as Python source
    script = [
        call("plan_tasks", {"tasks": ["write hello.py" + TITLE, "check it prints hello" + CLIPBOARD]},
             content="Planning." + CLEAR),
        calls(("update_task", {"id": 1, "status": "in_progress"}),
              ("write_file", {"path": "hello.py", "content": f"print('{printer}')\n"})),
        call("run", {"command": "python3 hello.py"}, content="Running it." + TITLE),
        calls(("update_task", {"id": 1, "status": "done", "note": "ran it" + CLIPBOARD}),
              ("update_task", {"id": 2, "status": "done", "note": "prints hello"})),
        call("finish", {"summary": "hello.py prints hello" + CLIPBOARD,
                        "verification": {"command": "python3 hello.py | grep -q hello"}}),
    ]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        done = vmagent("run", "write hello.py" + CLIPBOARD, "--project", "hello", "--os", "debian",
                       env=environment(VMD_SOCKET=vmd.socket, OLLAMA_HOST=server.url))
    assert done.returncode == 0, done.stderr + done.stdout
    assert_no_escapes(done.stderr)
    assert_no_escapes(done.stdout)
    # The guest's line arrived, shown as its text.
    assert "$ python3 hello.py" in done.stderr and "    hello\n" in done.stderr
    assert done.stdout.startswith("# vmagent session ")


def test_every_kind_of_event_the_view_shows_is_printable():
    out = io.StringIO()
    view = TerminalView(out)
    for event in ({"type": "status", "text": HOSTILE}, {"type": "tasks", "text": "1. [ ] a" + HOSTILE},
                  {"type": "command", "command": "cat x" + HOSTILE}, {"type": "output", "line": HOSTILE},
                  {"type": "output", "stream": "stderr", "line": HOSTILE}, {"type": "speech", "text": HOSTILE},
                  {"type": "state", "state": "needs_input", "question": HOSTILE},
                  {"type": "screenshot", "width": HOSTILE, "height": 1}):
        view(event)
    shown = out.getvalue()
    assert_no_escapes(shown)
    assert shown.count("hello") == 8
