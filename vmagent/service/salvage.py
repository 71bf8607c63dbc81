"""The report the job service writes when a worker ended without one.

Everything in it but the service's own sentences came from the guest or the model: the
task list, the terminal lines, the worker's log. Each is shown as data — in a fence no
line inside can close (`fence`), or on one printable line — so a guest that prints
three backticks and an image link does not turn the rest of the report into markdown.
"""

from __future__ import annotations

from vmd.contract.shown_text import fence, one_line

from .store import Store

# What the report shows of the end of the job: terminal lines and worker log lines.
TERMINAL_LINES = 40
LOG_LINES = 15
# The end of the worker's log that is read for them: the log has no bound of its own.
LOG_TAIL_BYTES = 64 * 1024


def build_salvage_report(store: Store, job: dict, why: str, exit_code: int | None,
                         state: str = "failed") -> str:
    """A report from what the service knows when the worker could not write one."""
    lines = [f"# Job {state}: {one_line(job['task'])[:200]}", ""]
    how = ""
    if exit_code is not None:
        how = (f" (killed by signal {-exit_code})" if exit_code < 0 else f" (exit code {exit_code})")
    lines.append(f"The job stopped because {why}{how}. This report is built by the job service "
                 "from the events it had received; nothing in it comes from the model's prose.")
    lines += ["", f"- OS: {one_line(job['os'])}", f"- Project: {one_line(job['project'] or '(none)')}",
              f"- Last status: {one_line(job['status_line'] or '(none)')}"]
    if job.get("session_id"):
        lines.append(f"- vmd session: {one_line(job['session_id'])} (its record holds the full history)")
    if job["tasks_text"]:
        lines += ["", "## Tasks", "", fence(job["tasks_text"])]
    activity = []
    for _, event in store.tail_events(job["id"], 400):
        kind = event.get("type")
        if kind == "command":
            activity.append(f"$ {event.get('command', '')}")
        elif kind == "output":
            activity.append(str(event.get("line", "")))
    if activity:
        lines += ["", "## Last terminal activity", "", fence("\n".join(activity[-TERMINAL_LINES:]))]
    tail = log_tail(store.job_dir(job["id"]) / "worker.log")
    if tail:
        lines += ["", "## Worker log (last lines)", "", fence("\n".join(tail))]
    lines += ["", "The project folder on the host keeps whatever was written to it. Start a new "
              "job to carry on; if the machine is still listed by vmd, its session can be closed there."]
    return "\n".join(lines)


def log_tail(path) -> list[str]:
    """The last LOG_LINES lines of a log, read from its last LOG_TAIL_BYTES only."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.strip().splitlines()[-LOG_LINES:]
