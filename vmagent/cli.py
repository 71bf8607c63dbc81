"""`vmagent run "TASK" …` (one job in this terminal), `vmagent serve` (the job service),
`vmagent eval` (vmagent/eval/command.py) and `vmagent hosts` (the service's hosts).

Each command imports what it needs when it runs: `vmagent run` loads no web server, Ray
or eval, and `vmagent serve` no turn loop.

Exit codes of `run`:
  0  done, verified and proven: vmd's own run of the agent's check passed, and the same
     check failed on the project as it was before the session;
  1  failed, or any other outcome (cancelled, waiting for a person);
  2  the job could not start (usage, configuration, a missing prompt.md, vmd not reachable,
     the model server not reachable or without the model);
  3  done, passed but not proven: the check passed, but it also passed on the project as
     it was before the session (or vmd could not run it there), so it does not show the
     work was done;
  130 a second Ctrl-C: the terminal was given back at once, and the session left for vmd
     to close.

The first Ctrl-C cancels the job: vmd hears of it at once, what is in flight is broken
off after a short grace (cancel_grace_s), the session closes (commit, push, the machine
destroyed) and the report is printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, TextIO

# The exit codes and show() live in vmagent/terminal.py, which `vmagent eval` shares.
from vmagent.terminal import (EXIT_DONE, EXIT_INTERRUPTED, EXIT_NOT_DONE, EXIT_NOT_PROVEN,  # noqa: F401
                              EXIT_USAGE, show)


class LeftToVmd(Exception):
    """A second Ctrl-C: stop waiting for the job; vmd is left to close its session."""


class TerminalView:
    """Live progress for a person at a terminal. Never raises into the loop (it may be
    written to a closed pipe); the loop guards it too."""

    def __init__(self, out: TextIO):
        self.out = out
        self.tasks = ""

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "status":
            self._line(f"· {event.get('text', '')}")
        elif kind == "tasks":
            text = str(event.get("text") or "")
            if text != self.tasks:
                self.tasks = text
                self._line("tasks:\n" + "\n".join(f"  {line}" for line in text.splitlines()))
        elif kind == "command":
            self._line(f"$ {event.get('command', '')}")
        elif kind == "output":
            prefix = "  ! " if event.get("stream") == "stderr" else "    "
            self._line(prefix + str(event.get("line", "")))
        elif kind == "screenshot":
            self._line(f"[screenshot {event.get('width')}x{event.get('height')}]")
        elif kind == "speech":
            self._line("agent: " + " ".join(str(event.get("text", "")).split())[:300])
        elif kind == "state":
            question = f": {event['question']}" if event.get("question") else ""
            self._line(f"state: {event.get('state')}{question}")

    def _line(self, text: str) -> None:
        show(text, self.out)


def _run(args: argparse.Namespace) -> int:
    # Imported when the command runs (the module's docstring says why), as in each command below.
    from vmagent import loop
    from vmagent.config import AgentConfig, ConfigError
    from vmagent.link import Vmd, VmdUnavailable, default_socket
    from vmagent.loop.guards import model_unfit
    from vmagent.models import open_model
    from vmagent.os_family import os_family_of
    from vmagent.prompts import PromptMissing, load_prompts
    from vmd.contract.policy import WAITING_STATES

    socket_path = default_socket()
    try:
        config = AgentConfig.load()
        guest_os = args.os or config.default_os
        load_prompts(os_family_of(guest_os), desktop=False, config=config)
        Vmd(socket_path, timeout=10).connect().close()
    except (ConfigError, PromptMissing, VmdUnavailable) as exc:
        show(f"vmagent run: {exc}", sys.stderr)
        return EXIT_USAGE
    # The chosen model server (VMAGENT_MODEL_API, VMAGENT_MODEL_URL) answers and has the
    # model, with tool calling, before any machine boots.
    unfit = model_unfit(open_model(config.model_copy(update={"model": args.model}) if args.model else config))
    if unfit:
        show(f"vmagent run: {unfit}", sys.stderr)
        return EXIT_USAGE

    spec = loop.JobSpec(task=args.task, os=guest_os, project=args.project, owner=args.owner or "",
                        model=args.model)
    transcript = Path(args.transcript) if args.transcript else Path(
        tempfile.mkdtemp(prefix="vmagent-run-")) / "transcript.json"
    cancel = threading.Event()
    view = TerminalView(sys.stderr)
    view._line(f"· transcript: {transcript}")
    try:
        outcome = _run_until_done(loop, spec, view, cancel, transcript, config, socket_path)
    except LeftToVmd as left:
        view._line(f"· {left}")
        return EXIT_INTERRUPTED
    finally:
        cancel.set()
    show(outcome.report, sys.stdout)
    if outcome.state in WAITING_STATES:
        show(f"The session waits for a person ({outcome.state}): {outcome.question}\n"
             f"Carry on with the job service, or resume from {transcript}.", sys.stderr)
    return exit_code(outcome)


def exit_code(outcome) -> int:
    """What the shell sees: only vmd's verdict counts, never the model's summary."""
    verification = outcome.verification
    if outcome.state != "done" or verification.passed is not True:
        return EXIT_NOT_DONE
    return EXIT_DONE if verification.status == "passed" else EXIT_NOT_PROVEN


def _run_until_done(loop, spec, view, cancel, transcript, config, socket_path):
    """Runs the job in a thread so that Ctrl-C cancels it (the loop closes the session
    and reports) instead of killing it mid-turn. A second Ctrl-C raises LeftToVmd."""
    result: dict[str, Any] = {}
    session: dict[str, str] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "session" and event.get("session_id"):
            session["id"] = str(event["session_id"])
        view(event)

    finished = threading.Event()

    def job() -> None:
        try:
            result["outcome"] = loop.run_job(spec, on_event=on_event, cancel=cancel, transcript_path=transcript,
                                             config=config, vmd_socket=socket_path)
        finally:
            finished.set()

    threading.Thread(target=job, name="vmagent-job", daemon=True).start()
    # An Event, not Thread.join: in CPython 3.11 a join that Ctrl-C interrupts can leave
    # the thread marked as ended while it still runs (seen in tests/vmagent/link/test_reconnect.py).
    while not finished.is_set():
        try:
            finished.wait(0.5)
        except KeyboardInterrupt:
            if cancel.is_set():
                which = f"session {session['id']}" if session.get("id") else "the session"
                raise LeftToVmd(f"stopped waiting: {which} is left for vmd to close (commit and push); "
                                "no report here.") from None
            view._line("· cancelling: the session closes (commit, push) and its report follows; "
                       "Ctrl-C again leaves it for vmd to close")
            cancel.set()
            if session.get("id"):
                threading.Thread(target=cancel_in_vmd, args=(socket_path, session["id"]),
                                 name="vmagent-cancel", daemon=True).start()
    return result["outcome"]


def cancel_in_vmd(socket_path: str, session_id: str) -> None:
    """session_cancel on a connection of its own, so vmd hears of the cancel at once: the
    session refuses further machine verbs while the loop, blocked in a long `run` (which
    session_cancel does not stop) or in the model's answer, is broken off after its grace.
    The loop cancels and closes the session in its end (vmagent/loop/job_end.py `end_job`) all
    the same."""
    from vmagent.link import Vmd, VmdError, VmdUnavailable  # `vmagent run`'s, imported as _run's are

    try:
        with Vmd(socket_path, timeout=10) as vmd:
            vmd.call("session_attach", session_id=session_id)
            vmd.call("session_cancel")
    except (VmdUnavailable, VmdError, OSError, ValueError):
        pass  # vmd is away or refuses: the loop's own cancel at its end still comes


def _serve(argv: list[str]) -> int:
    from vmagent.service import serve_main  # when asked for: `vmagent run` loads no web server
    return serve_main(argv)


def _hosts(argv: list[str]) -> int:
    """`vmagent hosts`: the job service's hosts, listed from its settings (its config file and
    environment: VMAGENT_EXECUTOR, RAY_ADDRESS, VMD_SOCKET) as GET /hosts lists them; run it
    where the service runs. Exit 0 when listed, 2 when the hosts cannot be listed at all."""
    # When asked for, as eval: `vmagent run` need not load the hosts' listing or Ray's plumbing.
    from vmagent.fleet.hosts import HostsUnavailable, list_hosts, render
    from vmagent.service.config import load_config  # the service's settings: hosts are its

    parser = argparse.ArgumentParser(prog="vmagent hosts", description=(
        "List the vmd hosts the job service places jobs on: slots, sessions, warm guests, images."))
    parser.add_argument("--config", help="the job service's settings file (as `vmagent serve --config`)")
    parser.add_argument("--json", action="store_true", help="print the listing as GET /hosts answers it")
    args = parser.parse_args(argv)
    try:
        listing = list_hosts(load_config(args.config))
    except (HostsUnavailable, OSError, ValueError) as exc:
        show(f"vmagent hosts: {exc}", sys.stderr)
        return EXIT_USAGE
    show(listing.model_dump_json(indent=2) if args.json else render(listing), sys.stdout)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmagent", description="A VM-sandboxed coding agent.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one job here, with live progress, and print its report")
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--os", help="the guest image (default: the default_os setting, VMD_DEFAULT_OS, "
                                   "else debian)")
    run.add_argument("--project", required=True, help="the project folder (a git repository) to work in")
    run.add_argument("--owner", default="", help="the project's owner (Gitea user or org)")
    run.add_argument("--model", help="the model, as the server names it (default: from config / VMAGENT_MODEL); "
                                      "the server is VMAGENT_MODEL_API (ollama or openai) at VMAGENT_MODEL_URL")
    run.add_argument("--transcript", help="where to keep the transcript (default: a temporary folder)")
    sub.add_parser("serve", help="serve the job API (options: vmagent serve --help)", add_help=False)
    sub.add_parser("eval", help="run the eval task set and score the model (options: vmagent eval --help)",
                   add_help=False)
    sub.add_parser("hosts", help="list the vmd hosts jobs run on (options: vmagent hosts --help)", add_help=False)
    sub.add_parser("ray-node", help="start this machine's Ray node of the fleet, the head or a host, with "
                                    "token auth (options: vmagent ray-node --help)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    if argv[:1] == ["eval"]:
        # Imported when asked for: `vmagent run` need not load the eval's modules.
        from vmagent.eval.command import main as eval_main
        return eval_main(argv[1:])
    if argv[:1] == ["hosts"]:
        return _hosts(argv[1:])
    if argv[:1] == ["ray-node"]:
        from vmagent.fleet.ray_node import main as ray_node_main  # as eval: `vmagent run` need not load it
        return ray_node_main(argv[1:])
    args = parser().parse_args(argv)  # exits 2 on a usage error
    if not args.task.strip():
        show("vmagent run: the task is empty; say what the agent should do.", sys.stderr)
        return EXIT_USAGE
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
