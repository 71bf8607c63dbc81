"""What the loop tells the model and the report in its own words: the opening message,
the hand-over of the machine, a person's answer, a result lost to a vmd restart, vmd gone
for good. The guards' sentences are with the guards (vmagent/loop_guards.py)."""

from __future__ import annotations

from vmagent import tools
from vmagent.client import VmdGone
from vmagent.job import Job, JobSpec

# What the model reads for a tool call whose result vmd lost when it restarted. It is not
# run again: a command may have run in part, in full or not at all, and only a look at
# its effects tells which.
RESULT_LOST_RUN = ("INTERRUPTED: the command's result was lost when vmd restarted (vmd was away {seconds:.0f} s); "
                   "it may have run in part, in full or not at all. Check its effects before running it again.")
RESULT_LOST = ("INTERRUPTED: the result of {verb} was lost when vmd restarted (vmd was away {seconds:.0f} s); it "
               "may or may not have taken effect. Check its effects before calling it again.")


def result_lost(verb: str, seconds: float) -> str:
    return (RESULT_LOST_RUN if verb == "run" else RESULT_LOST).format(verb=verb, seconds=seconds)


def opening_message(spec: JobSpec, opened: dict) -> str:
    where = tools.OS_WORDS[tools.os_family_of(spec.os)]
    storage = opened.get("storage") or ""
    return (
        f"The task:\n\n{spec.task.strip()}\n\n"
        f"A {spec.os} machine is booting for you now ({where['shell']}; the project folder "
        f"will be {where['project']}). {('Storage: ' + storage + '.') if storage else ''}\n"
        "First write the task list with plan_tasks: short, checkable steps in the order you "
        "will do them, the last one the check that proves the result. The machine's tools "
        "appear once the plan exists and the machine is up."
    )


def machine_up_message(job: Job, facts: dict) -> str:
    shown = {k: v for k, v in facts.items() if v not in (None, "", [], {}) and k != "boot_id"}
    if job.machine_came == "warm":
        lines = [f"The machine is up: a warm one, ready in {job.boot_seconds or 0:.0f} s."]
    else:
        lines = [f"The machine is up: it took {job.boot_seconds or 0:.0f} s to boot."]
    lines += [f"- {k}: {v}" for k, v in shown.items()]
    offered = tools.tool_names("working", job.desktop)
    lines.append(f"All tools are available now: {', '.join(offered)}.")
    lines.append("Work through the task list, keeping it true as you go:\n" + (job.tasks_text or ""))
    return "\n".join(lines)


def answer_text(answer: str | None, approved: bool | None) -> str:
    if approved is not None:
        return f"The person {'approved' if approved else 'declined'} your request." + (
            f" They said: {answer}" if answer else "")
    return f"The person answered: {answer or '(no answer given)'}"


def vmd_gone(exc: VmdGone) -> str:
    return (f"{str(exc).rstrip('.')}; the loop stopped waiting. vmd closes the session itself (commit and "
            "push) once it is back; the session's record stays in vmd's state dir.")
