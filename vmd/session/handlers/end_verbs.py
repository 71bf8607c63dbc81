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

from vmd.contract.params import Finish
from vmd.contract.verdict import Verdict
from vmd.errors import refused, sentence
from vmd.projects.push_state import after_close, pending_text
from vmd.projects.store import Publication
from vmd.session import boot as session_boot
from vmd.session import disk
from vmd.session import check_flow
from vmd.session import verification as check
from vmd.session.clean_room import RoomUnavailable
from vmd.session.session import Session


def finish(session: Session, p: Finish, notify) -> dict:
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


def _verify_and_finish(session: Session, p: Finish, notify) -> dict:
    """vmd runs the check itself, on a fresh machine holding the candidate commit
    (vmd/session/check_flow.py). A failure is work left (refused) until the allowed
    failures are spent; a pass is checked against the baseline. A refusal after the run is
    kept like any attempt (session.json's verifications, the record's "verification" line)
    and carries it as its data (FinishRefusalData). No fresh machine: refused, nothing
    counted, never run in the session's guest instead."""
    v = p.verification
    command, expect = v.command, v.expect_exit
    try:
        got = check_flow.verify(session, v, notify)
    except RoomUnavailable as exc:
        session.record.append("verification", event="no_clean_room", command=command, error=str(exc))
        raise refused(f"the check could not run on a fresh machine: {exc}. Nothing was counted; "
                      "finish again.") from None
    run, baseline = got.run, got.baseline
    setup_failed = got.setup is not None and not got.setup.passed
    passed = run.passed and not setup_failed
    extra = {"where": got.where, "candidate": got.candidate, "setup_command": v.setup,
             "setup": got.setup.model_dump() if got.setup else None, "check_files": got.check_files,
             "left_out": got.left_out, "rooms": got.rooms}
    attempt = {"attempt": len(session.s.verifications) + 1, "command": command, "expect_exit": expect,
               **run.model_dump(), "passed": passed, "baseline": baseline.model_dump() if baseline else None,
               **extra}
    with session.lock:
        session.s.verifications.append({k: v for k, v in attempt.items() if k != "output_tail"})
        session.save()
    session.record.append("verification", **attempt)
    failures = sum(1 for a in session.s.verifications if not a["passed"])
    allowed = session.config.max_failed_verifications
    if not passed and failures < allowed:
        text = (check.setup_failed_text(got.setup, v.setup, failures, allowed) if setup_failed else
                check.failed_text(run, command, expect, failures, allowed))
        raise refused(text + check.left_out_note(got.left_out), {"attempt": attempt})
    proven = None
    if passed and baseline is not None and baseline.error is None:
        proven = not baseline.passed
        if not proven and not session.s.baseline_refused:
            with session.lock:
                session.s.baseline_refused = True
                session.save()
            raise refused(check.not_proven_text(command, baseline, got.check_files), {"attempt": attempt})
    outcome = {"command": command, "cwd": got.cwd, "expect_exit": expect, "exit_code": run.exit_code,
               "passed": passed, "proven": proven if passed else None,
               "timed_out": run.timed_out, "duration": run.duration, "output_tail": run.output_tail,
               "baseline": baseline.model_dump() if baseline else None,
               "attempts": len(session.s.verifications), **extra}
    with session.lock:
        session.s.outcome = outcome
        session.s.summary = p.summary
        if session.s.state in ("ready", "booting", "finished"):
            session.s.state = "finished"
        session.save()
    session.record.append("outcome", **outcome, summary=p.summary)
    verdict = Verdict.of_outcome(outcome).sentence()
    if passed and proven is None and baseline is not None and baseline.error:
        verdict += f" ({baseline.error})"
    where = Verdict.of_outcome(outcome).place(got.candidate)
    text = (f"Finished. vmd ran `{command}` itself{where}: exit {run.exit_code} (expected {expect}"
            f"{', timed out' if run.timed_out else ''}): {verdict}.\nOutput tail:\n{run.output_tail[-1500:]}")
    return {"accepted": True, "outcome": outcome, "text": text}


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
    changed_after = None
    files: list[str] = []
    error = None
    commit_failed = False
    left_out: list[str] = []
    push_state = None
    if session.s.project_dir:
        # One publication for the whole close: the remote resolved once, commit then push.
        publication = session.publication()
        try:
            with session.frozen():
                committed = publication.commit(Path(session.s.project_dir), _commit_message(session),
                                               allow_empty=True)
            commit, left_out = committed["sha"], committed["left_out"]
            changed_after = _changed_after(session, publication, commit)
            if changed_after:
                commit = publication.reword_head(_commit_message(session, changed_after))
        except Exception as exc:
            commit_failed = True
            error = sentence(exc, "committing the project folder failed")
            if disk.full(exc, by_text=True):
                error = disk.sentence("vmd could not commit the project folder", exc)
        if error is None:
            try:
                files = publication.changed_files(session.s.base_commit)
            except Exception as exc:  # the list is for the report; the commit stands
                session.record.append("close", event="files_unknown", error=sentence(exc, "git diff failed"))
            try:
                push = publication.push(session.s.branch, session.s.outcome, changed_after=changed_after)
            except Exception as exc:
                push = {"pushed": False, "retry": True, "error": sentence(exc, "the push failed")}
            web_url = push.get("web_url")
            error = push.get("error")
            if commit is not None or push.get("sha"):
                push_state = after_close(push, session.config, publication.uses_gitea)
    destroyed, machine = session_boot.stop_machine(session)
    if not session.s.project_dir:
        body = "This session had no project folder: nothing was committed."
    elif commit_failed:
        try:
            kept = publication.last_commit()
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
    if changed_after:
        body += (f" The project folder changed after vmd verified commit {changed_after[:10]}: the later "
                 "files are committed but NOT verified (a new finish would have verified them).")
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
              "ended_by": "vmd" if reason else "client", "reason": reason, "changed_after": changed_after,
              "push": push_state.view() if push_state else None, "text": text}
    with session.lock:
        session.s.push = push_state
        session.s.close = closed
        session.s.state = "closed"
        session.save()
    session.record.append("close", **closed, push_pending=bool(push_state and push_state.state == "pending"),
                          duration=round(time.monotonic() - started, 3))
    return closed


def _changed_after(session: Session, publication: Publication, commit: str | None) -> str | None:
    """The verified commit, when the close's commit holds other files than it (a process
    the model left running changed the folder after the check): those are not verified."""
    candidate = (session.s.outcome or {}).get("candidate")
    if not candidate or not commit:
        return None
    if publication.same_tree(commit, candidate):
        return None
    return candidate


def _commit_message(session: Session, changed_after: str | None = None) -> str:
    title = (session.s.task.strip().splitlines() or ["vmagent session"])[0][:72]
    body = [f"vmagent session {session.s.id}", "", "Tasks:", session.tasks.render()]
    if session.s.outcome and changed_after:
        o = session.s.outcome
        body += ["", f"NOT verified by vmd: its check (`{o['command']}`) ran on commit {changed_after}, "
                     "and the project folder changed after it; these files were never checked."]
    elif session.s.outcome:
        o = session.s.outcome
        where = Verdict.of_outcome(o).place(o.get("candidate"))
        setup = f" after the setup `{o['setup_command']}`" if o.get("setup_command") else ""
        body += ["", f"Verification by vmd: `{o['command']}`{setup} exited {o['exit_code']} (expected "
                     f"{o['expect_exit']}){where}: {Verdict.of_outcome(o).sentence()}; "
                     f"{o.get('attempts', 1)} attempt(s)."]
    else:
        body += ["", "Not verified by vmd: the session did not finish."]
    return title + "\n\n" + "\n".join(body)


HANDLERS = {
    "finish": finish,
    "session_close": session_close,
}
