"""`vmagent eval [--tasks DIR] [--only NAME…] [--repeat N] [--concurrency N] [--out DIR]`.

Runs every task of the set against the configured model server and vmd, prints the table
and the totals, and writes results.json and index.html to the output folder. Exit codes:
0 the runs ended (whatever they scored), 2 nothing ran (usage, a broken task folder, the
configuration, vmd or the model server not reachable), 130 interrupted (Ctrl-C: the jobs in
flight are cancelled and close their sessions; the runs that ended are scored and kept)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vmagent.terminal import EXIT_INTERRUPTED, EXIT_USAGE, show
from vmagent.link import Vmd, VmdUnavailable, default_socket
from vmagent.config import AgentConfig, ConfigError
from vmagent.eval.pages import write_results
from vmagent.eval.runner import Interrupted, TaskRun, run_all
from vmagent.eval.scores import row_of, table, totals_of
from vmagent.eval.tasks import EvalTaskError, load_tasks
from vmagent.loop.guards import model_unfit
from vmagent.models import open_model

DEFAULT_TASKS = Path("evals")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmagent eval", description="Run the eval task set and score the model.")
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="the task set's folder (default: evals)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these tasks")
    p.add_argument("--repeat", type=int, default=1, help="runs of each task (a spread for a model that is not "
                                                         "deterministic)")
    p.add_argument("--concurrency", type=int, default=1, help="jobs at once (each holds a machine)")
    p.add_argument("--out", type=Path, help="where to keep results.json, index.html and each run's report "
                                            "(default: eval-runs/<time>)")
    p.add_argument("--model", help="the model, as the server names it (default: from config / VMAGENT_MODEL)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.repeat <= 100 or not 1 <= args.concurrency <= 64:
        show("vmagent eval: --repeat must be 1 to 100 and --concurrency 1 to 64.", sys.stderr)
        return EXIT_USAGE
    socket = default_socket()
    try:
        tasks = load_tasks(args.tasks, args.only)
        config = AgentConfig.load()
        if args.model:
            config = config.model_copy(update={"model": args.model})
        Vmd(socket, timeout=10).connect().close()
    except (EvalTaskError, ConfigError, VmdUnavailable) as exc:
        show(f"vmagent eval: {exc}", sys.stderr)
        return EXIT_USAGE
    unfit = model_unfit(open_model(config))
    if unfit:
        show(f"vmagent eval: {unfit}", sys.stderr)
        return EXIT_USAGE
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    out_dir = args.out or Path("eval-runs") / time.strftime("%Y%m%d-%H%M%S")
    show(f"· {len(tasks)} task{'s' if len(tasks) != 1 else ''} x {args.repeat}, {args.concurrency} at once, "
         f"model {config.model}; results in {out_dir}", sys.stderr)

    def done(run: TaskRun) -> None:
        hidden = (run.outcome.hidden_check or {}).get("passed")
        show(f"· {run.task.name} #{run.round}: {run.outcome.state}, hidden check "
             f"{'passed' if hidden else 'not passed'} ({run.wall_s:.0f} s)", sys.stderr)

    interrupted = False
    try:
        runs = run_all(tasks, repeat=args.repeat, concurrency=args.concurrency, out_dir=out_dir, config=config,
                       socket=socket, on_done=done)
    except Interrupted as stop:
        show("vmagent eval: interrupted; the jobs in flight were cancelled (their sessions closed); the "
             f"{len(stop.runs)} runs that ended are scored below.", sys.stderr)
        runs, interrupted = stop.runs, True
    rows = [row_of(run, out_dir) for run in runs]
    totals = totals_of(rows)
    meta = {"model": config.model, "model_api": config.model_api, "started": started,
            "tasks_dir": str(args.tasks), "repeat": args.repeat, "concurrency": args.concurrency}
    json_path, html_path = write_results(out_dir, rows, totals, meta)
    show(table(rows, totals, config.model), sys.stdout)
    show(f"\nresults: {json_path}\npage:    {html_path}", sys.stdout)
    return EXIT_INTERRUPTED if interrupted else 0
