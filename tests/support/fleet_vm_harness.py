"""The whole fleet on this machine, with real guests: the job service placing jobs through
Ray onto two vmd hosts (tests/e2e/test_ray_cluster_vm.py).

    with fleet(work, images_dir) as f:
        f.models.play(TASK, [turn, turn, ...])   # the scripted model's turns for one job
        job_id = f.submit(TASK, project="greet")
        f.wait(job_id, "done", timeout=600)
        f.lose("a")                               # host a dies: node, vmd and guest gone

What runs:
- a stand-in Gitea (tests/support/gitea_server.py) that both vmds keep their projects on
  (GITEA_URL, GITEA_TOKEN; owner mode "user": a job of alice goes to alice/<project>);
- the scripted Ollama (tests/support/ollama_server.py), whose turns are routed per job by its task
  (`Models`), so one module's tests share it without one test's unplayed turns reaching
  the next test's job;
- two `vmd serve` processes, hosts "a" and "b" (tests/support/vmd_process.py): their own state dir
  and socket, one images folder, no warm pool (two vmds on one host would each size a
  pool for the whole host);
- a Ray cluster (tests/support/ray_harness.py): a head without guest slots and one node per host
  with {"vm_slot": 1, "os_linux": 1} and the labels naming the host and its vmd's socket;
- the job service (tests/support/service_harness.py) with VMAGENT_EXECUTOR=ray and RAY_ADDRESS, so
  each job's worker runs on whichever host Ray placed it (vmagent/service/ray_worker.py).

Everything is torn down at the end, every guest made under the work folder included.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from tests.support.gitea_server import FakeGitea, start_gitea
from tests.support.guests import clean_up_domains, domains_of, wait_for
from tests.support.ollama_server import Turn, start_ollama
from tests.support.ray_harness import RayCluster, ray_cluster
from tests.support.service_harness import ALICE, REAL_WORKER, ServiceProcess, real_worker_env, stop_workers
from tests.support.vmd_process import VmdProcess

TOKEN = "0123456789abcdef0123456789abcdef01234567"
OWNER = "alice"  # the user ALICE's token names in the service; vmd's Gitea owner in mode "user"


class Models:
    """The scripted model's turns, per job: a chat request goes to the turns of the task its
    user messages name (the loop puts the task in the first user message). A request of a
    task with no turns left is answered 400, as the script server does."""

    def __init__(self) -> None:
        self._turns: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self.requests: dict[str, list[dict]] = {}

    def play(self, task: str, turns: list[Any]) -> None:
        with self._lock:
            self._turns.setdefault(task, []).extend(turns)
            self.requests.setdefault(task, [])

    def left(self, task: str) -> int:
        with self._lock:
            return len(self._turns.get(task, []))

    def __call__(self, body: dict) -> Any:
        texts = [str(m.get("content", "")) for m in body.get("messages") or [] if m.get("role") == "user"]
        with self._lock:
            task = next((t for t in self._turns if any(t in text for text in texts)), None)
            if task is None:
                return Turn(status=400, error="no scripted turns for this job's task")
            self.requests[task].append(body)
            if not self._turns[task]:
                return Turn(status=400, error="the test script has no more turns")
            entry = self._turns[task].pop(0)
        return entry(body) if callable(entry) else entry


@dataclass
class Host:
    name: str
    work: Path
    vmd: VmdProcess
    alive: bool = True

    @property
    def state(self) -> Path:
        return self.vmd.state

    def record(self, session_id: str) -> list[dict]:
        return self.vmd.record(session_id)

    def has_session(self, session_id: str) -> bool:
        return (self.state / "sessions" / session_id / "session.json").exists()


@dataclass
class Fleet:
    work: Path
    gitea: FakeGitea
    models: Models
    hosts: dict[str, Host]
    cluster: RayCluster
    service: ServiceProcess
    conn: Any  # libvirt connection

    # --- the job service -------------------------------------------------------------

    def submit(self, task: str, project: str, os: str = "debian") -> str:
        with self.service.client(ALICE) as client:
            answer = client.post("/jobs", json={"task": task, "project": project, "os": os})
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def job(self, job_id: str) -> dict:
        with self.service.client(ALICE) as client:
            return client.get(f"/jobs/{job_id}").json()

    def wait(self, job_id: str, states: set[str] | str, timeout: float) -> dict:
        """The job once it is in one of `states`; fails early when it rests in another."""
        wanted = {states} if isinstance(states, str) else set(states)
        resting = {"done", "failed", "cancelled", "needs_input", "needs_approval"} - wanted
        deadline = time.monotonic() + timeout
        job: dict = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job.get("state") in wanted:
                return job
            if job.get("state") in resting:
                raise AssertionError(f"job {job_id} ended {job['state']!r}, wanted {wanted}: "
                                     f"{json.dumps(job)[:3000]}\n{self.tail(job_id)}")
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} stayed {job.get('state')!r} for {timeout:.0f} s, wanted {wanted}\n"
                             f"{self.tail(job_id)}")

    def answer(self, job_id: str, text: str) -> dict:
        with self.service.client(ALICE) as client:
            answer = client.post(f"/jobs/{job_id}/answer", json={"answer": text})
        assert answer.status_code == 200, answer.text
        return answer.json()

    def events(self, job_id: str) -> list[dict]:
        """The job's events as the service keeps them (the SSE feed's data, not followed)."""
        with self.service.client(ALICE) as client:
            text = client.get(f"/jobs/{job_id}/events", params={"follow": "false"}).text
        return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]

    def statuses(self, job_id: str) -> list[str]:
        return [e.get("text", "") for e in self.events(job_id) if e.get("type") == "status"]

    def job_dir(self, job_id: str) -> Path:
        return self.service.data_dir / "jobs" / job_id

    def host_file(self, job_id: str) -> dict:
        """DIR/host.json: where the job runs and where it ran (vmagent/service/ray_worker.py)."""
        return json.loads((self.job_dir(job_id) / "host.json").read_text())

    def tail(self, job_id: str) -> str:
        """What to show when a job went wrong: the shim's log, the service's, the vmds'."""
        parts = []
        for path in [self.job_dir(job_id) / "worker.log", self.service.data_dir / "service.log",
                     *(h.vmd.log_path for h in self.hosts.values())]:
            try:
                parts.append(f"--- {path.name} ({path.parent.name})\n{path.read_text()[-3000:]}")
            except OSError:
                pass
        return "\n".join(parts)

    # --- hosts -------------------------------------------------------------------------

    def host_of_session(self, session_id: str) -> Host:
        [host] = [h for h in self.hosts.values() if h.has_session(session_id)]
        return host

    def lose(self, name: str) -> list[str]:
        """Host `name` dies as a machine does: its Ray node goes without a goodbye (the job's
        actor and worker with it), its vmd is killed with its sessions open, and its guests
        are destroyed. -> the names of the guests destroyed."""
        host = self.hosts[name]
        self.cluster.remove_host(name)
        host.vmd.kill()
        host.alive = False
        guests = domains_of(self.conn, str(host.work))
        clean_up_domains(self.conn, str(host.work))
        return guests

    def guests(self) -> list[str]:
        """The guests (defined or running) made under this fleet's work folder."""
        return domains_of(self.conn, str(self.work))

    def no_guest_left(self, timeout: float = 60) -> None:
        wait_for(lambda: not self.guests(), timeout=timeout, what="every guest of the fleet gone")

    # --- Gitea -------------------------------------------------------------------------

    def git(self, project: str, *args: str) -> str:
        git_dir = self.gitea.repo_path(OWNER, project)
        return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True,
                              check=True).stdout

    def pushed_subjects(self, project: str) -> list[str]:
        """The subjects of main's commits on Gitea, oldest first ([] before the first push)."""
        if self.gitea.repo(OWNER, project) is None:
            return []
        try:
            return self.git(project, "log", "--reverse", "--format=%s", "main").splitlines()
        except subprocess.CalledProcessError:
            return []  # created, nothing pushed yet


@contextlib.contextmanager
def fleet(work: Path, images_dir: Path, host_names: tuple[str, ...] = ("a", "b"),
          worker_env: dict[str, str] | None = None) -> Iterator[Fleet]:
    import libvirt

    work.mkdir(parents=True, exist_ok=True)
    conn = libvirt.open("qemu:///system")
    models = Models()
    hosts: dict[str, Host] = {}
    service: ServiceProcess | None = None
    try:
        with start_gitea(work, token=TOKEN) as gitea, start_ollama(default=models) as ollama:
            vmd_env = {"GITEA_URL": gitea.url, "GITEA_TOKEN": TOKEN, "GITEA_OWNER_MODE": "user"}
            for name in host_names:
                folder = work / f"host-{name}"
                folder.mkdir(exist_ok=True)
                hosts[name] = Host(name, folder, VmdProcess(folder, images_dir, **vmd_env).start())
            with ray_cluster({name: str(h.vmd.socket) for name, h in hosts.items()}) as cluster:
                env = {**real_worker_env(ollama.url), "VMAGENT_SCREEN_WATCH_S": "0",
                       "VMAGENT_EXECUTOR": "ray", "RAY_ADDRESS": cluster.address, **(worker_env or {})}
                # No vmd_socket: with Ray each job's host gives its worker that host's vmd.
                service = ServiceProcess(work / "svc", worker_command=REAL_WORKER, env=env,
                                         log_level="info").start()
                handle = Fleet(work, gitea, models, hosts, cluster, service, conn)
                try:
                    yield handle
                finally:
                    service.stop()
                    stop_workers(service)
    finally:
        for host in hosts.values():
            host.vmd.stop()
        clean_up_domains(conn, str(work))
        conn.close()


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """tests/support/guests.py wait_for, polled at a guest's pace."""
    return wait_for(predicate, timeout=timeout, what=what, poll=0.5)
