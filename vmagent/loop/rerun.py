"""A job run again on a new machine after its host was lost.

    rerun_job(transcript_path, lost="host a: node died", on_event=...)

The worker runs this in mode "rerun" (vmagent/worker.py): the job service's Ray shim saw
the job's host die (vmagent/service/ray_worker.py) and started the job on another host with
the last transcript it had and a sentence saying what happened. The old session went
with its host; its machine, its task list and whatever was not yet committed are gone.
What survives is every checkpoint that vmd pushed to Gitea when a task was closed
(vmd/session/handlers/task_verbs.py), so a NEW session for the same spec opens the
project at the last of them, on whichever vmd this worker talks to.

The conversation carries on: the model is told, in a message (vmagent/loop/words.py
`host_lost`), which checkpoint the new machine has and that its task list must be written
again. The job goes back to planning, so the hand-over (vmagent/loop/hand_over.py) tells it when
the new machine is up, as at the start. Then the loop's own `work` runs it to its end.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Callable

from vmagent.link import Vmd, VmdError, VmdUnavailable, default_socket
from vmagent.config import AgentConfig, ConfigError
from vmagent.loop.job import Event, Events, Guards, Job, JobSpec, Outcome
from vmagent.loop.job_end import end_without_session
from vmagent.loop.turns import config_for, session_link, work
from vmagent.loop.guards import model_unfit
from vmagent.loop.words import RESULT_LOST_WITH_HOST, answer_text, host_lost, rerun_status
from vmagent.models import open_model
from vmagent.web.agent_tools import WebTools

# What update_task answers for a closed task (vmd/session/handlers/task_verbs.py); the
# checkpoints this job made are the ones its transcript was told about.
_CHECKPOINT_SAID = re.compile(r"Checkpoint ([0-9a-f]{10}) committed")
_COMMIT_LINE = re.compile(r"^commit ([0-9a-f]{40,64})\b")


def rerun_job(
    transcript_path: Path,
    *,
    lost: str,
    on_event: Callable[[Event], None],
    cancel: threading.Event | None = None,
    config: AgentConfig | None = None,
    vmd_socket: str | None = None,
    answer: str | None = None,
    approved: bool | None = None,
) -> Outcome:
    """Run a job again, in a new session, from its last pushed checkpoint. Never raises.
    `answer`, `approved`: a person's answer to the question the job waited on when its
    host went (a resume whose host is gone becomes a rerun); the model reads it with the
    news of the new machine."""
    events = Events(on_event)
    cancel = cancel or threading.Event()
    lost = (lost or "").strip() or "the host stopped answering"
    try:
        job = Job.load(Path(transcript_path))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        job = Job(spec=JobSpec(task="(unknown: the transcript could not be read)"), transcript_path=Path(transcript_path))
        return end_without_session(job, events, f"The job's host was lost ({lost}) and the job cannot run again: "
                                                 f"its transcript {transcript_path} could not be read ({exc}).")
    if not job.messages:
        return end_without_session(job, events, f"The job's host was lost ({lost}) and the job cannot run again: "
                                                 "its transcript holds no conversation.")
    lost_session = job.session_id
    try:
        config = config_for(job.spec, config)
    except ConfigError as exc:
        return end_without_session(job, events, f"The job could not run again after its host was lost: {exc}")
    llm = open_model(config)
    unfit = model_unfit(llm)
    if unfit:
        return end_without_session(job, events, unfit)
    spec = job.spec
    vmd = Vmd(vmd_socket or default_socket(), on_notify=events.from_vmd)
    try:
        opened = vmd.call("session_open", os=spec.os, project=spec.project, owner=spec.owner,
                          task=spec.task, wait=False, chat_id=spec.chat_id)
    except (VmdUnavailable, VmdError) as exc:
        return end_without_session(job, events, f"The job's host was lost ({lost}); vmd could not open a "
                                                 f"session on a new machine: {exc}")
    _start_over(job)
    job.session_id = opened.session_id
    job.answered_os_family = opened.os_family or job.answered_os_family
    checkpoint = checkpoint_of(vmd, job, lost_session)
    link = session_link(vmd, config, events, cancel)
    events.emit({"type": "session", "session_id": job.session_id})
    events.emit({"type": "status", "text": rerun_status(checkpoint, lost)})
    _answer_calls_in_flight(job)
    told = host_lost(lost, checkpoint)
    if answer or approved is not None:
        told += "\n\n" + answer_text(answer, approved)
    job.messages.append({"role": "user", "content": told})
    # The report's notes say it too (vmagent/loop/fallback_report.py loop_notes).
    job.notes.append(f"The host of session {lost_session or '(none)'} was lost ({lost}); the job ran again in "
                     f"session {job.session_id} " + (f"from the checkpoint '{checkpoint}'." if checkpoint
                                                      else "from its start."))
    job.save()
    web = WebTools.from_config(config)
    web.names = tuple(name for name in web.names if name in job.web_tools)  # as the job started
    return work(job, link, config, events, cancel, llm, web)


def _start_over(job: Job) -> None:
    """The job's state as a new machine finds it: no plan, no machine yet. What the loop
    counts across runs stays: the turns and tool calls, the time worked (the deadline is the
    job's), the tokens, the notes and the conversation itself."""
    job.state, job.question = "running", None
    job.phase = "planning"
    job.desktop = False
    job.boot_seconds = None
    job.machine_came = None
    job.machine_text = ""
    job.tasks_text = ""
    job.status_line = ""
    # The stuck detector's view was of the old machine's answers; the new one starts clean.
    job.guards = Guards(told_tool_interface=job.guards.told_tool_interface)


def checkpoint_of(vmd: Vmd, job: Job, lost_session: str | None) -> str | None:
    """The subject of the commit the new session's project was opened at, when it is one of
    this job's checkpoints (its transcript was told "Checkpoint <id> committed", or its
    message names the lost session); None otherwise: the project is as the job found it.
    Read through vmd's `history` verb, the same repository the new session was given."""
    if not job.spec.project:
        return None
    try:
        answer = vmd.call("history", owner=job.spec.owner or "", project=job.spec.project, what="log",
                          max_commits=1, max_bytes=8192)
    except (VmdError, VmdUnavailable):
        return None  # no history on this host (nothing was ever pushed): the job's start
    sha, subject, body = parse_last_commit(answer.text)
    if not sha or not subject:
        return None
    said = {m.group(1) for m in _CHECKPOINT_SAID.finditer(_transcript_text(job))}
    ours = sha[:10] in said or bool(lost_session and f"vmagent session {lost_session}" in body)
    return subject if ours else None


def parse_last_commit(log_text: str) -> tuple[str | None, str, str]:
    """(sha, subject, whole message) of the first commit in `git log --format=medium`."""
    sha, message, in_message = None, [], False
    for line in log_text.splitlines():
        found = _COMMIT_LINE.match(line)
        if found:
            if sha:
                break  # the next commit
            sha = found.group(1)
            continue
        if sha and not in_message and not line.strip():
            in_message = True
            continue
        if in_message:
            if line.startswith("    "):
                message.append(line[4:])
            elif line.strip():
                break  # the --stat lines after the message
            else:
                message.append("")
    text = "\n".join(message).strip()
    return sha, (text.splitlines() or [""])[0].strip(), text


def _transcript_text(job: Job) -> str:
    return "\n".join(str(m.get("content") or "") for m in job.messages if m.get("role") == "tool")


def _answer_calls_in_flight(job: Job) -> None:
    """A snapshot taken while the model's tool calls ran ends with calls that have no
    answer; each gets one saying the host went, so the conversation stays well formed."""
    last = job.messages[-1] if job.messages else {}
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return
    for call in last["tool_calls"]:
        name = str((call.get("function") or {}).get("name") or "")
        job.messages.append({"role": "tool", "tool_name": name, "content": RESULT_LOST_WITH_HOST})
