"""The compose stack, run: `docker-compose up -d` with the CI override (scripts/compose-ci.sh,
docker/ci/compose.ci.yml) → every service healthy → a job posted to the job service runs
in the vmd container (libvirtd inside, no privileged mode) on a real guest under TCG and
pushes to the Gitea stand-in → `docker-compose down -v` leaves no guest behind.

Marker `compose`: needs root, dockerd, docker-compose, debootstrap, the cached Open WebUI
environment (tests/support/openwebui_harness.py) and the debian guest image. It takes about five
minutes and a stack of containers, so outside CI it runs only when asked
(VMAGENT_COMPOSE_TESTS=1); in CI a missing piece fails it, and .ci/run fails when it was
skipped or did not run. Each run is its own compose project (its own containers,
volumes, network and ports), so runs side by side do not stop each other's stack.
COMPOSE="docker compose" runs it with the v2 plugin instead of docker-compose v1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service_harness import free_port

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compose-ci.sh"
PROJECT = f"vmagent-ci-test-{os.getpid()}"
USER_TOKEN = "ci-user-token"  # scripts/compose-ci.sh's VMAGENT_TOKENS: user "ci"
SERVICES = ("vmd", "vmagent", "gitea", "ollama", "open-webui")
ONE_SHOTS = ("gitea-init", "open-webui-init")
HEALTHY_WITHIN_S = 600
JOB_WITHIN_S = 1200


def missing() -> str:
    if not (os.environ.get("CI") or os.environ.get("VMAGENT_COMPOSE_TESTS")):
        return "the compose stack runs in CI, or with VMAGENT_COMPOSE_TESTS=1 (about five minutes)"
    if os.geteuid() != 0:
        return "needs root (debootstrap for the base image, docker)"
    for tool in ("docker-compose", "debootstrap"):
        if not shutil.which(tool, path="/usr/bin:/usr/sbin:" + os.environ.get("PATH", "")):
            return f"{tool} is not installed (apt-get install docker.io docker-compose debootstrap)"
    if subprocess.run(["/usr/bin/docker", "info"], capture_output=True).returncode != 0:
        return "dockerd is not running"
    from tests.support.openwebui_harness import installed, missing_reason
    if installed() is None:
        return missing_reason()
    from vmd.machines.images import ImageMissing, find_image
    try:
        find_image("debian")
    except ImageMissing as exc:
        return str(exc)
    return ""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the compose stack must run in CI: {reason}")
        pytest.skip(reason)
    ports = {"VMAGENT_PORT": free_port(), "GITEA_PORT": free_port(), "OPEN_WEBUI_PORT": free_port()}
    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, **{k: str(v) for k, v in ports.items()}}
    log = tmp_path_factory.mktemp("compose") / "compose.log"
    timings: dict[str, float] = {}

    def compose(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        started = time.monotonic()
        done = subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
        with open(log, "a") as out:
            out.write(f"$ compose {' '.join(args)} ({time.monotonic() - started:.0f} s, exit {done.returncode})\n"
                      f"{done.stdout}{done.stderr}\n")
        if check:
            assert done.returncode == 0, f"compose {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    started = time.monotonic()
    compose("build")
    timings["build"] = time.monotonic() - started
    compose("up", "-d")
    timings["up"] = time.monotonic() - started
    try:
        yield compose, ports, timings
    finally:
        vmd_id = container(compose, "vmd")
        guests = qemu_pids(vmd_id) if vmd_id else set()
        compose("logs", "--no-color", "--tail", "200", check=False)
        started = time.monotonic()
        compose("down", "-v", "--remove-orphans", check=False)
        timings["down"] = time.monotonic() - started
        print(f"compose stack timings: {json.dumps({k: round(v) for k, v in timings.items()})}; log {log}")
        # No guest outlives the stack: vmd's QEMU processes went with its container.
        alive = {pid for pid in guests if Path(f"/proc/{pid}").exists()}
        assert not alive, f"QEMU processes of the stack's vmd outlived docker-compose down: {alive}"


def container(compose, service: str) -> str:
    return compose("ps", "-q", service).stdout.strip()


def health(container_id: str) -> str:
    out = subprocess.run(["/usr/bin/docker", "inspect", "--format",
                          "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.ExitCode}}",
                          container_id], capture_output=True, text=True)
    return out.stdout.strip()


def qemu_pids(container_id: str) -> set[int]:
    """Host pids of the QEMU processes running in a container."""
    out = subprocess.run(["/usr/bin/docker", "top", container_id, "-eo", "pid,args"], capture_output=True, text=True)
    return {int(line.split()[0]) for line in out.stdout.splitlines()[1:] if "qemu-system" in line}


def test_the_stack_comes_up_runs_a_job_on_a_real_guest_and_pushes(stack):
    compose, ports, timings = stack
    started = time.monotonic()

    # --- every service healthy, the one-shots done ---------------------------------------
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while True:
        states = {s: health(container(compose, s)) for s in SERVICES + ONE_SHOTS}
        if all(states[s].startswith("running healthy") for s in SERVICES) and \
                all(states[s] == "exited  0" for s in ONE_SHOTS):
            break
        assert not any("unhealthy" in v or (v.startswith("exited") and not v.endswith(" 0"))
                       for v in states.values()), states
        assert time.monotonic() < deadline, f"not healthy within {HEALTHY_WITHIN_S} s: {states}"
        time.sleep(3)
    timings["healthy"] = time.monotonic() - started + timings["up"]

    # vmd runs unprivileged, with only the capabilities the compose file names.
    vmd_id = container(compose, "vmd")
    inspect = json.loads(subprocess.run(["/usr/bin/docker", "inspect", vmd_id], capture_output=True,
                                        text=True, check=True).stdout)[0]["HostConfig"]
    assert inspect["Privileged"] is False and sorted(inspect["CapAdd"]) == ["NET_ADMIN", "SYS_ADMIN"]

    # the doctor, inside vmd, finds the whole stack in order
    doctor = compose("exec", "-T", "vmd", "python3", "-m", "vmd.server.doctor", "--json")
    findings = {f["check"]: f for f in json.loads(doctor.stdout)}
    assert all(f["status"] in ("ok", "warn") for f in findings.values()), findings
    assert findings["gitea"]["status"] == "ok" and findings["socket"]["status"] == "ok"
    # the egress guard holds in vmd's container: QEMU's user is refused the container's loopback
    assert findings["egress"]["status"] == "ok", findings["egress"]

    # Open WebUI was provisioned: the tool is there with its valves from the environment.
    webui = f"http://127.0.0.1:{ports['OPEN_WEBUI_PORT']}"
    signin = httpx.post(f"{webui}/api/v1/auths/signin", timeout=30,
                        json={"email": "admin@localhost", "password": "ci-webui-password"}).json()
    tool = httpx.get(f"{webui}/api/v1/tools/id/vm_agent/valves", timeout=30,
                     headers={"Authorization": f"Bearer {signin['token']}"}).json()
    assert tool["service_url"] == "http://vmagent:8700" and tool["service_token"] == "ci-service-token"

    # --- a job, through the job service, on a real guest in the vmd container ------------
    service = httpx.Client(base_url=f"http://127.0.0.1:{ports['VMAGENT_PORT']}", timeout=30,
                           headers={"Authorization": f"Bearer {USER_TOKEN}"})
    job_started = time.monotonic()
    job = service.post("/jobs", json={"task": "Write hello.py that prints a greeting", "os": "debian",
                                      "project": "compose-demo"}).json()
    deadline = time.monotonic() + JOB_WITHIN_S
    while job["state"] not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"the job did not end within {JOB_WITHIN_S} s: {job}"
        time.sleep(5)
        job = service.get(f"/jobs/{job['id']}").json()
    timings["job"] = time.monotonic() - job_started
    assert job["state"] == "done", job["report"]
    assert job["verification"]["passed"] is True, job["report"]
    assert "NOT pushed" not in job["report"] and "compose-demo/commit/" in job["report"], job["report"]

    # the push landed in the Gitea stand-in: the organisation's repository holds hello.py
    pushed = compose("exec", "-T", "gitea", "sh", "-c",
                     "for r in /srv/gitea/*/*.git; do echo \"$r\"; git --git-dir \"$r\" show main:hello.py; done")
    assert "compose-demo.git" in pushed.stdout and "print('hello from compose')" in pushed.stdout, pushed.stdout

    # the session is closed and its guest gone; no domain is left in vmd's libvirtd
    domains = compose("exec", "-T", "vmd", "virsh", "-c", "qemu:///system", "list", "--all", "--name")
    assert not domains.stdout.strip(), domains.stdout
    assert not qemu_pids(vmd_id)

    # the job service sees none of vmd's folders, and answers a question about the job from
    # its record and the project's history, which it asks vmd for (the `history` verb)
    seen = compose("exec", "-T", "vmagent", "ls", "/var/lib/vmagent/state", check=False)
    assert seen.returncode != 0, seen.stdout
    answer = service.post(f"/jobs/{job['id']}/ask", json={"question": "What changed in hello.py?"},
                          timeout=120)
    assert answer.status_code == 200, answer.text
    assert {"report", "git"} <= set(answer.json()["sources"]), answer.text
