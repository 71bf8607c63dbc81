"""What the loop tells the model and the report in its own words: the opening message,
the hand-over of the machine, a person's answer, a result lost to a vmd restart, vmd gone
for good. The guards' sentences are with the guards (vmagent/loop/guards.py)."""

from __future__ import annotations

from vmagent import tools
from vmagent.link import VmdGone
from vmagent.loop.job import Job, JobSpec
from vmagent.os_family import os_family_of
from vmd.contract.results import SessionOpenResult

# What the model reads for a tool call whose result vmd lost when it restarted. It is not
# run again: a command may have run in part, in full or not at all, and only a look at
# its effects tells which.
RESULT_LOST_RUN = ("INTERRUPTED: the command's result was lost when vmd restarted (vmd was away {seconds:.0f} s); "
                   "it may have run in part, in full or not at all. Check its effects before running it again.")
RESULT_LOST = ("INTERRUPTED: the result of {verb} was lost when vmd restarted (vmd was away {seconds:.0f} s); it "
               "may or may not have taken effect. Check its effects before calling it again.")


def result_lost(verb: str, seconds: float) -> str:
    return (RESULT_LOST_RUN if verb == "run" else RESULT_LOST).format(verb=verb, seconds=seconds)


def opening_message(spec: JobSpec, opened: SessionOpenResult,
                    web_tools: "list[str] | tuple[str, ...]" = ()) -> str:
    where = tools.OS_WORDS[os_family_of(spec.os, opened.os_family)]
    storage = opened.storage
    # The tools that work now are named, not the many that wait: this message is in every
    # request of the job, so each word of it costs every turn.
    now = list(tools.PLANNING_TOOLS) + list(web_tools)
    web = (f" Use {' and '.join(web_tools)} (outside the machine) to look up what you are not sure of "
           "instead of guessing." if web_tools else "")
    return (
        f"The task:\n\n{spec.task.strip()}\n\n"
        f"A {spec.os} machine is booting for you now ({where['shell']}; the project folder "
        f"will be {where['project']}). {('Storage: ' + storage + '.') if storage else ''}\n"
        f"Plan first with plan_tasks. Until the machine is up only {', '.join(now)} work; a message "
        "says when it is up." + web
    )


def machine_up_message(job: Job, facts: dict, screen_rules: str | None = None) -> str:
    """The hand-over: what the machine is (machine_facts), then the task list. A message at
    the end of the conversation: the system prompt, the head of every request, stays as it was."""
    return (machine_facts(job, facts, screen_rules) + "\nWork through the task list, keeping it true as you go:\n"
            + (job.tasks_text or ""))


def machine_facts(job: Job, facts: dict, screen_rules: str | None = None) -> str:
    """The machine's facts, whether it has a desktop (with the screen's rules when the
    system prompt does not hold them) and the tools that work now; what a compaction
    restates of the hand-over (the task list it restates from vmd's state)."""
    shown = {k: v for k, v in facts.items() if v not in (None, "", [], {}) and k != "boot_id"}
    if job.machine_came == "warm":
        lines = [f"The machine is up: a warm one, ready in {job.boot_seconds or 0:.0f} s."]
    else:
        lines = [f"The machine is up: it took {job.boot_seconds or 0:.0f} s to boot."]
    lines += [f"- {k}: {v}" for k, v in shown.items()]
    if job.screen is False:
        lines.append("It has no desktop.")  # its image said so: no screen tool was ever offered
    elif job.desktop:
        lines.append(f"It has a desktop: the screen tools work ({', '.join(tools.SCREEN_TOOLS)}).")
        if screen_rules:
            lines.append(screen_rules.strip())
    else:
        lines.append(f"It has no desktop: the screen tools ({', '.join(tools.SCREEN_TOOLS)}) do not work "
                     "on this machine; use run and the file tools.")
    usable = [name for name in tools.tool_names("working", job.desktop) if name not in tools.PLANNING_TOOLS]
    lines.append(f"The machine's tools work now: {', '.join(usable)}.")
    return "\n".join(lines)


def answer_text(answer: str | None, approved: bool | None) -> str:
    if approved is not None:
        return f"The person {'approved' if approved else 'declined'} your request." + (
            f" They said: {answer}" if answer else "")
    return f"The person answered: {answer or '(no answer given)'}"


def vmd_gone(exc: VmdGone) -> str:
    return (f"{str(exc).rstrip('.')}; the loop stopped waiting. vmd closes the session itself (commit and "
            "push) once it is back; the session's record stays in vmd's state dir.")


# A job run again after its host was lost (vmagent/loop/rerun.py): what the model reads first on
# the new machine, and what a tool call in flight when the host went is answered with.
RESULT_LOST_WITH_HOST = ("INTERRUPTED: the machine was lost with its host before this call's result came back; "
                         "it may or may not have taken effect there. The new machine has the project as the "
                         "next message says.")


def host_lost(lost: str, checkpoint: str | None) -> str:
    """`checkpoint`: the subject of this job's last checkpoint the new machine has
    ("Task 2 done: write greet.py"), None when it has none of this job's."""
    where = (f"as of '{checkpoint}'" if checkpoint
             else "as of its start (no checkpoint of this job had reached it)")
    return (f"The machine was lost with its host ({lost.strip().rstrip('.') or 'no reason given'}); a new "
            f"machine has the project {where}. Its task list went with the old machine: write it again with "
            "plan_tasks (tasks already done may be marked done at once) and carry on. The machine's tools wait "
            "for that plan; a message says when the new machine is up.")


def rerun_status(checkpoint: str | None, lost: str) -> str:
    """The event feed's line when the job starts again elsewhere."""
    start = f"from the checkpoint '{checkpoint}'" if checkpoint else "from its start"
    return f"the job runs again on a new machine: {start} (the host was lost: {lost.strip().rstrip('.')})"
