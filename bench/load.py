"""Load benchmark of vmd's warm-machine pool: queued jobs on a small host, pool off and on.

    .venv/bin/python bench/load.py [--jobs 6] [--pool 2] [--only off|on] [--max-concurrent 2] [--keep]
                                   [--executor local|ray] [--dry-run]
    .venv/bin/python bench/load.py --fleet [--jobs 4]    # the compose fleet: two hosts, then one

Each configuration runs the whole stack as processes, as tests/e2e/test_openwebui_vm.py does:
`vmd serve` (with VMD_WARM_POOL_SIZE=0, then =--pool), the job service with the real
worker (--max-concurrent jobs at a time) and the scripted Ollama server playing, for
every job's conversation, plan -> one `run` -> task done -> `finish` with a check that
passes. All jobs are queued at once. With the pool on, the bench waits until --pool slots
are ready before queuing (that fill time is printed, and not counted).

Prints a row per job as it ends (state, time to its first command, how its machine
came), then per job side by side, then per configuration: the total wall time (first
POST to the last job seen ended), the median and max time to the first command (the
job's `created` to the `time` vmd recorded its first `run` verb, i.e. once that command
had run), warm/all (machines that came warm, of those that came: session.json's
`machine_came`), jobs done, and the ratio of the totals (pool off / pool on).

--executor ray runs the same jobs through the job service's Ray executor: a Ray cluster on
127.0.0.1 (tests/support/ray_harness.py) of a head and one node per --max-concurrent slot, each
labelled as a host whose vmd is the bench's one vmd, so Ray's slots are the limit and
each job's worker runs in a JobHost actor (docs/scale-out.md). The host a job ran on is
in its row. --dry-run starts no vmd and no guest: it prints the configurations, and with
--executor ray starts the cluster, lists its hosts as `vmagent hosts` does and stops it.

--fleet runs the jobs on the compose fleet instead (bench/fleet_load.py: separate host
containers, each its own vmd and Ray node): N jobs on both hosts, then the same N on one,
and prints the ratio, the scheduling overhead per job and the time to a free slot. Needs
root and dockerd, as tests/e2e/test_fleet_stack.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.guests import clean_up_domains  # noqa: E402 (the repository is on the path now)
from tests.support.loop_harness import call, calls, is_summary_request  # noqa: E402
from tests.support.ollama_server import Turn, start_ollama  # noqa: E402
from tests.support.service_harness import REAL_WORKER, ServiceProcess, real_worker_env, stop_workers  # noqa: E402
from tests.support.vmd_process import VmdProcess  # noqa: E402

FILL_WAIT_S = 900
# How long a dry run's listing waits for each host's answer (its vmd is not running).
DRY_LIST_WAIT_S = 20
CHECK = "cd /mnt/project && grep -qx hello hello.txt"
LIVE = ("queued", "running")  # any other state: the job ended (or waits for a person: stuck)


def model(body: dict):
    """One model turn, chosen from the conversation it is asked in (the scripted server
    plays one sequence for every request, so each job's history says where it is)."""
    if is_summary_request(body):
        return Turn(content="Summary: planned, wrote hello.txt with echo, marked the task done.")
    made = [c.get("function") or {} for m in body.get("messages") or [] if m.get("role") == "assistant"
            for c in m.get("tool_calls") or []]
    names = [f.get("name") for f in made]
    if "plan_tasks" not in names:
        return call("plan_tasks", {"tasks": ["write hello.txt"]}, content="Planning while the machine boots.")
    if "run" not in names:
        return calls(("update_task", {"id": 1, "status": "in_progress"}),
                     ("run", {"command": "echo hello > /mnt/project/hello.txt"}))
    if not any(f.get("name") == "update_task" and (f.get("arguments") or {}).get("status") == "done"
               for f in made):
        return call("update_task", {"id": 1, "status": "done", "note": "hello.txt written"})
    return call("finish", {"summary": "hello.txt holds hello", "verification": {"command": CHECK, "expect_exit": 0}})


def ready_slots(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.iterdir() if p.is_dir() and (p / "slot.json").is_file()
               and not p.name.startswith(".") and not p.name.endswith(".taken"))


def wait_for_pool(folder: Path, size: int) -> None:
    started = time.monotonic()
    shown = -1.0
    while (have := ready_slots(folder)) < size:
        waited = time.monotonic() - started
        if waited > FILL_WAIT_S:
            print(f"  the pool had {have}/{size} slots after {waited:.0f} s; measuring from there", flush=True)
            return
        if waited - shown >= 30:
            print(f"  filling the pool: {have}/{size} slots ready after {waited:.0f} s", flush=True)
            shown = waited
        time.sleep(2)
    print(f"pool fill (not counted)  {time.monotonic() - started:8.1f} s  ({size} slots)", flush=True)


def session_facts(vmd, sid: str | None, created: float) -> tuple[float | None, str | None, str]:
    """(seconds from the job's creation to vmd's first recorded `run`, how the machine came,
    why it came cold when it could have come warm)."""
    if not sid:
        return None, None, ""
    try:
        record = vmd.record(sid)
    except (OSError, ValueError):
        record = []
    first = next((datetime.fromisoformat(e["time"]).timestamp() - created for e in record
                  if e.get("kind") == "verb" and e.get("verb") == "run"), None)
    try:
        session = vmd.session(sid)
    except (OSError, ValueError):
        session = {}
    came = session.get("machine_came") or next((e.get("came") for e in record
                                                if e.get("kind") == "machine" and e.get("event") == "ready"), None)
    return first, came, session.get("came_note") or ""


def bench_hosts(slots: int, vmd_socket: str) -> dict[str, str]:
    """The Ray executor's hosts for the bench: one node per slot, all beside the one vmd."""
    return {f"bench-{n}": vmd_socket for n in range(1, slots + 1)}


def executor_settings(args, stack: contextlib.ExitStack, vmd_socket: str) -> dict:
    """The job service's settings for --executor: none for local; for ray, a cluster whose
    nodes are the bench's slots (closed with `stack`), and Ray's slots as the only limit."""
    if args.executor == "local":
        return {"max_concurrent": args.max_concurrent}
    from tests.support.ray_harness import ray_cluster

    cluster = stack.enter_context(ray_cluster(bench_hosts(args.max_concurrent, vmd_socket)))
    print(f"  ray: head and {args.max_concurrent} host node(s) at {cluster.address}", flush=True)
    return {"executor": "ray", "ray_address": cluster.address}


def host_of(svc, job_id: str) -> str:
    """The host a job ran on (the Ray shim's host.json), or '-'."""
    try:
        return json.loads((svc.data_dir / "jobs" / job_id / "host.json").read_text()).get("host") or "-"
    except (OSError, ValueError):
        return "-"


def dry_run(args) -> None:
    """What a run would do, without vmd or guests; the Ray cluster is started and listed."""
    for name, pool in configs_of(args):
        print(f"--- pool {name} (VMD_WARM_POOL_SIZE={pool}, {args.jobs} jobs, {args.max_concurrent} at a time, "
              f"executor {args.executor}): not run (--dry-run)", flush=True)
    if args.executor != "ray":
        return
    from vmagent.fleet.hosts import HostList, RayHosts, render

    work = Path(tempfile.mkdtemp(prefix="vmd-load-dry-"))
    try:
        with contextlib.ExitStack() as stack:
            settings = executor_settings(args, stack, str(work / "vmd.sock"))
            hosts = RayHosts(settings["ray_address"], wait_s=DRY_LIST_WAIT_S).list()
            print(render(HostList(executor="ray", hosts=hosts)), flush=True)
            try:
                import ray

                ray.shutdown()
            except ImportError:
                pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


def configs_of(args) -> list[tuple[str, int]]:
    return [(n, p) for n, p in (("off", 0), ("on", args.pool)) if args.only in (None, n)]


def run_config(name: str, pool: int, args, image, conn) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"vmd-load-{name}-", dir="/var/tmp"))
    os.chmod(work, 0o711)  # QEMU runs as its own user and must pass through to the guests' files
    vmd = VmdProcess(work, image.dir.parent, VMD_WARM_POOL_SIZE=str(pool))
    svc, rows, total = None, {}, None
    stack = contextlib.ExitStack()
    print(f"--- pool {name} (VMD_WARM_POOL_SIZE={pool}, {args.jobs} jobs, {args.max_concurrent} at a time, "
          f"executor {args.executor}; work folder {work})", flush=True)
    try:
        vmd.start()
        if pool:
            wait_for_pool(vmd.state / "warm" / image.dir.name, pool)
        with start_ollama(default=model) as ollama:
            settings = executor_settings(args, stack, str(vmd.socket))
            svc = ServiceProcess(work / "svc", worker_command=REAL_WORKER, vmd_socket=str(vmd.socket),
                                 env=real_worker_env(ollama.url), **settings).start()
            client = svc.client()
            started = time.time()
            pending = {}
            for n in range(1, args.jobs + 1):
                posted = time.time()
                response = client.post("/jobs", json={"task": f"Write hello.txt holding hello (load job {n})",
                                                      "os": "debian", "project": f"load-{n}",
                                                      "chat_id": f"load-{name}-{n}"})
                if response.status_code != 201:
                    rows[n] = {"state": f"HTTP {response.status_code}", "error": response.text[:200]}
                    print(f"{name:<4} job {n}  not queued: {response.status_code} {response.text[:200]}", flush=True)
                    continue
                job = response.json()
                pending[n] = (job["id"], job.get("created") or posted)
            deadline = time.monotonic() + args.timeout
            while pending and time.monotonic() < deadline:
                for proc, what in ((svc.proc, "the job service"), (vmd.proc, "vmd serve")):
                    if proc is None or proc.poll() is not None:
                        raise RuntimeError(f"{what} exited while {len(pending)} jobs were unfinished")
                for n, (job_id, created) in list(pending.items()):
                    try:
                        job = client.get(f"/jobs/{job_id}").json()
                    except Exception:  # the service is slow to answer on a loaded host: ask again
                        continue
                    if job.get("state") in LIVE:
                        continue
                    del pending[n]
                    first, came, note = session_facts(vmd, job.get("session_id"), created)
                    row = {"state": job.get("state"), "first": first, "came": came, "note": note,
                           "ended": time.time() - started, "session": job.get("session_id"),
                           "host": host_of(svc, job_id),
                           "error": "" if job.get("state") == "done" else
                           (job.get("status_line") or (job.get("report") or "")[:300]).replace("\n", " ")}
                    rows[n] = row
                    print(f"{name:<4} job {n}  {row['state']:<9} first-cmd {fmt(first)}  came {came or '-':<5} "
                          f"ended at {row['ended']:7.1f} s  host {row['host']}  {row['error'][:160]}"
                          f"{'  (' + note[:100] + ')' if note and name == 'on' else ''}", flush=True)
                time.sleep(1)
            for n, (job_id, created) in pending.items():
                rows[n] = {"state": "timeout", "error": f"still unfinished after {args.timeout:.0f} s"}
                print(f"{name:<4} job {n}  timed out (job {job_id})", flush=True)
            total = time.time() - started
    except Exception as exc:  # a configuration that breaks down is reported, the other still runs
        print(f"{name:<4} stopped: {type(exc).__name__}: {exc}", flush=True)
    finally:
        if svc is not None:
            svc.stop()
            stop_workers(svc)
        stack.close()  # the Ray cluster, for --executor ray
        vmd.stop()
        clean_up_domains(conn, str(work))
        failed = any(r.get("state") != "done" for r in rows.values()) or len(rows) < args.jobs
        if args.keep or failed:
            shutil.rmtree(work / "state" / "warm", ignore_errors=True)  # saved guests: large
            print(f"{name:<4} logs and records kept in {work} (vmd.log, svc/service.log, state/sessions)",
                  flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return {"rows": rows, "total": total}


def fmt(seconds: float | None) -> str:
    return f"{seconds:7.1f} s" if seconds is not None else "      - "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--pool", type=int, default=2, help="pool size for the 'on' run")
    parser.add_argument("--only", choices=("off", "on"), help="run one configuration")
    parser.add_argument("--max-concurrent", type=int, default=2, help="the service's concurrent jobs")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for all jobs of a run")
    parser.add_argument("--keep", action="store_true", help="keep the work folders (logs, records)")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="the job service's executor; ray: a local cluster of one node per "
                             "--max-concurrent slot, beside the bench's vmd")
    parser.add_argument("--fleet", action="store_true",
                        help="the compose fleet: --jobs jobs on two host containers, then on one "
                             "(bench/fleet_load.py)")
    parser.add_argument("--dry-run", action="store_true",
                        help="start no vmd and no guest: print the configurations (and, with --executor "
                             "ray, start the cluster and list its hosts)")
    args = parser.parse_args()
    if args.fleet:
        from bench.fleet_load import fleet_main

        fleet_main(args.jobs, args.timeout)
        return
    if args.executor == "ray":
        # Before Ray is imported: its nodes and driver stay on 127.0.0.1 (tests/support/ray_harness.py).
        from vmagent.fleet.placement import keep_loopback

        keep_loopback("127.0.0.1:6379")
    if args.dry_run:
        dry_run(args)
        return

    import libvirt

    from vmd.machines.images import find_image

    image = find_image("debian")
    conn = libvirt.open("qemu:///system")
    configs = configs_of(args)
    results = {}
    try:
        for name, pool in configs:
            results[name] = run_config(name, pool, args, image, conn)
    finally:
        conn.close()

    print()
    print("job  " + "".join(f"{name + ' first-cmd':<18}{name + ' came':<10}{name + ' state':<12}" for name in results))
    for n in range(1, args.jobs + 1):
        cells = ""
        for name, result in results.items():
            row = result["rows"].get(n, {})
            cells += f"{fmt(row.get('first')):<18}{row.get('came') or '-':<10}{row.get('state') or '-':<12}"
        print(f"{n:<5}{cells}")
    print()
    print(f"{'config':<9}{'total':<10}{'first-cmd median':<19}{'first-cmd max':<16}{'warm/all':<11}done")
    for name, result in results.items():
        rows = result["rows"].values()
        firsts = [r["first"] for r in rows if r.get("first") is not None]
        warm = sum(1 for r in rows if r.get("came") == "warm")
        cold = sum(1 for r in rows if r.get("came") == "cold")
        done = sum(1 for r in rows if r.get("state") == "done")
        total = f"{result['total']:.1f} s" if result["total"] is not None else "-"
        median = f"{statistics.median(firsts):.1f} s" if firsts else "-"
        worst = f"{max(firsts):.1f} s" if firsts else "-"
        print(f"{name:<9}{total:<10}{median:<19}{worst:<16}{f'{warm}/{warm + cold}':<11}{done}/{args.jobs}")
    off, on = results.get("off", {}).get("total"), results.get("on", {}).get("total")
    if off and on:
        print(f"pool off / pool on (total)   {off / on:.1f} x")
    for name, result in results.items():
        for n, row in sorted(result["rows"].items()):
            if row.get("state") != "done":
                print(f"{name} job {n} {row.get('state')}: {row.get('error', '')[:300]}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
