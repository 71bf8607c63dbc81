"""The session report, built from the record alone (it works after the machine is gone).

The outcome is vmd's verification as it ran it, never the model's summary; the model's
own words appear last, labelled as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from vmd.contract.errors import REFUSED
from vmd.contract.policy import POLICY
from vmd.contract.shown_text import fence, one_line
from vmd.contract.verdict import Verdict
from vmd.session.record import read_record
from vmd.session.tasks import TaskList

FILE_VERBS = ("write_file", "append_file", "edit_file")
# Reads of the session, not steps of the work (vmd/contract/policy.py POLICY).
UNCOUNTED = tuple(verb for verb, policy in POLICY.items() if not policy.counts_as_step)
# The headline's mark before the verdict's words (vmd/contract/verdict.py Verdict.label).
MARKS = {"passed": "✅", "passed_not_proven": "⚠️", "failed": "❌", "unverified": "⚠️"}


@dataclass
class Report:
    markdown: str
    # status (vmd/contract/verdict.py Verdict.status), proven, attempts, and the verification if any
    # (vmd/contract/results.py ReportOutcome)
    outcome: dict


def _time(event: dict) -> datetime | None:
    try:
        return datetime.fromisoformat(event["time"])
    except (KeyError, ValueError):
        return None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} m"
    return f"{minutes} m {secs:02d} s" if minutes else f"{secs} s"


def build_report(record_path: str | Path, events: list[dict] | None = None) -> Report:
    """The report of the record at `record_path`; `events`: the record's events when the
    caller has them (a full disk may hold some back in memory, vmd/session/record.py)."""
    events = read_record(record_path) if events is None else events
    opened = next((e for e in events if e["kind"] == "session" and e.get("event") == "open"), {})
    args = opened.get("args") or {}
    session_id = opened.get("session_id") or Path(record_path).parent.name
    verbs = [e for e in events if e["kind"] == "verb" and e.get("verb") not in UNCOUNTED]
    task_events = [e for e in events if e["kind"] == "task"]
    tasks = TaskList.from_list(task_events[-1]["tasks"]) if task_events else TaskList()
    outcome_event = next((e for e in reversed(events) if e["kind"] == "outcome"), None)
    close = next((e for e in reversed(events) if e["kind"] == "close"), None)
    notes = [e for e in events if e["kind"] == "note"]
    web = [e for e in events if e["kind"] == "web"]
    machine = [e for e in events if e["kind"] == "machine"]
    cancelled = any(e.get("verb") == "session_cancel" and "error" not in e for e in verbs)
    ended_by_vmd = next((e for e in events if e["kind"] == "session" and e.get("event") == "ended_by_vmd"), None)
    push_end = next((e for e in reversed(events) if e["kind"] == "push"), None)

    attempts = [e for e in events if e["kind"] == "verification"]
    checkpoints = {e.get("task"): e for e in events if e["kind"] == "checkpoint" and e.get("commit")}
    verdict = Verdict.of_outcome(outcome_event, len(attempts))
    if outcome_event:
        outcome = {"status": verdict.status, "proven": verdict.proven, "attempts": verdict.attempts,
                   **{k: outcome_event.get(k) for k in ("command", "cwd", "exit_code", "expect_exit",
                                                         "timed_out", "duration", "output_tail",
                                                         "baseline", "candidate", "setup_command")},
                   "where": verdict.where}
    else:
        outcome = {"status": "unverified", "proven": None, "attempts": len(attempts), "command": None,
                   "exit_code": None, "expect_exit": None, "output_tail": ""}
    if close:
        outcome.update(commit=close.get("commit"), web_url=close.get("web_url"))

    md: list[str] = []
    task_title = (args.get("task") or "").strip().splitlines()
    md.append(f"# vmagent session {session_id}" + (f": {task_title[0][:100]}" if task_title else ""))
    md.append("")
    if outcome_event:
        mark = f"{MARKS[verdict.status]} {verdict.label()}"
        where = verdict.place(outcome.get("candidate"), quote="`")
        line = (f"**Outcome: {mark}** — vmd ran `{outcome['command']}` itself{where}: exit code "
                f"**{outcome['exit_code']}** (expected {outcome['expect_exit']}"
                f"{', timed out' if outcome.get('timed_out') else ''})")
        baseline = outcome.get("baseline") or {}
        if verdict.status == "passed":
            line += f"; on the project as it was before the session it exits {baseline.get('exit_code')}"
        elif verdict.status == "passed_not_proven":
            line += f" — but {verdict.reason()}" + (f": {baseline['error']}" if baseline.get("error") else "")
        md.append(line + ".")
    else:
        why = ("the session was cancelled" if cancelled else
               "vmd ended the session before the agent finished with a verification" if ended_by_vmd else
               "the agent never finished with a verification")
        md.append(f"**Outcome: {MARKS['unverified']} {verdict.label()}** — {why}; nothing here is confirmed by vmd.")
    if ended_by_vmd:
        md += ["", f"vmd closed the session: {ended_by_vmd.get('reason')}."]
    meta = [f"OS `{args.get('os', '?')}`"]
    if args.get("project"):
        meta.append(f"project `{(args.get('owner') or 'local')}/{args['project']}`")
    md.append("")
    md.append(" · ".join(meta))

    if outcome_event:
        md += ["", "## Verification", "",
               f"- command: `{outcome['command']}`" + (f" in `{outcome['cwd']}`" if outcome.get("cwd") else ""),
               *([f"- setup first: `{outcome['setup_command']}`"] if outcome.get("setup_command") else []),
               f"- exit code: {outcome['exit_code']} (expected {outcome['expect_exit']})",
               f"- took {outcome.get('duration') or 0:.1f} s"]
        if outcome.get("output_tail"):
            md += ["", "Output (tail):", "", fence(outcome["output_tail"])]
    if attempts:
        md += ["", f"### Attempts ({len(attempts)})", ""]
        for a in attempts:
            line = (f"{a.get('attempt', '?')}. `{a.get('command')}` → exit {a.get('exit_code')}"
                    f"{' (timed out)' if a.get('timed_out') else ''} in {a.get('duration') or 0:.1f} s: "
                    f"{'passed' if a.get('passed') else 'failed'}")
            base = a.get("baseline")
            if base:
                line += ("; baseline not checked: " + base["error"] if base.get("error") else
                         f"; on the baseline exit {base.get('exit_code')} "
                         f"({'passes too: proves nothing' if base.get('passed') else 'fails: the check needs the work'})")
            md.append(line)

    md += ["", "## Tasks", ""]
    if tasks.planned:
        md += [f"- {t.render()}" + (f" (checkpoint `{checkpoints[t.id]['commit'][:10]}`)"
                                    if t.id in checkpoints else "") for t in tasks.tasks]
        md += ["", tasks.summary_line() + "."]
    else:
        md.append("No plan was made.")

    md += ["", "## Files changed", ""]
    if close and close.get("files"):
        md += [f"- `{line}`" for line in close["files"]]
    else:
        touched = sorted({e["args"].get("path") for e in verbs
                          if e.get("verb") in FILE_VERBS and "error" not in e and e.get("args")})
        if touched:
            md.append("From the file verbs served (no commit lists them):")
            md += [f"- `{p}`" for p in touched]
        else:
            md.append("None recorded.")

    md += ["", "## Commit", ""]
    if not close:
        md.append("The session has not been closed: nothing committed yet.")
    elif not close.get("commit"):
        md.append(close.get("text") or "Nothing was committed.")
    else:
        line = f"Commit `{close['commit'][:12]}`"
        later = push_end if push_end and not close.get("pushed") else None
        branch = close.get("branch") or (later or {}).get("branch")
        if branch:
            line += f" on `{branch}`"
        if close.get("pushed"):
            if close.get("web_url"):
                line += f" — [{close['web_url']}]({close['web_url']})"
            else:
                line += f", pushed to `{close.get('remote')}` (a local repository: no Gitea configured)"
        elif later and later.get("state") == "pushed":
            where = later.get("web_url")
            line += (f" — pushed later, at {_when(later)}, after {_count(later.get('attempts') or 0, 'try')}"
                     + (f": [{where}]({where})" if where else f", to `{later.get('remote')}`")
                     + f". At close Gitea could not take it: {close.get('push_error')}")
        elif later and later.get("state") == "failed":
            line += (f" — **not pushed**: vmd gave up after {_count(later.get('attempts') or 0, 'try')}: "
                     f"{later.get('error')} The commit is kept in vmd's repository.")
        elif close.get("push_pending"):
            until = ((close.get("push") or {}).get("retry_until")) or "its retry limit"
            line += (f" — **not yet pushed**: {close.get('push_error')} vmd retries the push in the "
                     f"background until {until}; the commit is kept in vmd's repository meanwhile.")
        else:
            line += f" — **not pushed**: {close.get('push_error')}"
        md.append(line)
        if close.get("changed_after"):
            md += ["", f"**Not verified**: the project folder changed after vmd verified commit "
                       f"`{close['changed_after'][:12]}`; this commit's later files were never checked."]
        for warning in close.get("warnings") or (later or {}).get("warnings") or []:
            md.append(f"- {warning}")
    if close and close.get("left_out"):
        md += ["", "Left out of the commit (still in the project folder):", ""]
        md += [f"- {item}" for item in close["left_out"][:50]]
        if len(close["left_out"]) > 50:
            md.append(f"- … and {len(close['left_out']) - 50} more")

    md += ["", "## Turns and time", ""]
    first, last = (_time(events[0]), _time(events[-1])) if events else (None, None)
    runs = sum(1 for e in verbs if e.get("verb") == "run" and "error" not in e)
    refused = sum(1 for e in verbs if _refused(e))
    failed = sum(1 for e in verbs if "error" in e and not _refused(e))
    line = (f"{_counts(events, len(verbs))} ({_count(runs, 'command')} run, "
            f"{_count(failed, 'call')} failed with an error, {_count(refused, 'refusal')})")
    if first and last:
        line += f" over {_duration((last - first).total_seconds())}"
    md.append(line + ".")
    boot = next((e for e in machine if e.get("event") == "ready"), None)
    if boot and boot.get("seconds") is not None:
        if boot.get("came") == "warm":
            md.append(f"The machine came warm from vmd's pool, ready in {boot['seconds']:.1f} s.")
        else:
            md.append(f"The machine booted cold in {boot['seconds']:.0f} s." +
                      (f" ({boot['note']}.)" if boot.get("note") else ""))
    for e in machine:
        if e.get("event") == "failed":
            md.append(f"The machine failed: {e.get('error')}")
        elif e.get("event") == "stopped":
            text = e.get("text") or "the session ended before the machine was ready"
            md.append(f"{text[:1].upper()}{text[1:]}.")
        elif e.get("event") == "gone":
            md.append(f"The machine was gone when vmd took the session up again: {e.get('error')}")
        elif e.get("event") == "destroy_failed":
            md.append(f"vmd could not destroy the machine: {e.get('error')}")
    if close and close.get("machine") and close["machine"].startswith(("not destroyed", "still being")):
        md.append(f"At close the machine was {close['machine']}.")
    if first:
        md.append(f"Started {first.isoformat(timespec='seconds')}" +
                  (f", last event {last.isoformat(timespec='seconds')}." if last else "."))

    if web:
        md += ["", "## Sources read on the web", "",
               "Searched and read by vmagent on the host (the machine stayed offline); titles are the pages' own.", ""]
        md += _sources(web)

    if notes:
        md += ["", "## Notes", ""]
        md += [f"- turn {n.get('turn', 0)}: {n.get('text', '')}" for n in notes]

    if outcome_event and outcome_event.get("summary"):
        md += ["", "## The agent's summary (its own words, not verified)", "", outcome_event["summary"]]

    return Report(markdown="\n".join(md) + "\n", outcome=outcome)


def _sources(events: list[dict]) -> list[str]:
    """One line per query or page, in the order first met; a page read in parts is one line.
    What came from the web (URLs, titles, queries) is shown as code, never as markdown."""
    seen: dict[tuple, list[dict]] = {}
    for e in events:
        seen.setdefault((e.get("source"), e.get("target"), bool(e.get("ok"))), []).append(e)
    lines = []
    for (kind, target, ok), group in seen.items():
        last = group[-1]
        times = f", {len(group)} times" if len(group) > 1 else ""
        if kind == "search":
            line = f"- {'searched' if ok else 'could not search'} {_code(target)}"
            line += f": {_code(last.get('detail'))}" if last.get("detail") else ""
        else:
            line = f"- {'read' if ok else 'could not read'} {_code(target)}"
            if last.get("title"):
                line += f" — {_code(last['title'])}"
            if last.get("detail"):
                line += f" ({_code(last['detail'])}{times})" if ok else f": {_code(last['detail'])}"
                times = ""
        lines.append(line + (f" ({times[2:]})" if times else ""))
    return lines


def _code(text: object) -> str:
    """`text` as an inline code span nothing in it can close (CommonMark: a longer run of backticks)."""
    text = one_line(str(text or ""))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    marks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{marks}{pad}{text}{pad}{marks}"


def _refused(event: dict) -> bool:
    """A verb a rule of the session refused: its error's code says so. A record of a vmd
    from before every refusal was an error has finish's refusals as results (accepted: false)."""
    if "error" in event:
        return event.get("code") == REFUSED
    return event.get("verb") == "finish" and (event.get("result") or {}).get("accepted") is False


def _counts(events: list[dict], served: int) -> str:
    """The agent's model turns and tool calls as it last told them (session_status's params,
    vmd/contract/params.py SessionStatus), else the calls vmd served."""
    told = next((e["args"] for e in reversed(events) if e["kind"] == "verb" and e.get("verb") == "session_status"
                 and (e.get("args") or {}).get("turns") is not None), None)
    if told:
        return f"{_count(told['turns'], 'model turn')}, {_count(told.get('tool_calls') or 0, 'tool call')}"
    return _count(served, "call")


def _count(n: int, noun: str) -> str:
    if noun.endswith("y") and n != 1:
        return f"{n} {noun[:-1]}ies"
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _when(event: dict) -> str:
    when = _time(event)
    return when.isoformat(timespec="seconds") if when else "a later time"
