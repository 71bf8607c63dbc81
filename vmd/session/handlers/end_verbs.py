"""The end: finish (refused while a task is open or before any command ran; vmd re-runs
the named check itself and compares it with the baseline, vmd/session/verification.py; every
refusal is a REFUSED error, the two after a run of the check carry the attempt) and
session_close (commit, push, destroy the machine, also one still booting). vmd closes a
session on its own account through the same `close(session, reason=…)`
(vmd/server/lifecycle.py); a push that fails for a reason that may pass is retried later
(vmd/server/push_retrier.py)."""

from __future__ import annotations

import time
from pathlib import Path

from vmd import verbs as V
from vmd.errors import refused, sentence
from vmd.projects.push_state import after_close, pending_text
from vmd.session import boot as session_boot
from vmd.session import disk
from vmd.session import verification as check
from vmd.session.handlers.output import streamed
from vmd.session.session import Session


def finish(session: Session, p: V.Finish, notify) -> dict:
    open_tasks = session.tasks.open_tasks()
    if open_tasks:
        names = "; ".join(f"{t.id}. {t.title} ({t.status.replace('_', ' ')})" for t in open_tasks)
        raise refused(f"tasks still open: {names}. Finish them and mark each done, or blocked with a "
                      "note saying why, then call finish again.")
    if session.s.runs == 0:
        raise refused("no command was ever run in this session. Run the work and its check with `run` "
                      "first; vmd does not take a finish on the model's word.")
    if p.verification is None:
        raise refused("name the verification: finish(summary, verification={\"command\": \"<a command "
                      "that proves the work>\", \"expect_exit\": 0}); vmd runs it itself.")
    return _verify_and_finish(session, p, notify)


def _verify_and_finish(session: Session, p: V.Finish, notify) -> dict:
    """vmd runs the check itself. A failure is work left (refused) until the allowed
    failures are spent; a pass is checked against the baseline (vmd/session/verification.py).
    A refusal after the run is kept like any attempt (session.json's verifications, the
    record's "verification" line) and carries it as its data (FinishRefusalData)."""
    machine = session.ready_machine()
    command, expect = p.verification.command, p.verification.expect_exit
    cwd = session.s.facts.get("project_path") or machine.project_path if session.s.project_dir else None
    tail = session.config.output_tail_chars
    with streamed(notify) as sink:
        run = check.run_check(machine.guest, command, expect, cwd, session.verify_timeout, sink, tail)
    baseline = None
    if run.passed:
        archive = check.baseline_archive(_repository(session), session.s.base_commit) if session.s.project_dir else b""
        baseline = check.run_baseline(machine.guest, command, expect, archive, session.verify_timeout, tail)
    attempt = {"attempt": len(session.s.verifications) + 1, "command": command, "expect_exit": expect,
               **run.model_dump(), "baseline": baseline.model_dump() if baseline else None}
    with session.lock:
        session.s.verifications.append({k: v for k, v in attempt.items() if k != "output_tail"})
        session.save()
    session.record.append("verification", **attempt)
    failures = sum(1 for v in session.s.verifications if not v["passed"])
    allowed = session.config.max_failed_verifications
    if not run.passed and failures < allowed:
        raise refused(check.failed_text(run, command, expect, failures, allowed), {"attempt": attempt})
    proven = None
    if baseline is not None and baseline.error is None:
        proven = not baseline.passed
        if not proven and not session.s.baseline_refused:
            with session.lock:
                session.s.baseline_refused = True
                session.save()
            raise refused(check.not_proven_text(command, baseline), {"attempt": attempt})
    outcome = {"command": command, "cwd": cwd, "expect_exit": expect, "exit_code": run.exit_code,
               "passed": run.passed, "proven": proven if run.passed else None,
               "timed_out": run.timed_out, "duration": run.duration, "output_tail": run.output_tail,
               "baseline": baseline.model_dump() if baseline else None,
               "attempts": len(session.s.verifications)}
    with session.lock:
        session.s.outcome = outcome
        session.s.summary = p.summary
        if session.s.state in ("ready", "booting", "finished"):
            session.s.state = "finished"
        session.save()
    session.record.append("outcome", **outcome, summary=p.summary)
    verdict = V.Verdict.of_outcome(outcome).sentence()
    if run.passed and proven is None and baseline is not None and baseline.error:
        verdict += f" ({baseline.error})"
    text = (f"Finished. vmd ran `{command}` itself: exit {run.exit_code} (expected {expect}"
            f"{', timed out' if run.timed_out else ''}): {verdict}.\nOutput tail:\n{run.output_tail[-1500:]}")
    return {"accepted": True, "outcome": outcome, "text": text}


def _repository(session: Session):
    return session.store.remote(session.s.owner, session.s.project or "").repository()


def session_close(session: Session, p, notify) -> dict:
    return close(session)


def close(session: Session, reason: str | None = None) -> dict:
    """Commit the project folder, push it, destroy the machine (whatever its boot is
    doing), and keep the result in session.json and the record. `reason`: vmd ends the
    session itself (its client went away, a restart found its machine gone, a full
    disk), in words for the report. One close runs at a time; a second answers "already
    closed"."""
    with session.closing:
        with session.lock:
            if session.s.close is not None:
                return {**session.s.close, "text": "already closed. " + session.s.close["text"]}
            session.ending.set()  # a boot in progress stops at its next step
        return _close(session, reason)


def _close(session: Session, reason: str | None) -> dict:
    started = time.monotonic()
    if reason:
        session.record.append("session", event="ended_by_vmd", reason=reason)
    commit = web_url = None
    push: dict = {}
    files: list[str] = []
    error = None
    commit_failed = False
    left_out: list[str] = []
    push_state = None
    if session.s.project_dir:
        project_dir = Path(session.s.project_dir)
        owner, project = session.s.owner, session.s.project or ""
        try:
            with session.frozen():
                committed = session.store.commit(project_dir, owner, project, _commit_message(session),
                                                 allow_empty=True)
            commit, left_out = committed["sha"], committed["left_out"]
        except Exception as exc:
            commit_failed = True
            error = sentence(exc, "committing the project folder failed")
            if disk.full(exc, by_text=True):
                error = disk.sentence("vmd could not commit the project folder", exc)
        if error is None:
            try:
                files = session.store.changed_files(owner, project, session.s.base_commit)
            except Exception as exc:  # the list is for the report; the commit stands
                session.record.append("close", event="files_unknown", error=sentence(exc, "git diff failed"))
            try:
                push = session.store.push(owner, project, session.s.task, session.s.branch, session.s.outcome)
            except Exception as exc:
                push = {"pushed": False, "retry": True, "error": sentence(exc, "the push failed")}
            web_url = push.get("web_url")
            error = push.get("error")
            if commit is not None or push.get("sha"):
                gitea = session.store.remote(owner, project).uses_gitea
                push_state = after_close(push, session.config, gitea)
    destroyed, machine = session_boot.stop_machine(session)
    if not session.s.project_dir:
        body = "This session had no project folder: nothing was committed."
    elif commit_failed:
        try:
            kept = session.store.last_commit(owner, project)
        except Exception:
            kept = None
        body = (f"The project folder could not be committed now: {error}. "
                + (f"What was committed before stays: {kept[:10]} in vmd's repository (not pushed now)."
                   if kept else "Nothing had been committed before."))
    elif commit is None and not error:
        body = "The project folder was empty: nothing to commit."
    elif push.get("pushed"):
        where = web_url or push.get("remote_display")
        body = f"Committed {commit[:10]} and pushed it to {where}."
    elif push_state is not None and push_state.state == "pending":
        body = f"Committed {commit[:10] if commit else 'nothing new'}; not yet pushed: {error} {pending_text(push_state)}"
    else:
        body = f"Committed {commit[:10] if commit else 'nothing'}; NOT pushed: {error}"
    if left_out:
        body += (f" Left out of the commit ({len(left_out)}): "
                 + " ".join(left_out[:10]) + (" …" if len(left_out) > 10 else ""))
    if session.boot_stopped:
        body += (" The session ended before the machine was ready; "
                 + ("vmd destroyed what it had started." if destroyed else "no machine had been started yet."))
    elif machine.startswith(("not destroyed", "still being created")):
        body += f" The machine was {machine}."
    text = (f"vmd closed the session: {reason}. " if reason else "Closed. ") + body
    closed = {"closed": True, "commit": commit, "web_url": web_url, "branch": push.get("branch"),
              "remote": push.get("remote_display"), "pushed": bool(push.get("pushed")),
              "push_error": error, "warnings": push.get("warnings") or [], "files": files,
              "machine_destroyed": destroyed, "machine": machine, "left_out": left_out,
              "ended_by": "vmd" if reason else "client", "reason": reason,
              "push": push_state.view() if push_state else None, "text": text}
    with session.lock:
        session.s.push = push_state
        session.s.close = closed
        session.s.state = "closed"
        session.save()
    session.record.append("close", **closed, push_pending=bool(push_state and push_state.state == "pending"),
                          duration=round(time.monotonic() - started, 3))
    return closed


def _commit_message(session: Session) -> str:
    title = (session.s.task.strip().splitlines() or ["vmagent session"])[0][:72]
    body = [f"vmagent session {session.s.id}", "", "Tasks:", session.tasks.render()]
    if session.s.outcome:
        o = session.s.outcome
        body += ["", f"Verification by vmd: `{o['command']}` exited {o['exit_code']} (expected "
                     f"{o['expect_exit']}): {V.Verdict.of_outcome(o).sentence()}; {o.get('attempts', 1)} attempt(s)."]
    else:
        body += ["", "Not verified by vmd: the session did not finish."]
    return title + "\n\n" + "\n".join(body)


HANDLERS = {
    "finish": finish,
    "session_close": session_close,
}
