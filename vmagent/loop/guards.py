"""The loop's guards, checked every turn (vmagent/loop/turns.py `_turn`): each one either ends
the job with the reason for the report, or puts a notice or a reminder in front of the
model. Each says why it exists; the numbers are in vmagent/config.py."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass

from vmagent import tools
from vmagent.config import AgentConfig
from vmagent.loop.job import Ending, Job
from vmagent.models import Model, ModelError, Reply
from vmagent.tools import USE_THE_TOOL_INTERFACE, ToolOutcome, calls_in_text
from vmd.contract.results import SessionStatusResult


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
        return Ending("failed", f"Stopped at the turn cap ({config.max_steps} model turns) without a finish.")
    return None


def machine_gone(status: SessionStatusResult) -> Ending | None:
    # A failed or destroyed guest will not come back in this session; every further
    # turn would only collect errors. The project folder is on the host and is kept.
    machine = status.machine
    if machine.startswith("failed") or (machine == "destroyed" and status.state != "closed"):
        return Ending("failed", f"The machine is gone ({machine}); the project folder was kept.")
    return None


def model_unfit(llm: Model) -> str | None:
    """Why the model cannot run a job, as a sentence for the report; None when it can."""
    try:
        capabilities = llm.capabilities()
    except ModelError as exc:
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
    calls in the order written (any tool named, so that one of the other phase, or one that
    does not exist, gets its sentence from tools.call), and the notice to use the tool
    interface, given once per job."""
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
    # A task list that has not moved for many turns usually means the agent forgot it,
    # or is stuck on one task; showing it again is cheap.
    if job.guards.steps_since_tasks_moved < config.stall_reminder_steps:
        return
    job.guards.steps_since_tasks_moved = 0
    job.messages.append({"role": "user", "content": (
        f"[vmagent: the task list has not changed in {config.stall_reminder_steps} turns.] Check it "
        "against what you have done: mark finished tasks done (with how you verified them), mark "
        "a task blocked if it cannot be done, or change approach.\n\n" + (job.tasks_text or "(no tasks)"))})


# --- the stuck detector -------------------------------------------------------------------
# A model in a loop does not get out by itself: one that repeated a refused finish got the
# same refusal 100 times, to the turn cap. Every tool call of the job leaves a step (its
# call and its answer, as digests); each pattern below is one way of going in circles,
# read over the newest steps. Answers are compared, not only calls: a build polled with
# `sleep 30; tail log` whose output changes is work, not a loop. The first hit of a
# pattern is told to the model with what to do instead; the next one ends the job.

# Durations in an answer ("exit code 0 (0.4 s)") change from run to run; what they time does not.
_DURATION = re.compile(r"\b\d+(?:\.\d+)?\s?m?s\b")
# `sleep 30` (or `sleep 2m`) in a command: the command waits for something before it looks.
_SLEEP = re.compile(r"\bsleep\s+(\d+(?:\.\d+)?)([smh]?)\b")
_SLEEP_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600}


@dataclass
class Stuck:
    pattern: str  # "refused" | "same_answer" | "alternation" | "cycle"
    labels: list[str]
    count: int


def _digest(value: object) -> str:
    return hashlib.sha1(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _label(verb: str, params: object) -> str:
    if verb == "run" and isinstance(params, dict) and params.get("command"):
        shown = str(params["command"])
    else:
        shown = json.dumps(params, ensure_ascii=False, default=str) if params else ""
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"`{verb} {shown}`" if shown else f"`{verb}`"


def waited_s(verb: str, params: object) -> float:
    """Seconds a call spends waiting on purpose: `wait`'s seconds, or the `sleep`s of a command."""
    if not isinstance(params, dict):
        return 0.0
    try:
        if verb == "wait":
            return max(0.0, float(params.get("seconds") or 0))
        if verb == "run":
            return sum(float(n) * _SLEEP_UNIT_S[unit] for n, unit in _SLEEP.findall(str(params.get("command") or "")))
    except (TypeError, ValueError):
        pass
    return 0.0


def call_step(verb: str, params: object, outcome: ToolOutcome) -> dict:
    """What the stuck detector keeps of one tool call: which call, which answer, refused or not,
    and how long it waited on purpose."""
    result = outcome.result or {}
    if verb == "run" and outcome.ok:  # the output itself, not the text that times it
        answer = [result.get("exit_code"), result.get("stdout"), result.get("stderr")]
    else:
        answer = [_DURATION.sub("#", outcome.text), _digest(outcome.image_b64) if outcome.image_b64 else None]
    return {"call": _digest([verb, params]), "answer": _digest(answer), "refused": not outcome.ok,
            "verb": verb, "label": _label(verb, params), "waited_s": waited_s(verb, params)}


def same_call_refused(steps: list[dict], n: int) -> Stuck | None:
    # The same verb refused n times in a row, by the same call or with the same refusal
    # (a finish with a reworded summary is refused in the same words while a task is open).
    last = steps[-n:]
    if len(last) < n or not all(s["refused"] and s["verb"] == last[0]["verb"] for s in last):
        return None
    if all(s["call"] == last[0]["call"] for s in last) or all(s["answer"] == last[0]["answer"] for s in last):
        return Stuck("refused", [last[-1]["label"]], n)
    return None


def same_call_same_answer(steps: list[dict], n: int) -> Stuck | None:
    last = steps[-n:]
    if len(last) == n and all(s["call"] == last[0]["call"] and s["answer"] == last[0]["answer"] for s in last):
        return Stuck("same_answer", [last[0]["label"]], n)
    return None


def alternation(steps: list[dict], n: int) -> Stuck | None:
    # A-B-A-B: two calls taking turns, each answered the same every time.
    last = steps[-n:]
    if len(last) < n or last[0]["call"] == last[1]["call"]:
        return None
    pair = last[:2]
    if all(s["call"] == pair[i % 2]["call"] and s["answer"] == pair[i % 2]["answer"] for i, s in enumerate(last)):
        return Stuck("alternation", [pair[0]["label"], pair[1]["label"]], n)
    return None


def cycle(steps: list[dict], max_len: int, repeats: int) -> Stuck | None:
    # A B C A B C A B C: a run of 3 to max_len calls repeated, each call answered the same
    # each time (two calls taking turns are `alternation`, one call `same_call_same_answer`).
    # A screen that changes (an installer's) is another answer, so such a round is work.
    for n in range(3, max_len + 1):
        last = steps[-n * repeats:]
        if len(last) < n * repeats:
            return None
        keys = [(s["call"], s["answer"]) for s in last]
        if all(keys[i] == keys[i % n] for i in range(len(keys))) and len(set(keys[:n])) > 1:
            return Stuck("cycle", [s["label"] for s in last[:n]], len(last))
    return None


def stuck_notice(job: Job, step: dict, config: AgentConfig) -> str:
    """Records one tool call; a notice for its result when the newest calls go in circles.
    A pattern hit for the stuck_hits_to_end-th time sets job.guards.stuck_end instead,
    the sentence for the report (the loop ends the job on it, `stuck_ending`)."""
    guards = job.guards
    if guards.poll_pairs and [step["call"], step["answer"]] not in guards.poll_pairs:
        guards.poll_waited_s, guards.poll_pairs = 0.0, []  # something changed: the poll saw it
    guards.recent_calls = (guards.recent_calls + [step])[-max(config.stuck_same_answer, config.stuck_refused,
                                                               config.stuck_alternation,
                                                               config.stuck_cycle_len * config.stuck_cycle_repeats):]
    steps = guards.recent_calls
    hit = (same_call_refused(steps, config.stuck_refused) or same_call_same_answer(steps, config.stuck_same_answer)
           or alternation(steps, config.stuck_alternation)
           or cycle(steps, config.stuck_cycle_len, config.stuck_cycle_repeats))
    if hit is None:
        return ""
    guards.recent_calls = []  # the next hit needs as many calls again, after the notice
    if hit.pattern != "refused" and still_polling(guards, steps[-hit.count:], config):
        return ""
    guards.stuck_hits[hit.pattern] = hits = guards.stuck_hits.get(hit.pattern, 0) + 1
    if hits >= config.stuck_hits_to_end:
        guards.stuck_end = _stuck_report(hit, hits)
        told = ", after you were told to change approach" if hits > 1 else ""
        return f"\n[vmagent: {_stuck_what(hit, step)}{told}. The job ends here as failed.]"
    return f"\n[vmagent: {_stuck_what(hit, step)}. {_STUCK_INSTEAD[hit.pattern]}]"


def still_polling(guards, window: list[dict], config: AgentConfig) -> bool:
    # A repeat that waits on purpose is a poll, and a poll is allowed stuck_poll_s of
    # unchanging answers (an installer's screen, a quiet build log) before it is a loop.
    waited = sum(s.get("waited_s") or 0.0 for s in window)
    if not waited:
        return False
    guards.poll_waited_s += waited
    guards.poll_pairs = [list(p) for p in {(s["call"], s["answer"]) for s in window} | {tuple(p) for p in guards.poll_pairs}]
    if guards.poll_waited_s < config.stuck_poll_s:
        return True
    guards.poll_waited_s, guards.poll_pairs = 0.0, []
    return False


_STUCK_INSTEAD = {
    "refused": ("Calling it again will be refused again. Do what the refusal asks first, change approach, or "
                "mark the task blocked with update_task and the reason. If you repeat it, the job ends as failed."),
    "same_answer": ("Calling it again will not change it: read the answer and change the approach, or mark the "
                    "task blocked with update_task and the reason. If you repeat it, the job ends as failed."),
    "alternation": ("This is a loop: change approach, or mark the task blocked with update_task and the "
                    "reason. If the loop goes on, the job ends as failed."),
}
_STUCK_INSTEAD["cycle"] = _STUCK_INSTEAD["alternation"]


def _stuck_what(hit: Stuck, step: dict) -> str:
    if hit.pattern == "refused":
        return f"{hit.labels[0]} was refused {hit.count} times in a row"
    if hit.pattern == "same_answer":
        what = "this command" if step["verb"] == "run" else f"this call ({hit.labels[0]})"
        return f"{what} has given this same result {hit.count} times in a row"
    if hit.pattern == "cycle":
        return (f"you repeated the same {len(hit.labels)} calls ({', '.join(hit.labels)}) "
                f"{hit.count // len(hit.labels)} times in a row, with the same answers")
    return f"you alternated between {hit.labels[0]} and {hit.labels[1]} {hit.count} times, with the same answers"


def _stuck_report(hit: Stuck, hits: int) -> str:
    if hit.pattern == "refused":
        what = f"{hit.labels[0]} was refused {hit.count} times in a row"
    elif hit.pattern == "same_answer":
        what = f"{hit.labels[0]} gave the same answer {hit.count} times in a row"
    elif hit.pattern == "cycle":
        what = (f"it repeated the same {len(hit.labels)} calls ({', '.join(hit.labels)}) "
                f"{hit.count // len(hit.labels)} times in a row ({hit.count} calls, the same answers)")
    else:
        what = f"it alternated between {hit.labels[0]} and {hit.labels[1]} ({hit.count} calls, the same answers)"
    if hits == 1:
        return f"Stopped: the model was stuck in a loop: {what}."
    again = "again" if hits == 2 else f"{hits - 1} times more"
    return (f"Stopped: the model was stuck in a loop: {what}, and {again} after it was told to change "
            f"approach ({hits * hit.count} calls in all).")


def stuck_ending(job: Job) -> Ending | None:
    # Set by stuck_notice on a pattern's last allowed hit.
    if job.guards.stuck_end:
        return Ending("failed", job.guards.stuck_end)
    return None
