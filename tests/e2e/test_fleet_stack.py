"""The compose fleet, run (issue 38): `scripts/compose-ci.sh --fleet up` (docker-compose.fleet.yml
with docker/ci/fleet.ci.yml) brings up the head (the job service and the Ray head) and two
KVM hosts, each a container of its own with vmd, libvirtd and a Ray node, on a private
network, with the Gitea and model stand-ins. Real Ray nodes in separate containers, real
vmds and guests under TCG, `docker kill` of the host running a job.

In order, on one fleet (guests under TCG are the cost: each test reuses what the one
before left, and the fleet boots four guests in all):

1. Nobody without the token gets in: the token is private and in no log; Ray listens on
   the fleet's network only, with no dashboard; a driver and a node from another container
   on that network without the token are turned away; `vmagent hosts` shows both hosts
   usable, their version and auth.
2. A host killed mid-command costs the job nothing: it carries on on the other host from
   its pushed checkpoint, finishes verified and proven, keeps every commit made before the
   kill, and its events say where it ran and why it moved.
3. The job service killed mid-job: the job carries on when the service returns.
4. The killed host comes back: its vmd reaps the lost guest, and the host is usable again.

Marker `fleet`: needs root, dockerd, docker-compose, debootstrap and the debian guest image
(both hosts mount it read-only). Outside CI it runs with VMAGENT_FLEET_TESTS=1; in CI a
missing piece fails it, and .ci/run fails when it was skipped or did not run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.support.fleet_jobs import LONG_MARK, MOVES, NOTE, STAY_MARK, STAYS
from tests.support.fleet_stack import DOCKER, HOSTS, missing, running_fleet

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(3000)]

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the compose fleet must run in CI: {reason}")
        pytest.skip(reason)
    with running_fleet(tmp_path_factory.mktemp("fleet"), f"vmagent-fleet-test-{os.getpid()}") as made:
        yield made


LISTENERS = r"""
import json, socket
def rows(path, v6):
    out = []
    for line in open(path).read().splitlines()[1:]:
        f = line.split()
        if f[3] != "0A":
            continue
        host, port = f[1].split(":")
        raw = bytes.fromhex(host)
        if v6:
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
            addr = socket.inet_ntop(socket.AF_INET6, raw)
        else:
            addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
        out.append([addr, int(port, 16)])
    return out
listening = rows("/proc/net/tcp", False) + rows("/proc/net/tcp6", True)
import fcntl, struct
addresses = []
names = [n for _, n in socket.if_nameindex()]
for name in names:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        addresses.append([name, socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))[20:24])])
    except OSError:
        addresses.append([name, None])
print(json.dumps({"listening": listening, "interfaces": addresses}))
"""


def test_nobody_without_the_token_gets_into_the_fleets_ray(fleet):
    # The token: made by the head at its first start, its user's only, in no log.
    mode = fleet.run("head", "stat", "-c", "%a %U", "/var/lib/vmagent/ray/token").stdout.split()
    assert mode == ["600", "vmagent"], mode
    token = fleet.run("head", "cat", "/var/lib/vmagent/ray/token").stdout.strip()
    assert len(token) >= 32
    logs = fleet.compose("logs", "--no-color", "head", *HOSTS).stdout
    assert "ray-node" in logs and token not in logs
    for service in ("head", *HOSTS):
        found = fleet.run(service, "grep", "-rlF", token, "/tmp/ray", user="0", check=False)
        assert found.returncode == 1 and not found.stdout, f"{service}: the token is in {found.stdout}"

    # Ray listens on the fleet's network only: each container's one network besides loopback,
    # the fleet's; no dashboard (8265) on the head, whose GCS (6379) is there.
    network = json.loads(subprocess.run([DOCKER, "network", "inspect", f"{fleet.project}_fleet"], capture_output=True,
                                         text=True, check=True).stdout)[0]
    subnet = network["IPAM"]["Config"][0]["Subnet"]
    import ipaddress

    for service in ("head", *HOSTS):
        seen = json.loads(fleet.run(service, "python3", "-c", LISTENERS).stdout)
        interfaces = {name: addr for name, addr in seen["interfaces"] if name != "lo"}
        assert len(interfaces) == 1, (service, interfaces)
        own = next(iter(interfaces.values()))
        assert ipaddress.ip_address(own) in ipaddress.ip_network(subnet), (service, own, subnet)
        for addr, port in seen["listening"]:
            ip = ipaddress.ip_address(addr)
            ip = ip.ipv4_mapped or ip if ip.version == 6 else ip
            # loopback (Docker's DNS at 127.0.0.11 too), the fleet's address, or every address
            # of a namespace whose one network is the fleet's
            assert ip.is_loopback or ip.is_unspecified or str(ip) == own, (service, addr, port)
        ports = {port for _, port in seen["listening"]}
        if service == "head":
            assert 6379 in ports and 8265 not in ports, ports

    # A stranger's machine on the fleet's network, without the token: Ray turns away its
    # driver and its node; the cluster never lists the node.
    image = subprocess.run([DOCKER, "inspect", "--format", "{{.Config.Image}}", fleet.container("host-a")],
                           capture_output=True, text=True, check=True).stdout.strip()
    stranger = ["timeout", "40", "sh", "-c"]
    driver = subprocess.run(
        [DOCKER, "run", "--rm", "--network", f"{fleet.project}_fleet", "--entrypoint", "", image, *stranger,
         "python3 -c \"import ray; ray.init(address='head:6379'); print('GOT IN')\""],
        capture_output=True, text=True, timeout=120)
    assert "GOT IN" not in driver.stdout and "Unauthenticated" in driver.stderr, driver.stderr[-2000:]
    node = subprocess.run(
        [DOCKER, "run", "--rm", "--network", f"{fleet.project}_fleet", "--shm-size", "256m", "--entrypoint", "", image,
         *stranger, "ray start --address=head:6379 --block --num-cpus=1 --object-store-memory=83886080 "
                    "--resources='{\"vm_slot\": 1, \"os_linux\": 1}' --labels='{\"vmagent-host\": \"intruder\"}'"],
        capture_output=True, text=True, timeout=120)
    assert "Unauthenticated" in node.stdout + node.stderr, (node.stdout + node.stderr)[-2000:]
    assert "intruder" not in fleet.hosts()

    # The operator's view: both hosts usable, the head's version and token auth everywhere.
    shown = fleet.run("head", "vmagent", "hosts").stdout
    assert "cluster auth: token" in shown, shown
    hosts = fleet.hosts()
    version = fleet.client().get("/hosts").json()["version"]
    for name in HOSTS:
        assert hosts[name]["usable"] and hosts[name]["vmagent_version"] == version, hosts[name]
        assert hosts[name]["ray_auth"] == "token" and hosts[name]["slots_total"] == 1, hosts[name]


def test_a_host_killed_mid_command_costs_the_job_nothing(fleet):
    service = fleet.client()
    started = time.monotonic()
    job = service.post("/jobs", json={"task": MOVES, "os": "debian", "project": "fleet-notes"}).json()
    job_id = job["id"]
    first = fleet.wait_event(job_id, lambda e: str(e.get("text", "")).startswith("running on host "), 300,
                             "placement")["text"].removeprefix("running on host ")
    assert first in HOSTS
    # The first task's checkpoint reaches Gitea at once: that commit must survive the host.
    deadline = time.monotonic() + 600
    while not (repo := fleet.gitea_repo("fleet-notes")) or \
            fleet.git(repo, "show", "main:notes.txt", check=False).stdout.strip() != NOTE:
        assert time.monotonic() < deadline, f"no checkpoint in Gitea: {fleet.job(job_id)}"
        time.sleep(3)
    before = fleet.git(repo, "log", "--format=%H", "main").stdout.split()
    fleet.wait_event(job_id, lambda e: LONG_MARK in str(e.get("line", "")), 300, "the long command")
    lost_session = fleet.job(job_id)["session_id"]
    fleet.timings["to the kill"] = time.monotonic() - started

    killed_at = time.monotonic()
    subprocess.run([DOCKER, "kill", fleet.container(first)], check=True, capture_output=True)
    fleet.lost = {"host": first, "session": lost_session}
    fleet.wait_event(job_id, lambda e: str(e.get("text", "")).startswith(f"host {first} lost"), 300,
                     "the host's loss")
    fleet.timings["loss told"] = time.monotonic() - killed_at
    other = next(h for h in HOSTS if h != first)
    fleet.wait_event(job_id, lambda e: e.get("text") == f"running on host {other}", 300, "the move")

    ended = fleet.wait_end(job_id)
    fleet.timings["job"] = time.monotonic() - started
    assert ended["state"] == "done", ended["report"]
    assert ended["verification"]["passed"] is True and ended["verification"]["proven"] is True, ended["report"]
    assert ended["session_id"] != lost_session

    # Nothing committed before the kill is lost: each commit is in main's history, with the
    # note, and the count made on the other host beside it.
    after = fleet.git(repo, "log", "--format=%H", "main").stdout.split()
    assert set(before) <= set(after), (before, after)
    assert fleet.git(repo, "show", "main:notes.txt").stdout.strip() == NOTE
    assert fleet.git(repo, "show", "main:count.txt").stdout.strip() == "1"

    # The events say where it ran and why it moved, in that order; so does host.json.
    texts = [str(e.get("text", "")) for e in fleet.events(job_id)]
    marks = [next(i for i, t in enumerate(texts) if t.startswith(prefix)) for prefix in
             (f"running on host {first}", f"host {first} lost", f"running on host {other}",
              "the job runs again on a new machine: from the checkpoint")]
    assert marks == sorted(marks), texts
    runs = fleet.host_record(job_id)["runs"]
    assert [r["host"] for r in runs] == [first, other] and runs[0]["why"].startswith("lost: "), runs


def test_the_job_service_killed_mid_job_carries_on_when_it_returns(fleet):
    service = fleet.client()
    job_id = service.post("/jobs", json={"task": STAYS, "os": "debian", "project": "fleet-hello"}).json()["id"]
    fleet.wait_event(job_id, lambda e: STAY_MARK in str(e.get("line", "")), 600, "the command to outlive")
    top = subprocess.run([DOCKER, "top", fleet.container("head"), "-eo", "pid,args"], capture_output=True,
                         text=True, check=True).stdout.splitlines()[1:]
    pids = [int(line.split()[0]) for line in top if "-m vmagent.service --host" in line]  # not the shims
    assert len(pids) == 1, top
    os.kill(pids[0], signal.SIGKILL)  # the service only: the job's shim is a process of its own
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{fleet.port}/healthz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the job service did not come back"
        time.sleep(1)
    ended = fleet.wait_end(job_id)
    assert ended["state"] == "done" and ended["verification"]["passed"] is True, ended["report"]
    # The same run all along: the shim and the worker on the host never noticed.
    runs = fleet.host_record(job_id)["runs"]
    assert len(runs) == 1 and runs[0]["why"] == "done", runs
    assert not any("lost" in str(e.get("text", "")) for e in fleet.events(job_id))
    repo = fleet.gitea_repo("fleet-hello")
    assert fleet.git(repo, "show", "main:hello.txt").stdout.strip() == "hello"


def test_the_killed_host_comes_back_reaps_its_guest_and_is_usable(fleet):
    lost = fleet.lost
    assert lost, "the host-loss test left no killed host (it failed before its kill)"
    host, session = lost["host"], lost["session"]
    came_back = time.monotonic()
    subprocess.run([DOCKER, "start", fleet.container(host)], check=True, capture_output=True)
    fleet.wait_usable((host,), 600)
    fleet.timings["comeback"] = time.monotonic() - came_back
    deadline = time.monotonic() + 300
    while True:
        rows = {r["id"]: r for r in json.loads(fleet.run(host, "vmd", "sessions", "--json").stdout)}
        row = rows.get(session, {})
        if row.get("state") == "closed":
            break
        assert time.monotonic() < deadline, f"the lost session was not reaped: {row}"
        time.sleep(3)
    assert row["machine"] in ("none", "unknown"), row
    domains = fleet.run(host, "virsh", "-c", "qemu:///system", "list", "--all", "--name").stdout.split()
    assert f"vmagent-{session}" not in domains and row["machine_name"] not in domains, domains
