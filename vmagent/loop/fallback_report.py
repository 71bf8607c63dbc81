"""The report when the loop ends: vmd's own (built from its record) read with its verdict,
or, when vmd cannot give one, what the loop itself knows, said plainly and marked as
not verified."""

from __future__ import annotations

import logging
from typing import Any, Iterable

from vmagent import tools
from vmagent.link import Outage as VmdOutage
from vmagent.link import SessionLink, Vmd, VmdError, VmdUnavailable
from vmagent.loop.job import Ending, Job, Verification
from vmagent.models import Outage as ModelOutage
from vmd.contract.shown_text import fence, one_line

log = logging.getLogger(__name__)


def vmd_report(vmd: Vmd | SessionLink) -> tuple[str | None, Verification]:
    try:
        result = vmd.call("report")
    except (VmdUnavailable, VmdError) as exc:
        log.warning("vmd could not build the report: %s", exc)
        return None, Verification()
    return (result.markdown if result.markdown.strip() else None), result.outcome.verdict()


def verification_of(outcome: dict) -> Verification:
    """The verdict in vmd's report outcome (vmd/contract/verdict.py Verdict.of_status)."""
    return Verification.of_status(outcome)


def outage_notes(vmd_outages: Iterable[VmdOutage], model_outages: Iterable[ModelOutage]) -> list[str]:
    """The report's lines on vmd and the model server going away and coming back. An
    outage that ended the job is said by the ending's own reason."""
    notes = []
    back = [o for o in vmd_outages if o.back]
    if back:
        lost = sum(1 for o in back if o.lost)
        line = (f"vmd went away {_times(len(back))} ({_seconds(o.seconds for o in back)}); the loop waited, "
                "re-attached to the session and went on.")
        if lost:
            many = lost != 1
            line += (f" {lost} tool call{'s' if many else ''} in flight lost {'their results' if many else 'its result'}"
                     f" and {'were' if many else 'was'} answered to the model as interrupted, never run again.")
        notes.append(line)
    answered = [o for o in model_outages if o.back]
    if answered:
        causes = sorted({o.cause for o in answered})
        notes.append(f"The model server failed {_times(len(answered))} and answered again "
                     f"({_seconds(o.seconds for o in answered)}; {'; '.join(causes)[:400]}); the same request, "
                     "from the last complete message, was sent again until it did.")
    return notes


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _seconds(values: Iterable[float]) -> str:
    values = list(values)
    if len(values) == 1:
        return f"{values[0]:.0f} s"
    return f"{sum(values):.0f} s in all, the longest {max(values):.0f} s"


def loop_notes(job: Job, counts: bool = False) -> str:
    """The loop's notes on the end; `counts`: with its turns and tool calls, which vmd's
    report states itself (the loop tells them to vmd, vmd/session/report.py)."""
    lines = ["", "## How the session ended", ""]
    lines += [f"- {note}" for note in job.notes]
    if counts:
        lines.append(f"- {count_words(job.steps, job.tool_calls)}.")
    return "\n".join(lines) + "\n"


def count_words(turns: int, tool_calls: int) -> str:
    """"7 model turns, 14 tool calls": one turn is one call of the model."""
    return (f"{turns} model turn{'' if turns == 1 else 's'}, "
            f"{tool_calls} tool call{'' if tool_calls == 1 else 's'}")


def local_report(job: Job, ending: Ending, vmd_error: str | None) -> str:
    """The report when vmd cannot give one: what the loop itself knows, said plainly."""
    task = one_line(job.spec.task.strip().splitlines()[0])[:100] if job.spec.task.strip() else "(no task)"
    md = [f"# vmagent job: {task}",
          "", f"**Outcome: ⚠️ {ending.state}, not verified** — {ending.reason}", ""]
    if vmd_error:
        md += [f"vmd could not be reached for its report ({vmd_error}), so this report is the "
               "agent's own: nothing here was verified, committed or pushed by vmd.", ""]
    md += [f"OS `{job.spec.os}`" + (f" · project `{job.spec.owner or 'local'}/{job.spec.project}`"
                                     if job.spec.project else "")]
    if job.session_id:
        md.append(f"Session `{job.session_id}` (its record stays in vmd's state dir).")
    # The plan and the commands are the model's words, often repeating the guest's: fenced,
    # a line of backticks or an image link in them stays text.
    md += ["", "## Tasks (as last seen)", "", fence(job.tasks_text) if job.tasks_text else "No plan was made."]
    commands = [c for c in _commands_run(job.messages)][-10:]
    if commands:
        md += ["", "## Last commands", "", fence("\n".join(f"$ {c}" for c in commands), info="sh")]
    return "\n".join(md) + "\n" + loop_notes(job, counts=True)


def _commands_run(messages: list[dict[str, Any]]):
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            if function.get("name") == "run":
                parsed = tools.parse_arguments("run", function.get("arguments"))
                if parsed.ok:
                    yield " ".join(parsed.params["command"].split())[:200]
