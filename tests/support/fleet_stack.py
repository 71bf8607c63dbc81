"""The compose fleet for the tests and the bench (tests/e2e/test_fleet_stack.py, bench/load.py
--fleet): docker-compose.fleet.yml with the CI override, through scripts/compose-ci.sh
--fleet, as its own compose project (its containers, volumes, network and ports), and what a
test asks of it: a command in one of its containers, the job service's API as the fleet's
operator, a job's events, the Gitea stand-in's repositories.

    with running_fleet(log_dir) as fleet:       # built, up, healthy, both hosts joined
        fleet.client().post("/jobs", ...)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx

from tests.support.service_harness import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compose-ci.sh"
USER_TOKEN = "ci-user-token"  # scripts/compose-ci.sh's VMAGENT_TOKENS: user "ci", the fleet's operator
SERVICES = ("head", "host-a", "host-b", "gitea", "ollama")
HOSTS = ("host-a", "host-b")
HEALTHY_WITHIN_S = 900
JOB_WITHIN_S = 1500
DOCKER = "/usr/bin/docker"


def missing() -> str:
    if not (os.environ.get("CI") or os.environ.get("VMAGENT_FLEET_TESTS")):
        return "the compose fleet runs in CI, or with VMAGENT_FLEET_TESTS=1 (about ten minutes)"
    if os.geteuid() != 0:
        return "needs root (debootstrap for the base image, docker)"
    for tool in ("docker-compose", "debootstrap"):
        if not shutil.which(tool, path="/usr/bin:/usr/sbin:" + os.environ.get("PATH", "")):
            return f"{tool} is not installed (apt-get install docker.io docker-compose debootstrap)"
    if subprocess.run([DOCKER, "info"], capture_output=True).returncode != 0:
        return "dockerd is not running"
    from vmd.machines.images import ImageMissing, find_image
    try:
        find_image("debian")
    except ImageMissing as exc:
        return str(exc)
    return ""


class Fleet:
    def __init__(self, log: Path, port: int, project: str):
        self.log, self.port, self.project = log, port, project
        self.env = {**os.environ, "COMPOSE_PROJECT_NAME": project, "VMAGENT_PORT": str(port),
                    "GITEA_PORT": str(free_port())}
        self.timings: dict[str, float] = {}
        self.lost: dict = {}  # what test 2 left for test 4: the killed host and its session

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        started = time.monotonic()
        done = subprocess.run(["bash", str(SCRIPT), "--fleet", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        with open(self.log, "a") as out:
            out.write(f"$ compose {' '.join(args)} ({time.monotonic() - started:.0f} s, exit {done.returncode})\n"
                      f"{done.stdout}{done.stderr}\n")
        if check:
            assert done.returncode == 0, f"compose {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def run(self, service: str, *command: str, user: str | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        """A command in a service's container (docker exec)."""
        done = subprocess.run([DOCKER, "exec", *(["-u", user] if user else []), self.container(service), *command],
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{service}: {command} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        return done

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60,
                            headers={"Authorization": f"Bearer {USER_TOKEN}"})

    def hosts(self) -> dict[str, dict]:
        listing = self.client().get("/hosts").json()
        return {h["name"]: h for h in listing["hosts"]}

    def wait_usable(self, names: tuple[str, ...], timeout: float) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                hosts = self.hosts()
            except (httpx.HTTPError, ValueError, KeyError):
                hosts = {}
            if all(hosts.get(n, {}).get("usable") and hosts[n].get("alive") for n in names):
                return hosts
            assert time.monotonic() < deadline, f"{names} not usable within {timeout:.0f} s: {hosts}"
            time.sleep(3)

    def events(self, job_id: str) -> list[dict]:
        body = self.client().get(f"/jobs/{job_id}/events", params={"follow": "false"}).text
        return [json.loads(line[6:]) for line in body.splitlines() if line.startswith('data: {"type')]

    def wait_event(self, job_id: str, predicate, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = next((e for e in self.events(job_id) if predicate(e)), None)
            except (httpx.HTTPError, ValueError):
                found = None  # the service is being started again
            if found is not None:
                return found
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s: {self.job(job_id)}"
            time.sleep(2)

    def job(self, job_id: str) -> dict:
        return self.client().get(f"/jobs/{job_id}").json()

    def wait_end(self, job_id: str, timeout: float = JOB_WITHIN_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                job = self.job(job_id)
                if job["state"] in ("done", "failed", "cancelled"):
                    return job
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, f"job {job_id} did not end within {timeout:.0f} s"
            time.sleep(5)

    def gitea_repo(self, project: str) -> str:
        """The stand-in's repository of `project` (vmd names it <owner's digest>-<project> in
        the service's organisation)."""
        found = self.run("gitea", "sh", "-c", f"ls -d /srv/gitea/*/*-{project}.git 2>/dev/null || true").stdout.split()
        return found[0] if found else ""

    def git(self, repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("gitea", "git", "--git-dir", repo, *args, check=check)

    def host_record(self, job_id: str) -> dict:
        return json.loads(self.run("head", "cat", f"/var/lib/vmagent/service/jobs/{job_id}/host.json").stdout)

    def qemu_pids(self) -> set[int]:
        """Host pids of the QEMU processes in this fleet's containers (by their cgroup)."""
        ids = subprocess.run([DOCKER, "ps", "-aq", "--no-trunc", "--filter",
                              f"label=com.docker.compose.project={self.project}"],
                             capture_output=True, text=True).stdout.split()
        pids = set()
        for line in subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()[1:]:
            if "qemu-system" not in line:
                continue
            pid = int(line.split()[0])
            try:
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if any(c in cgroup for c in ids):
                pids.add(pid)
        return pids


def health(container_id: str) -> str:
    out = subprocess.run([DOCKER, "inspect", "--format",
                          "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.ExitCode}}",
                          container_id], capture_output=True, text=True)
    return out.stdout.strip()






@contextlib.contextmanager
def running_fleet(log_dir: Path, project: str | None = None) -> Iterator["Fleet"]:
    """The fleet built, up, every service healthy and both hosts usable; down -v after,
    with no QEMU process of it left."""
    fleet = Fleet(Path(log_dir) / "compose.log", free_port(), project or f"vmagent-fleet-{os.getpid()}")
    started = time.monotonic()
    try:
        fleet.compose("build", timeout=1800)
        fleet.timings["build"] = time.monotonic() - started
        fleet.compose("up", "-d")
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while True:
            states = {s: health(fleet.container(s)) for s in SERVICES + ("gitea-init",)}
            if all(states[s].startswith("running healthy") for s in SERVICES) and states["gitea-init"] == "exited  0":
                break
            assert not any("unhealthy" in v or (v.startswith("exited") and not v.endswith(" 0"))
                           for v in states.values()), states
            assert time.monotonic() < deadline, f"not healthy within {HEALTHY_WITHIN_S} s: {states}"
            time.sleep(3)
        fleet.timings["healthy"] = time.monotonic() - started
        fleet.wait_usable(HOSTS, 300)
        fleet.timings["hosts joined"] = time.monotonic() - started
        yield fleet
    finally:
        fleet.compose("logs", "--no-color", "--tail", "300", check=False)
        down = time.monotonic()
        fleet.compose("down", "-v", "--remove-orphans", check=False)
        fleet.timings["down"] = time.monotonic() - down
        fleet.timings["all"] = time.monotonic() - started
        print(f"compose fleet timings: {json.dumps({k: round(v) for k, v in fleet.timings.items()})}; "
              f"log {fleet.log}", flush=True)
        alive = fleet.qemu_pids()
        assert not alive, f"QEMU processes of the fleet outlived docker-compose down: {alive}"
