"""Prompt-prefix benchmark: how much of each model request a prompt cache can reuse.

    .venv/bin/python bench/context.py [--old COMMIT] [--turns 200]

Model servers (Ollama, llama.cpp) keep the KV of the previous request and evaluate only
what follows the longest prefix the new request shares with it; a turn costs that part.
This replays one long scripted session through the real loop (vmagent/loop/turns.py) against a
real vmd on a socket with stand-in machines (tests/support/vmd_fakes.py LocalMachines, their
guest reporting a desktop) and the scripted Ollama server (tests/support/ollama_server.py):
--turns model turns and more (planning, runs whose output is cut to the result cap, file
writes and reads, 20 screenshots among clicks and typing, a question answered through
resume_job, a vmd restart between two turns, compactions at the default num_ctx, finish).

It runs twice, each in a process of its own: the loop of this tree (the stable prefix:
one tool list, the system prompt written once, screenshots dropped in batches) and the
loop of --old, today's policy before that change (its tree from `git archive`, the same
script and measure: this file runs in both). Side by side it prints: prompt characters
sent, the share of them that is a prefix of the request before (reusable from the cache),
characters to evaluate per turn (median, max), the hand-over turn (planning -> first
working turn) as the share of the request before it that it reuses, compactions, turns.

Every request counts, the compactor's summary requests too (with one cache slot they
replace the agent's prefix). A request is measured as text: the tool list, then each
message as JSON, an image as a stand-in of image_tokens x 4 characters (1300 tokens, what
compaction counts), named by its digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# main just before the stable prefix (item 3 of issue 21): 4 planning tools then 22, the
# system prompt rewritten at the hand-over, keep_images=2 dropping one per look.
OLD_COMMIT = "25dfd0c9218133ea9c81ad6b8bb3381806f2ff41"
IMAGE_CHARS = 1300 * 4
TITLES = ["set up the project", "write the data tool", "check the app on screen",
          "write the server", "answer the port question", "write the report"]
THINK = "The last result says what to do next; the task list says which task is open. "
TARGET_SHARE, TARGET_HANDOVER = 0.90, 0.90


# --- the measure (both processes) -----------------------------------------------------------


def prompt_text(body: dict) -> str:
    parts = [json.dumps(body.get("tools") or [], ensure_ascii=False, sort_keys=True)]
    for message in body.get("messages") or []:
        message = dict(message)
        images = message.pop("images", None) or []
        parts.append(json.dumps(message, ensure_ascii=False, sort_keys=True))
        for image in images:
            name = f"<image {hashlib.sha256(str(image).encode()).hexdigest()[:16]}>"
            parts.append(name.ljust(IMAGE_CHARS, "."))
    return "\n".join(parts)


def shared(a: str, b: str) -> int:
    """Length of the longest common prefix of a and b (binary search on slices: fast in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def measure(bodies: list[dict], is_summary) -> dict:
    texts = [prompt_text(b) for b in bodies]
    reused = [0] + [shared(a, b) for a, b in zip(texts, texts[1:])]
    turns = [n for n, b in enumerate(bodies) if not is_summary(b)]
    prefill = [len(texts[n]) - reused[n] for n in turns]
    handover = next((n for n in turns if any(
        m.get("role") == "user" and str(m.get("content", "")).startswith("The machine is up")
        for m in bodies[n]["messages"])), None)
    return {
        "requests": len(bodies), "turns": len(turns), "compactions": len(bodies) - len(turns),
        "chars": sum(len(t) for t in texts), "reused": sum(reused),
        "prefill_median": statistics.median(prefill), "prefill_max": max(prefill),
        "handover": reused[handover] / len(texts[handover - 1]) if handover else None,
        "tool_lists": len({json.dumps(b.get("tools"), sort_keys=True) for b in bodies if not is_summary(b)}),
    }


# --- the session (run in the tree under test) -----------------------------------------------


def script(work_turns: int, thinking: bool = True) -> list:
    """The model's turns, in order; `None` marks where the model asks a person."""
    from tests.support.loop_harness import call, calls

    long_run = "python3 -c \"[print(f'step {n} row {{i}}: ' + 'z' * 64) for i in range(300)]\""
    turns: list = [call("plan_tasks", {"tasks": TITLES}), call("update_task", {"id": 1, "status": "in_progress"})]
    task = 1
    gui = 0
    n = 0
    while len(turns) < work_turns:
        n += 1
        at = len(turns) + 1
        if at in (30, 55, 110, 135, 170):  # close a task, start the next
            turns.append(calls(("update_task", {"id": task, "status": "done", "note": f"checked at {at}"}),
                               ("update_task", {"id": task + 1, "status": "in_progress"})))
            task += 1
        elif at == 120:
            turns.append(None)
        elif 60 <= at < 100:  # the screen: 20 looks, each followed by an action there
            if at % 2 == 0:
                turns.append(call("screenshot"))
                gui += 1
            else:
                action = [("click", {"x": 10 + gui, "y": 20 + gui}), ("type", {"text": f"entry {gui}"}),
                          ("key", {"keys": "Return"}), ("scroll", {"x": 5, "y": 5 + gui, "amount": 2})][gui % 4]
                turns.append(call(*action))
        elif n % 5 == 0:
            turns.append(call("run", {"command": long_run.replace("{n}", str(n))}, content=f"Step {n}."))
        elif n % 5 == 1:
            body = "".join(f"def f{n}_{i}(x):\n    return x * {i}\n\n" for i in range(20))
            turns.append(call("write_file", {"path": f"src/mod{n}.py", "content": body}))
        elif n % 5 == 2:
            turns.append(call("read_file", {"path": f"src/mod{n - 1}.py"}))
        elif n % 5 == 3:
            turns.append(call("run", {"command": f"python3 -c 'import sys; print({n} * 7)'"}))
        else:
            turns.append(call("list_dir", {"path": "src"}))
    turns += [
        call("update_task", {"id": task, "status": "done", "note": "checked"}),
        *[call("update_task", {"id": i, "status": "done", "note": "done along the way"})
          for i in range(task + 1, len(TITLES))],
        calls(("run", {"command": "echo report > report.txt"}),
              ("update_task", {"id": len(TITLES), "status": "done", "note": "report.txt written"})),
        call("finish", {"summary": "data tool, server and report written",
                        "verification": {"command": "test -s report.txt"}}),
    ]
    for turn in turns:
        if turn is not None and thinking:
            turn.thinking = THINK  # a thinking model's turns, as qwen3 writes them
    return turns


def replay(work_turns: int, thinking: bool) -> dict:
    from tests.support.loop_harness import call, is_summary_request
    from tests.support.ollama_server import Turn, start_ollama
    from tests.support.vmd_fakes import LocalMachines, make_config
    from vmagent.config import AgentConfig
    from vmagent.loop import JobSpec, resume_job, run_job
    from vmd.server.rpc import VmdServer

    class DesktopMachines(LocalMachines):
        def create(self, spec):
            machine = super().create(spec)
            ready = machine.ready
            machine.ready = lambda timeout, desktop=False: {**ready(timeout, desktop), "desktop": True}
            return machine

    turns = script(work_turns, thinking)
    asked = turns.index(None)
    turns[asked] = call("ask_user", {"question": "Which port should the server listen on, 8080 or 9000?"})
    work = tempfile.mkdtemp(prefix="bench-context-")
    machines = DesktopMachines()
    vmd_config = make_config(Path(work))
    servers = [VmdServer(vmd_config, machines).start()]
    restart_at = 150
    played = {"turns": 0, "summaries": 0}

    def restart() -> None:  # vmd goes away while the model thinks, back a second later
        servers[-1].stop()

        def later() -> None:
            time.sleep(1.0)
            servers.append(VmdServer(vmd_config, machines).start())

        threading.Thread(target=later, daemon=True).start()

    def model(body: dict):
        if is_summary_request(body):
            played["summaries"] += 1
            return Turn(content=f"Summary {played['summaries']}: planned six tasks; wrote src/mod*.py with "
                                "write_file and read them back; ran python3 commands, all exit 0; looked at "
                                "the screen and clicked through the app; " + "details " * 60)
        played["turns"] += 1
        if played["turns"] == restart_at:
            restart()
        return turns.pop(0) if turns else Turn(status=400, error="the script has no more turns")

    transcript = Path(work) / "transcript.json"
    with start_ollama([], default=model) as server:
        config = AgentConfig(ollama_host=server.url, retries=0, retry_backoff_s=0.0, request_timeout_s=30,
                             vmd_reconnect_s=30, max_steps=work_turns + 100)
        socket = str(vmd_config.socket)
        outcome = run_job(JobSpec(task="Write a data tool, a small server and a report; check the app on the "
                                       "screen.", project="context"),
                          on_event=lambda e: None, transcript_path=transcript, config=config, vmd_socket=socket)
        states = [outcome.state]
        if outcome.state == "question":
            outcome = resume_job(transcript, answer="8080", on_event=lambda e: None, config=config,
                                 vmd_socket=socket)
            states.append(outcome.state)
        bodies = list(server.chat_requests)
    for vmd_server in servers:
        vmd_server.stop()
    import vmagent
    result = measure(bodies, is_summary_request)
    result.update(states=states, verified=outcome.verification_passed, steps=outcome.steps,
                  restarted=len(servers) > 1, code=str(Path(vmagent.__file__).resolve().parent.parent))
    return result


# --- the two runs side by side --------------------------------------------------------------


def run_in(tree: Path, turns: int, thinking: bool) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--replay", str(tree), "--turns", str(turns)]
    out = subprocess.run(command + ([] if thinking else ["--no-thinking"]),
                         capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    if out.returncode != 0:
        raise SystemExit(f"the replay in {tree} failed:\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["code"]) != tree.resolve():
        raise SystemExit(f"the replay in {tree} ran the code of {result['code']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=OLD_COMMIT, help="the commit whose loop is today's policy")
    parser.add_argument("--turns", type=int, default=200, help="model turns the script plays at least")
    parser.add_argument("--no-thinking", action="store_true",
                        help="a model that writes no thinking (the loop hands back only the newest)")
    parser.add_argument("--replay", metavar="TREE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        sys.path.insert(0, args.replay)
        print(json.dumps(replay(args.turns, not args.no_thinking)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-context-old-") as old_tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        old = run_in(Path(old_tree), args.turns, not args.no_thinking)
    new = run_in(ROOT, args.turns, not args.no_thinking)
    rows = [
        ("prompt characters sent", lambda r: f"{r['chars']:,}"),
        ("reusable prefix of the request before", lambda r: f"{r['reused'] / r['chars']:.3f}"),
        ("characters to evaluate a turn, median", lambda r: f"{r['prefill_median']:,.0f}"),
        ("characters to evaluate a turn, max", lambda r: f"{r['prefill_max']:,}"),
        ("hand-over turn: share of the request before", lambda r: f"{r['handover']:.3f}"),
        ("different tool lists sent", lambda r: f"{r['tool_lists']}"),
        ("compactions", lambda r: f"{r['compactions']}"),
        ("turns", lambda r: f"{r['turns']}"),
    ]
    print(f"{'':44} {'today (' + args.old[:7] + ')':>20} {'stable prefix':>20}")
    for label, shown in rows:
        print(f"{label:44} {shown(old):>20} {shown(new):>20}")
    print(f"{'prompt characters sent, new / today':44} {new['chars'] / old['chars']:>41.2f}")
    print(f"{'characters evaluated, new / today':44} "
          f"{(new['chars'] - new['reused']) / (old['chars'] - old['reused']):>41.2f}")
    for name, r in (("today", old), ("stable prefix", new)):
        print(f"{name}: ended {' then '.join(r['states'])}, {'verified' if r['verified'] else 'NOT verified'}"
              f"{', vmd restarted once' if r['restarted'] else ''}")
    share, handover = new["reused"] / new["chars"], new["handover"]
    ok = share >= TARGET_SHARE and handover >= TARGET_HANDOVER
    print(f"target: >= {TARGET_SHARE} reusable and a hand-over >= {TARGET_HANDOVER}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
