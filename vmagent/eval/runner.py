"""Running the eval's tasks through the normal path: for each task, its starting project
is committed by vmd (a short session of its own that writes the files), then one job runs
the task through the same loop, vmd and machines as `vmagent run`, with the task's hidden
check handed to the loop, which asks vmd to run it in the guest after the model's last
turn (JobSpec.hidden_check). A question is answered from the task folder; a request to
open the network is declined (tasks run offline)."""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vmagent import loop
from vmagent.link import Vmd, VmdError, VmdUnavailable
from vmagent.config import AgentConfig
from vmagent.eval.tasks import EvalTask
from vmagent.loop.job import Outcome

# The owner folder of every eval project in vmd (and on Gitea, when one is set).
EVAL_OWNER = "eval"
# A person's answers per run at most: a model that keeps asking is not waited for forever.
MAX_ANSWERS = 3
# The seed session waits this long for its machine: a cold TCG boot took ~60 s here.
SEED_BOOT_S = 600.0
NO_ANSWER = ("No one can answer in this evaluation. Make a sensible choice yourself, say which in your "
             "summary, and finish the work.")
# How often the main thread wakes while runs go on, to take a Ctrl-C (`_wait_all`).
WAKE_S = 0.5
DECLINED = "Declined: this evaluation runs offline. Do the work with what the machine has."


class Interrupted(Exception):
    """Ctrl-C during an eval: the jobs in flight were cancelled; `runs` are the ones that ended."""

    def __init__(self, runs: list["TaskRun"]):
        super().__init__(f"interrupted after {len(runs)} runs")
        self.runs = runs


@dataclass
class TaskRun:
    """One run of one task: what the job ended with, and what it cost."""

    task: EvalTask
    round: int  # 1..repeat
    project: str
    outcome: Outcome
    wall_s: float
    answers: int = 0
    report_path: Path | None = None


def project_name(task: EvalTask, run_id: str, round_no: int) -> str:
    """A fresh project per run, so that every run starts from the task's own files."""
    return f"{task.name[:60]}-{run_id}-{round_no}"


def seed_project(socket: str, task: EvalTask, project: str) -> None:
    """Commits the task's starting files as the project's first commit, through vmd: a
    session that plans one task, writes the files into the project folder, and closes
    (vmd commits). The job's session then opens on that commit, which is also the
    baseline its check is compared with. Raises VmdError or VmdUnavailable."""
    with Vmd(socket, timeout=SEED_BOOT_S + 60) as vmd:
        vmd.call("session_open", os=task.meta.os, project=project, owner=EVAL_OWNER,
                 task=f"eval: the starting project of task {task.name}", wait=False)
        try:
            vmd.call("plan_tasks", tasks=["write the starting project"])
            vmd.call("session_ready", timeout=SEED_BOOT_S)
            for path, text in task.project_files.items():
                vmd.call("write_file", path=path, content=text)
            vmd.call("update_task", id=1, status="done", note="written by vmagent eval")
        finally:
            vmd.call("session_close")


def run_task(task: EvalTask, round_no: int, run_id: str, out_dir: Path, config: AgentConfig, socket: str,
             on_event: Callable[[str, dict], None] | None = None,
             cancel: threading.Event | None = None) -> TaskRun:
    """One run of `task`, to its end. Never raises: a run that cannot start is a failed
    outcome with the reason."""
    project = project_name(task, run_id, round_no)
    run_dir = out_dir / "runs" / f"{task.name}-{round_no}"
    run_dir.mkdir(parents=True, exist_ok=True)
    transcript = run_dir / "transcript.json"
    started = time.monotonic()
    events = (lambda event: on_event(task.name, event)) if on_event else (lambda event: None)
    if task.project_files:
        try:
            seed_project(socket, task, project)
        except (VmdError, VmdUnavailable, OSError) as exc:
            outcome = _not_started(f"the starting project could not be committed through vmd: {exc}")
            return _kept(TaskRun(task, round_no, project, outcome, time.monotonic() - started), run_dir)
    spec = loop.JobSpec(task=task.text, os=task.meta.os, project=project, owner=EVAL_OWNER, web=False,
                        hidden_check=task.hidden_check())
    cancel = cancel or threading.Event()
    outcome = loop.run_job(spec, on_event=events, cancel=cancel, transcript_path=transcript, config=config,
                           vmd_socket=socket)
    answers = 0
    while outcome.state in ("question", "unfreeze"):
        # Past the answers allowed (or once the eval is interrupted) the session is closed
        # without waking the model: the run ends cancelled.
        ending = cancel if answers < MAX_ANSWERS else _set(threading.Event())
        answers += 1
        if outcome.state == "question":
            outcome = loop.resume_job(transcript, answer=task.answer or NO_ANSWER, on_event=events, cancel=ending,
                                      config=config, vmd_socket=socket)
        else:
            outcome = loop.resume_job(transcript, answer=DECLINED, approved=False, on_event=events, cancel=ending,
                                      config=config, vmd_socket=socket)
    return _kept(TaskRun(task, round_no, project, outcome, time.monotonic() - started, answers), run_dir)


def run_all(tasks: list[EvalTask], *, repeat: int, concurrency: int, out_dir: Path, config: AgentConfig,
            socket: str, on_done: Callable[[TaskRun], None] | None = None,
            on_event: Callable[[str, dict], None] | None = None) -> list[TaskRun]:
    """Every task `repeat` times, `concurrency` jobs at once; the runs in task order.
    Ctrl-C (KeyboardInterrupt) cancels the jobs in flight, which close their sessions and
    report, starts no more, and raises Interrupted with the runs that ended."""
    run_id = time.strftime("%m%d%H%M") + secrets.token_hex(2)
    work = [(task, round_no) for round_no in range(1, repeat + 1) for task in tasks]
    lock = threading.Lock()
    cancel = threading.Event()

    ended: list[TaskRun] = []

    def one(item: tuple[EvalTask, int]) -> TaskRun:
        done = run_task(item[0], item[1], run_id, out_dir, config, socket, on_event, cancel)
        with lock:
            ended.append(done)
            if on_done:
                on_done(done)
        return done

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="eval") as pool:
        try:
            _wait_all([pool.submit(one, item) for item in work])
        except KeyboardInterrupt:
            cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise Interrupted(_in_order(tasks, ended)) from None
    return _in_order(tasks, ended)


def _wait_all(futures: list[Future]) -> None:
    """Waits for every run, in short waits: a Ctrl-C is a SIGINT to the process, which the
    kernel may hand to any of its threads (a job's, an HTTP client's). Python then runs its
    handler on the main thread only once that thread runs again, and a main thread blocked
    in one long wait on a run (`pool.map`) did not, until that run ended: in CI a run went on
    to its end and the next round started before the KeyboardInterrupt came."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=WAKE_S, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()  # a run's own failure ends the eval, as before


def _in_order(tasks: list[EvalTask], runs: list[TaskRun]) -> list[TaskRun]:
    order = {task.name: i for i, task in enumerate(tasks)}
    return sorted(runs, key=lambda r: (order[r.task.name], r.round))


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


def _not_started(reason: str) -> Outcome:
    return Outcome(state="failed", report=f"# Eval run failed\n\n{reason}\n", session_id=None, question=None,
                   verification_passed=None, steps=0, reason=reason)


def _kept(run: TaskRun, run_dir: Path) -> TaskRun:
    """The report beside the transcript, for the page to link."""
    path = run_dir / "report.md"
    try:
        path.write_text(run.outcome.report, encoding="utf-8")
        run.report_path = path
    except OSError:
        pass
    return run
