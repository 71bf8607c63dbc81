"""The report when the loop ends: vmd's own (built from its record) read with its verdict,
or, when vmd cannot give one, what the loop itself knows, said plainly and marked as
not verified."""

from __future__ import annotations

import logging
from typing import Any

from vmagent import tools
from vmagent.client import Vmd, VmdError, VmdUnavailable
from vmagent.job import Ending, Job, Verification

log = logging.getLogger(__name__)


def vmd_report(vmd: Vmd) -> tuple[str | None, Verification]:
    try:
        result = vmd.call("report")
    except (VmdUnavailable, VmdError) as exc:
        log.warning("vmd could not build the report: %s", exc)
        return None, Verification()
    outcome = result.get("outcome")
    markdown = result.get("markdown")
    return ((markdown if isinstance(markdown, str) and markdown.strip() else None),
            verification_of(outcome if isinstance(outcome, dict) else {}))


def verification_of(outcome: dict) -> Verification:
    """The verdict in vmd's report outcome: status passed (verified and proven),
    passed_not_proven, failed or unverified, with proven and attempts beside it."""
    status = outcome.get("status")
    ran = status in ("passed", "passed_not_proven", "failed")
    attempts = outcome.get("attempts")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        attempts = 1 if ran else 0  # a vmd from before attempts were counted ran the check once
    if status == "passed":
        return Verification(passed=True, proven=True, attempts=attempts)
    if status == "passed_not_proven":
        # vmd says proven null when it could not run the check on the baseline at all:
        # not proven, but not shown to prove nothing either.
        proven = None if "proven" in outcome and outcome["proven"] is None else False
        return Verification(passed=True, proven=proven, attempts=attempts)
    if status == "failed":
        return Verification(passed=False, proven=None, attempts=attempts)
    return Verification(passed=None, proven=None, attempts=attempts)


def loop_notes(job: Job) -> str:
    lines = ["", "## How the session ended", ""]
    lines += [f"- {note}" for note in job.notes]
    lines.append(f"- {job.steps} model turns.")
    return "\n".join(lines) + "\n"


def local_report(job: Job, ending: Ending, vmd_error: str | None) -> str:
    """The report when vmd cannot give one: what the loop itself knows, said plainly."""
    md = [f"# vmagent job: {job.spec.task.strip().splitlines()[0][:100] if job.spec.task.strip() else '(no task)'}",
          "", f"**Outcome: ⚠️ {ending.state}, not verified** — {ending.reason}", ""]
    if vmd_error:
        md += [f"vmd could not be reached for its report ({vmd_error}), so this report is the "
               "agent's own: nothing here was verified, committed or pushed by vmd.", ""]
    md += [f"OS `{job.spec.os}`" + (f" · project `{job.spec.owner or 'local'}/{job.spec.project}`"
                                     if job.spec.project else "")]
    if job.session_id:
        md.append(f"Session `{job.session_id}` (its record stays in vmd's state dir).")
    md += ["", "## Tasks (as last seen)", "", job.tasks_text or "No plan was made."]
    commands = [c for c in _commands_run(job.messages)][-10:]
    if commands:
        md += ["", "## Last commands", ""] + [f"- `{c}`" for c in commands]
    return "\n".join(md) + "\n" + loop_notes(job)


def _commands_run(messages: list[dict[str, Any]]):
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            if function.get("name") == "run":
                parsed = tools.parse_arguments("run", function.get("arguments"))
                if parsed.ok:
                    yield " ".join(parsed.params["command"].split())[:200]
