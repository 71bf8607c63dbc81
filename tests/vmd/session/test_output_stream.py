"""The live output of a `run` (vmd/session/handlers/output.py): what a watcher is sent is capped
and rate-limited per command, each line cut and printable, and what was not sent is
said once at the end. On a real guest `yes '' | head -n 1000000` put 1,000,090 lines on
the operator's terminal; the result itself keeps the head and tail as before."""

from __future__ import annotations

from contextlib import closing

from tests.support.vmd_fakes import RpcClient, local_vmd
from vmd.session.handlers.output import BURST_LINES, LINE_CHARS, STREAM_LINES, OutputSink


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_is_cut_to_the_burst_then_the_rate_and_the_rest_is_counted_once():
    sent, clock = [], _Clock()
    sink = OutputSink(lambda method, params: sent.append(params), burst=10, rate=5, lines=100, clock=clock)
    for _ in range(1000):  # a thousand lines at one instant
        sink("stdout", "")
    assert len(sent) == 10
    clock.now = 2.0  # two seconds later: 10 more lines' worth of tokens
    for _ in range(1000):
        sink("stdout", "x")
    assert len(sent) == 20
    sink.close()
    assert sent[-1] == {"stream": "stderr",
                        "line": "[vmd: 1980 more lines not streamed; the full output is in the result]"}
    sink("stdout", "after the end")
    sink.close()
    assert len(sent) == 21, "the notice is said once, and nothing is streamed after it"


def test_the_cap_holds_however_slowly_the_lines_come():
    sent, clock = [], _Clock()
    sink = OutputSink(lambda method, params: sent.append(params), clock=clock)
    for n in range(STREAM_LINES * 3):
        clock.now += 1.0  # one line a second: never over the rate
        sink("stdout", str(n))
    sink.close()
    assert len(sent) == STREAM_LINES + 1
    assert sent[-1]["line"].startswith(f"[vmd: {STREAM_LINES * 2} more lines not streamed")


def test_each_line_is_printable_and_bounded():
    sent = []
    sink = OutputSink(lambda method, params: sent.append(params))
    sink("stdout", "\x1b]52;c;cm0gLXJmIH4K\x07copied\x1b[2J\x9b31m red\r")
    sink("stderr", "y" * 100_000)
    sink("bogus", "z")
    sink.close()
    assert sent[0] == {"stream": "stdout", "line": "copied red"}
    assert sent[1]["stream"] == "stderr" and len(sent[1]["line"]) < LINE_CHARS + 50
    assert sent[1]["line"].endswith(f"[... {100_000 - LINE_CHARS} more characters]")
    assert sent[2]["stream"] == "stdout"
    assert len(sent) == 3, "nothing was held back, so no notice"


def test_a_watcher_that_fails_does_not_break_the_command():
    """A watcher whose sends fail (its connection went away for a moment) costs the command
    nothing: the command's lines all go through the sink to their end, the ones after the
    failures are still offered to the watcher, and the held-back count is said at the end."""
    offered = []

    def flaky(method, params):
        offered.append(params["line"])
        if len(offered) <= 2:
            raise OSError("the watcher went away")

    ran = 0
    with closing(OutputSink(flaky, clock=_Clock())) as sink:  # one instant: the burst, then held lines
        for line in ["first", "second", "third", *["more"] * (BURST_LINES + 5)]:
            sink("stdout", line)
            ran += 1
    assert ran == BURST_LINES + 8, "every line of the command went through"
    assert offered[:3] == ["first", "second", "third"], "the lines after the failed sends still reach the watcher"
    assert len(offered) == BURST_LINES + 1
    assert offered[-1] == "[vmd: 8 more lines not streamed; the full output is in the result]"


def test_a_million_lines_through_the_run_verb(tmp_path):
    """Through the socket, with the stand-in machine: a watcher gets at most the cap and
    one notice; the result still carries the output's tail."""
    lines = []
    with local_vmd(tmp_path) as (_, _, config):
        with RpcClient(config.socket, timeout=120,
                       on_notify=lambda m, p: lines.append(p) if m == "output" else None) as c:
            c.call("session_open", os="debian", project="flood", task="print a lot")
            c.call("plan_tasks", tasks=["flood"])
            c.call("session_ready", timeout=30)
            result = c.call("run", command="yes '' | head -n 1000000; printf '\\033]0;owned\\007the end\\n'")
    assert result["exit_code"] == 0
    assert "the end" in result["stdout"][-100:]
    assert len(lines) <= STREAM_LINES + 1, len(lines)
    notice = lines[-1]["line"]
    assert notice.startswith("[vmd: ") and notice.endswith(
        " more lines not streamed; the full output is in the result]")
    assert int(notice.split()[1]) + len(lines) - 1 == 1_000_001
    assert all("\x1b" not in p["line"] and "\x07" not in p["line"] for p in lines)
