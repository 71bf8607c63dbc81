"""`bench/load.py --fleet`: N jobs on the compose fleet's two hosts, then the same N on one
of them, side by side in one run (issue 38 item 5).

The fleet is docker-compose.fleet.yml with the CI override (tests/support/fleet_stack.py): the head
(the job service, executor ray, and the Ray head with token auth) and two KVM hosts in
containers, each one `vm_slot`, real guests under TCG (or KVM where the host has it), the
model stand-in playing tests/support/fleet_jobs.py's LOAD job for every job. Two warm-up jobs first
(one per host, not counted) make each host's clean-room templates. Then all N jobs are posted at
once; the second configuration stops host-b first (its Ray node leaves the cluster).

Per job, from the job service's own store (each event's time as the service stored it):
- to a host: from the job's creation to "running on host X" (Ray placed its actor and the
  worker started there);
- scheduling overhead: that time for a job that found a free slot (nothing to wait for: the
  auth probe, Ray's placement, the actor and its worker starting);
- time to a free slot: that time for a job that waited ("waiting for a free host").
Per configuration: the total (first POST to the last job ended) and the medians; then the
ratio of the totals (one host / two hosts) and of the overheads.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.fleet_jobs import LOAD
from tests.support.fleet_stack import running_fleet

# Reads the jobs and their placement events from the head's store (jobs.sqlite3).
STORE_QUERY = r"""
import json, sqlite3, sys
db = sqlite3.connect("/var/lib/vmagent/service/jobs.sqlite3")
out = {}
for job_id in sys.argv[1:]:
    created, ended, state = db.execute("SELECT created, ended, state FROM jobs WHERE id = ?", (job_id,)).fetchone()
    waited = placed = None
    host = None
    for ts, data in db.execute("SELECT ts, data FROM events WHERE job_id = ? ORDER BY seq", (job_id,)):
        text = str(json.loads(data).get("text") or "")
        if text == "waiting for a free host" and waited is None:
            waited = ts
        if text.startswith("running on host ") and placed is None:
            placed, host = ts, text.removeprefix("running on host ")
    out[job_id] = {"created": created, "ended": ended, "state": state, "waited": waited, "placed": placed,
                   "host": host}
print(json.dumps(out))
"""


def run_jobs(fleet, n: int, label: str, timeout: float) -> dict:
    client = fleet.client()
    started = time.time()
    ids = []
    for k in range(1, n + 1):
        response = client.post("/jobs", json={"task": f"{LOAD} {k}, {label})", "os": "debian",
                                              "project": f"load-{label}-{k}"})
        response.raise_for_status()
        ids.append(response.json()["id"])
    deadline = time.monotonic() + timeout
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            try:
                if client.get(f"/jobs/{job_id}").json()["state"] not in ("queued", "running"):
                    pending.discard(job_id)
                    print(f"  {label}: job {job_id} ended at {time.time() - started:7.1f} s", flush=True)
            except Exception:  # a slow answer on a loaded host: asked again
                pass
        time.sleep(2)
    rows = json.loads(fleet.run("head", "python", "-c", STORE_QUERY, *ids).stdout)
    ended = [r["ended"] for r in rows.values() if r["ended"]]
    total = (max(ended) - started) if len(ended) == len(ids) else None
    return {"rows": rows, "total": total, "unfinished": sorted(pending)}


def summary(result: dict) -> dict:
    rows = result["rows"].values()
    to_host = [r["placed"] - r["created"] for r in rows if r["placed"]]
    free = [r["placed"] - r["created"] for r in rows if r["placed"] and not r["waited"]]
    waited = [r["placed"] - r["created"] for r in rows if r["placed"] and r["waited"]]
    return {"total": result["total"], "to_host": to_host, "overhead": statistics.median(free) if free else None,
            "slot_wait": statistics.median(waited) if waited else None,
            "done": sum(1 for r in rows if r["state"] == "done"), "n": len(result["rows"]),
            "hosts": sorted({r["host"] for r in rows if r["host"]})}


def fmt(seconds: float | None) -> str:
    return f"{seconds:8.1f} s" if seconds is not None else "       - "


def fleet_main(jobs: int, timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="vmagent-fleet-bench-") as logs:
        with running_fleet(Path(logs), f"vmagent-fleet-bench") as fleet:
            print(f"fleet up in {fleet.timings['hosts joined']:.0f} s (build {fleet.timings['build']:.0f} s)",
                  flush=True)
            # One job per host first, not counted: each host's vmd makes its clean-room templates
            # at its first finish (two cold boots and saves). Measured without it, the first
            # configuration paid for them and the second did not (one host 0.39 x of two).
            warm = summary(run_jobs(fleet, 2, "warm", timeout))
            print(f"warm-up (not counted): {fmt(warm['total'])} on {','.join(warm['hosts'])}", flush=True)
            results = {"two hosts": run_jobs(fleet, jobs, "two", timeout)}
            fleet.compose("stop", "host-b")
            deadline = time.monotonic() + 300
            while fleet.hosts().get("host-b", {}).get("alive") and time.monotonic() < deadline:
                time.sleep(2)
            results["one host"] = run_jobs(fleet, jobs, "one", timeout)
    print()
    print(f"{'config':<11}{'total':<12}{'overhead (free slot)':<23}{'to a free slot':<17}{'done':<7}hosts")
    sums = {name: summary(result) for name, result in results.items()}
    for name, s in sums.items():
        print(f"{name:<11}{fmt(s['total']):<12}{fmt(s['overhead']):<23}{fmt(s['slot_wait']):<17}"
              f"{s['done']}/{s['n']:<5}{','.join(s['hosts'])}")
    for name, s in sums.items():
        print(f"{name}: to a host per job: {', '.join(f'{t:.1f}' for t in sorted(s['to_host']))} s")
    one, two = sums["one host"], sums["two hosts"]
    if one["total"] and two["total"]:
        print(f"one host / two hosts (total)      {one['total'] / two['total']:.2f} x")
    if one["overhead"] and two["overhead"]:
        print(f"one host / two hosts (overhead)   {one['overhead'] / two['overhead']:.2f} x")
    for name, result in results.items():
        for job_id in result["unfinished"]:
            print(f"{name}: job {job_id} did not end within {timeout:.0f} s")
