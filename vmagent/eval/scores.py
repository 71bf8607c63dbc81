"""What an eval run scores, measured the way SWE-bench counts: a task is solved only when
its hidden check, run by vmd in the guest after the agent stopped, passes. Whether the
agent's own check was proven (vmd/session/verification.py: it also failed on the project
as it was before) is shown beside it, never taken for the solve. Nothing the model says
counts."""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel

from vmagent.eval.runner import TaskRun
from vmd.contract.verdict import Verdict


class Row(BaseModel):
    """One run of one task, as the table, the JSON and the page show it."""

    task: str
    kind: str
    round: int
    outcome: str  # done, failed, cancelled, question, unfreeze
    reason: str  # why the loop stopped
    check: str  # the agent's check as vmd judged it, in its words (vmd/contract/verdict.py Verdict.label)
    hidden: str  # passed, failed, not run
    hidden_detail: str
    # Where vmd ran the hidden check: "fresh machine" (a clean room with the committed tree,
    # vmd/session/clean_room.py), "session's machine", or "" when it did not run.
    hidden_on: str = ""
    solved: bool  # the hidden check passed
    proven: bool  # the agent's own check was proven
    expected: bool  # what an honest run shows for this task (expect_proven), seen
    turns: int
    model_s: float
    prompt_tokens: int
    reply_tokens: int
    wall_s: float
    answers: int
    session_id: str | None
    report: str | None  # the report's path, relative to the output folder


class Totals(BaseModel):
    runs: int
    solved: int
    solved_and_proven: int
    passed_not_proven: int  # the agent's check passed but proved nothing
    expected: int
    median_wall_s: float | None
    median_wall_s_solved: float | None
    model_s: float
    prompt_tokens: int
    reply_tokens: int
    tokens_per_solved: int | None  # all tokens of all runs, over the runs solved
    solved_per_round: list[int]  # the spread a model that is not deterministic shows (--repeat)


def agent_check(run: TaskRun) -> str:
    return run.outcome.verification.label()


def row_of(run: TaskRun, relative_to=None) -> Row:
    o = run.outcome
    hidden = o.hidden_check or {}
    if not hidden:
        verdict, detail = "not run", "the job ended before a machine could run it" if o.session_id else o.reason
    elif "passed" not in hidden:  # vmd refused it or failed: {"error": its sentence}
        verdict, detail = "not run", str(hidden.get("error"))
    else:
        verdict = "passed" if hidden.get("passed") else "failed"
        detail = f"exit {hidden.get('exit_code')}" + (", timed out" if hidden.get("timed_out") else "")
        if not hidden.get("passed"):
            detail += ": " + " ".join(str(hidden.get("output_tail") or "").split())[-300:]
    hidden_on = {"clean_room": "fresh machine", "session": "session's machine"}.get(str(hidden.get("where")), "")
    check = agent_check(run)
    proven = run.outcome.verification.status == "passed"
    usage = o.usage or {}
    report = None
    if run.report_path is not None:
        report = str(run.report_path.relative_to(relative_to)) if relative_to else str(run.report_path)
    return Row(task=run.task.name, kind=run.task.meta.kind, round=run.round, outcome=o.state, reason=o.reason,
               check=check, hidden=verdict, hidden_detail=detail, hidden_on=hidden_on, solved=verdict == "passed", proven=proven,
               expected=(verdict == "passed" and proven == run.task.meta.expect_proven), turns=o.steps,
               model_s=round(float(usage.get("seconds") or 0.0), 1),
               prompt_tokens=int(usage.get("prompt_tokens") or 0), reply_tokens=int(usage.get("reply_tokens") or 0),
               wall_s=round(run.wall_s, 1), answers=run.answers, session_id=o.session_id, report=report)


def totals_of(rows: list[Row]) -> Totals:
    solved = [r for r in rows if r.solved]
    tokens = sum(r.prompt_tokens + r.reply_tokens for r in rows)
    rounds = sorted({r.round for r in rows})
    return Totals(
        runs=len(rows), solved=len(solved), solved_and_proven=sum(1 for r in solved if r.proven),
        passed_not_proven=sum(1 for r in rows if r.check == Verdict(passed=True, proven=False).label()),
        expected=sum(1 for r in rows if r.expected),
        median_wall_s=_median([r.wall_s for r in rows]), median_wall_s_solved=_median([r.wall_s for r in solved]),
        model_s=round(sum(r.model_s for r in rows), 1), prompt_tokens=sum(r.prompt_tokens for r in rows),
        reply_tokens=sum(r.reply_tokens for r in rows), tokens_per_solved=(tokens // len(solved)) if solved else None,
        solved_per_round=[sum(1 for r in rows if r.round == n and r.solved) for n in rounds])


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


COLUMNS = [("task", 28), ("#", 2), ("outcome", 9), ("hidden", 8), ("checked on", 13), ("agent's check", 19), ("turns", 5),
           ("model s", 8), ("prompt tok", 10), ("reply tok", 9), ("wall s", 7)]


def table(rows: list[Row], totals: Totals, model: str) -> str:
    """The table for a terminal: one line per run, then the totals and the failures' reasons."""
    def line(values: list[Any]) -> str:
        # Names left, figures (from "turns" on) right.
        return "  ".join(str(v)[:w].rjust(w) if i >= 6 else str(v)[:w].ljust(w)
                         for i, (v, (_, w)) in enumerate(zip(values, COLUMNS)))

    out = [f"vmagent eval: {model}, {totals.runs} run{'s' if totals.runs != 1 else ''}", "",
           line([name for name, _ in COLUMNS]), line(["-" * w for _, w in COLUMNS])]
    for r in rows:
        out.append(line([r.task, r.round, r.outcome, r.hidden, r.hidden_on or "-", r.check, r.turns, f"{r.model_s:.1f}",
                         r.prompt_tokens, r.reply_tokens, f"{r.wall_s:.1f}"]))
    out += ["", *summary_lines(totals)]
    notes = [f"  {r.task} #{r.round}: {r.outcome}: {r.reason} Hidden check {r.hidden}: {r.hidden_detail}"
             for r in rows if not r.solved or r.outcome != "done"]
    if notes:
        out += ["", "Not solved, or not ended by a finish:", *notes]
    return "\n".join(out)


def summary_lines(t: Totals) -> list[str]:
    pct = (lambda n: f"{n}/{t.runs} ({100 * n / t.runs:.0f}%)") if t.runs else (lambda n: "0/0")
    return [
        f"solved (hidden check passed): {pct(t.solved)}",
        f"solved and proven:            {pct(t.solved_and_proven)}",
        f"passed, not proven:           {t.passed_not_proven}",
        f"as the task expects:          {pct(t.expected)}",
        f"median wall time:             {_s(t.median_wall_s)} (solved: {_s(t.median_wall_s_solved)})",
        f"model time:                   {t.model_s:.1f} s; tokens {t.prompt_tokens} prompt + {t.reply_tokens} reply",
        f"tokens per solved task:       {t.tokens_per_solved if t.tokens_per_solved is not None else '-'}",
        f"solved per round:             {' '.join(str(n) for n in t.solved_per_round)}",
    ]


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"
