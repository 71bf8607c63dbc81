"""The loop's guards, checked every turn (vmagent/loop.py `_turn`): each one either ends
the job with the reason for the report, or puts a notice or a reminder in front of the
model. Each says why it exists; the numbers are in vmagent/config.py."""

from __future__ import annotations

import hashlib
import json
import threading

from vmagent import tools
from vmagent.config import AgentConfig
from vmagent.job import Ending, Job
from vmagent.llm import LLM, OllamaError, Reply
from vmagent.text_calls import USE_THE_TOOL_INTERFACE, calls_in_text


def cancelled(cancel: threading.Event) -> Ending | None:
    # Checked every turn: a person who cancels gets the report of what was done so far.
    if cancel.is_set():
        return Ending("cancelled", "Cancelled by the user.")
    return None


def past_deadline(job: Job, config: AgentConfig) -> Ending | None:
    # The promise made to the person is a result within the deadline, not a longer try.
    if job.active_seconds() >= config.deadline_s:
        return Ending("failed", f"Stopped at the session deadline ({config.deadline_s / 60:.0f} min of work).")
    return None


def at_step_cap(job: Job, config: AgentConfig) -> Ending | None:
    # Past the cap the bench's sessions were going in circles; a report helps more.
    if job.steps >= config.max_steps:
        return Ending("failed", f"Stopped at the step cap ({config.max_steps} model turns) without a finish.")
    return None


def machine_gone(status: dict) -> Ending | None:
    # A failed or destroyed guest will not come back in this session; every further
    # turn would only collect errors. The project folder is on the host and is kept.
    machine = str(status.get("machine") or "")
    if machine.startswith("failed") or (machine == "destroyed" and status.get("state") != "closed"):
        return Ending("failed", f"The machine is gone ({machine}); the project folder was kept.")
    return None


def model_unfit(llm: LLM) -> str | None:
    """Why the model cannot run a job, as a sentence for the report; None when it can."""
    try:
        capabilities = llm.capabilities()
    except OllamaError as exc:
        return f"The job could not start: {exc}"
    # An empty list: an Ollama too old to report capabilities; the first chat will tell.
    if capabilities and "tools" not in capabilities:
        return (f"The job could not start: the model {llm.model} cannot call tools (Ollama lists its "
                f"capabilities as {', '.join(capabilities)}), and the agent works only through tool "
                f"calls. Set VMAGENT_MODEL to a model with tool calling, such as qwen3-vl:32b (tools "
                f"and vision), and pull it with `ollama pull` on the Ollama server. No machine was started.")
    return None


def calls_written_as_text(job: Job, reply: Reply) -> tuple[Reply, str]:
    """A reply with no tool_calls whose content holds calls as text: the calls, run as
    calls (any known tool, so that one of the other phase gets its sentence from
    tools.call), and the notice to use the tool interface, given once per job."""
    if reply.tool_calls:
        return reply, ""
    recovered = calls_in_text(reply.content, tools.TOOLS)
    if not recovered:
        return reply, ""
    # The history shows them as real calls, so the model is not shown its own habit.
    reply = reply.model_copy(update={"tool_calls": recovered, "content": ""})
    if job.guards.told_tool_interface:
        return reply, ""
    job.guards.told_tool_interface = True
    return reply, USE_THE_TOOL_INTERFACE


def prose_only(job: Job, content: str, config: AgentConfig) -> Ending | None:
    # Work happens only through tool calls. Small models drift into describing what they
    # would do; a nudge with the task list brings most back, three ignored ones mean the
    # model has lost the tool protocol.
    job.guards.prose_streak += 1
    if job.guards.prose_streak > config.max_prose_replies:
        return Ending("failed", f"The model answered {job.guards.prose_streak} times in a row without a "
                                "tool call after being reminded; stopped.")
    job.messages.append({"role": "assistant", "content": content})
    job.messages.append({"role": "user", "content": (
        "You replied without a tool call, and nothing happens without one. Call the tool for "
        "your next step now. If every task is done or blocked, call finish with a verification "
        "command.\n\nThe task list:\n" + (job.tasks_text or "(no tasks planned yet: call plan_tasks)"))})
    return None


def repeat_notice(job: Job, params: dict, result: dict, config: AgentConfig) -> str:
    # Models poll: the same command with the same result, again and again. The count is
    # of identical results (exit code and output), so a changing build log is not one.
    key = json.dumps([params.get("command"), params.get("cwd"), result.get("exit_code"),
                      result.get("stdout"), result.get("stderr")], ensure_ascii=False, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    count = job.guards.repeats.get(digest, 0) + 1
    job.guards.repeats[digest] = count
    if count < config.repeat_notice_after:
        return ""
    return (f"\n[vmagent: this command has given this same result {count} times. Running it again "
            "will not change it: read the output, change the approach, or mark the task blocked "
            "with the reason.]")


def stall_reminder(job: Job, config: AgentConfig) -> None:
    # A task list that has not moved for many steps usually means the agent forgot it,
    # or is stuck on one task; showing it again is cheap.
    if job.guards.steps_since_tasks_moved < config.stall_reminder_steps:
        return
    job.guards.steps_since_tasks_moved = 0
    job.messages.append({"role": "user", "content": (
        f"[vmagent: the task list has not changed in {config.stall_reminder_steps} steps.] Check it "
        "against what you have done: mark finished tasks done (with how you verified them), mark "
        "a task blocked if it cannot be done, or change approach.\n\n" + (job.tasks_text or "(no tasks)"))})
