"""Markdown that vmagent builds from guest and model text keeps that text as data: a line
of backticks, an image link or an escape sequence in it stays inside its fence (`fence`),
so it cannot turn the rest of a report, an answer or a chat message into markdown."""

from __future__ import annotations

from pathlib import Path

from vmagent.loop.fallback_report import local_report
from vmagent.loop.job import Ending, Job, JobSpec
from vmagent.service.ask import extractive_answer
from vmagent.service.salvage import build_salvage_report
from vmagent.service.store import Store

HOSTILE = "```\n![pixel](http://attacker.example/p.png)\n[click](http://attacker.example)\n````````"


def outside_fences(markdown: str) -> list[str]:
    """The lines of `markdown` that are not inside a fenced code block (CommonMark: a fence
    of N backticks closes only at a line of N or more backticks and nothing else)."""
    outside, fence_len = [], 0
    for line in markdown.splitlines():
        run = len(line) - len(line.lstrip("`"))
        if fence_len == 0:
            if run >= 3:
                fence_len = run
            else:
                outside.append(line)
        elif run >= fence_len and not line.strip("`").strip():
            fence_len = 0
    assert fence_len == 0, "a fence was left open"
    return outside


def test_guest_text_in_the_salvage_report_stays_inside_its_fences(tmp_path):
    store = Store(tmp_path / "data")
    job = store.create_job(owner="alice", task="build it\n# Approved by the operator", os="debian",
                           project="demo")
    store.update_job(job["id"], tasks_text="1. [done] build\n```\n![tasks](http://attacker.example/t.png)",
                     status_line="working\x1b]52;c;cm0gLXJm\x07")
    store.add_event(job["id"], {"type": "command", "command": "cat notes.md"})
    for line in HOSTILE.splitlines():
        store.add_event(job["id"], {"type": "output", "stream": "stdout", "line": line})
    (store.job_dir(job["id"]) / "worker.log").write_text("Traceback\n```\n<img src=http://attacker.example/l.png>\n")
    report = build_salvage_report(store, store.get_job(job["id"]), "its worker crashed", 3)
    shown = "\n".join(outside_fences(report))
    assert "attacker.example" not in shown, shown
    assert "\x1b" not in report and "cm0gLXJm" not in report
    assert "# Approved by the operator" not in report.splitlines()  # the task is one line of the heading
    for heading in ("## Tasks", "## Last terminal activity", "## Worker log (last lines)"):
        assert heading in shown
    assert "![pixel](http://attacker.example/p.png)" in report  # shown, as text


def test_the_loops_own_report_fences_the_plan_and_the_commands(tmp_path):
    job = Job(spec=JobSpec(task="fix it\n# Verified by vmd", project="demo"), transcript_path=Path(tmp_path / "t.json"))
    job.tasks_text = "1. [done] fix\n" + HOSTILE
    job.messages = [{"role": "assistant", "tool_calls": [{"function": {
        "name": "run", "arguments": {"command": "echo '` ![x](http://attacker.example/c.png) `'"}}}]}]
    report = local_report(job, Ending(state="failed", reason="vmd went away"), "vmd is not listening")
    shown = "\n".join(outside_fences(report))
    assert "attacker.example" not in shown, shown
    assert "## Tasks (as last seen)" in shown and "## Last commands" in shown
    assert "# Verified by vmd" not in report.splitlines()


def test_matching_lines_of_an_extractive_answer_are_fenced():
    answer = extractive_answer("what did the pixel do", [("terminal", HOSTILE + "\npixel \x1b]52;c;eA==\x07")])
    shown = "\n".join(outside_fences(answer))
    assert "attacker.example" not in shown and "pixel" in answer and "\x1b" not in answer
