"""The Ray cluster no stranger can use (issue 38, vmagent/fleet/cluster_auth.py, ray_node.py):
real Ray heads on 127.0.0.1 (tests/support/ray_heads.py), started as a person starts them.

- `vmagent ray-node head` makes the token at its first start (0600, its folder 0700), never
  prints or logs it, and its cluster turns away a client without the token or with another
  one (Ray's own `ray status`, as cluster_auth.probe asks) while it takes one with it; a
  real driver and a real node turned away are in the compose fleet's test, where they come
  from another machine (tests/e2e/test_fleet_stack.py);
- a bare `ray start --head` (Ray 2.60's default: no auth) lets a client in without a token,
  and a job of the job service refuses that cluster with the reason, unless the operator
  set the override;
- `vmagent ray-node host` says in a sentence, within its wait, that the head does not
  answer, that the head refused its token, or that its token file is not private; never a
  `ray start` retrying for ever.

(A node without the token cannot join: a Ray CLI node cannot join a head on loopback, so
that one runs in the compose fleet, tests/e2e/test_fleet_stack.py.)
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.service_harness import REPO, free_port
from vmagent.fleet import cluster_auth

pytest.importorskip("ray")
pytestmark = pytest.mark.ray
from tests.support.ray_heads import open_head, vmagent_head  # noqa: E402


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    folder = tmp_path_factory.mktemp("head") / "secrets"  # made by the head, not here
    token = folder / "token"
    started = time.monotonic()
    with vmagent_head(token) as head:
        head.started_in = time.monotonic() - started
        yield head, token


def test_the_head_makes_its_token_once_private_and_never_shows_it(token_head, tmp_path):
    head, token = token_head
    secret = token.read_text()
    assert len(secret) >= 32
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert str(token) in head.log.read_text()  # where it is, said...
    assert secret not in head.logs_text()  # ...never what it is, in its output or Ray's logs
    # A second start of the head with the same file keeps the token (the hosts hold copies).
    assert not cluster_auth.make_token(token) and token.read_text() == secret
    # A token file others can read is refused, with the fix.
    loose = tmp_path / "loose"
    loose.write_text("x" * 64)
    loose.chmod(0o644)
    with pytest.raises(cluster_auth.TokenProblem, match="chmod 600"):
        cluster_auth.make_token(loose)


def test_a_client_without_the_token_or_with_another_is_turned_away(token_head, tmp_path):
    head, token = token_head
    bare = cluster_auth.probe(head.address)
    assert bare.outcome == "refused", bare
    other = tmp_path / "other"
    cluster_auth.make_token(other)
    wrong = cluster_auth.probe(head.address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(other)})
    assert wrong.outcome == "refused", wrong
    right = cluster_auth.probe(head.address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    assert right.outcome == "connected", right
    # Ray's own words for a refusal are what the probe reads: it fails here when Ray rewords it.
    assert bare.seconds < cluster_auth.PROBE_WAIT_S and wrong.seconds < cluster_auth.PROBE_WAIT_S
    print(f"head started in {head.started_in:.1f} s; probes: no token refused in {bare.seconds:.1f} s, "
          f"wrong token in {wrong.seconds:.1f} s, right token in {right.seconds:.1f} s")


def test_the_listing_reads_rays_free_slots_where_ray_keeps_them(token_head):
    """vmagent/fleet/hosts.py reads each node's free resources through Ray's DeveloperAPI (no
    public call gives them per node): this fails when Ray moves or renames it."""
    head, token = token_head
    code = ("import logging, ray; from vmagent.fleet.hosts import free_slots_per_node; "
            f"ray.init(address={head.address!r}, log_to_driver=False, logging_level=logging.ERROR); "
            "free = free_slots_per_node(); node = ray.nodes()[0]['NodeID']; "
            "print(sorted(free), node, sorted(free[node]))")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    nodes, node, resources = done.stdout.split(" ", 2)
    assert node in nodes and "object_store_memory" in resources


def test_a_job_refuses_a_cluster_without_auth_unless_the_operator_allows_it(tmp_path):
    with open_head() as head:
        answer = cluster_auth.probe(head.address)
        assert answer.outcome == "connected", answer
        refused = run_shim(tmp_path / "refused", head.address)
        assert "runs without authentication" in refused and "CVE-2023-48022" in refused, refused
        assert "ray_allow_unauthenticated" in refused
        # With the override the job goes on to placement (this cluster has no host).
        allowed = run_shim(tmp_path / "allowed", head.address, "--allow-unauthenticated")
        assert "No host in the Ray cluster offers vm_slot" in allowed, allowed


def run_shim(job_dir: Path, address: str, *flags: str) -> str:
    """The shim as the service starts it for a job; the report of its done frame."""
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"job_id": "j1", "mode": "run", "cancel": False, "spec": {
        "task": "t", "os": "debian", "project": "p", "owner": "o", "chat_id": "", "model": "m", "web": False}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    if not flags:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=os.environ["RAY_AUTH_TOKEN_PATH"])
    done = subprocess.run([sys.executable, "-m", "vmagent.service.ray_worker", "--job-dir", str(job_dir),
                           "--ray-address", address, *flags], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)
    frames = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert frames and frames[-1]["type"] == "done", (done.stdout[-2000:], done.stderr[-2000:])
    return frames[-1]["outcome"]["report"]


def test_the_service_needs_a_token_for_the_ray_executor_unless_allowed(monkeypatch, tmp_path):
    from vmagent.service.config import ServiceConfig

    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    with pytest.raises(ValueError, match="no Ray token.*vmagent ray-node head"):
        ServiceConfig(executor="ray")
    assert ServiceConfig(executor="ray", ray_allow_unauthenticated=True).ray_auth_env() == {}
    token = tmp_path / "token"
    cluster_auth.make_token(token)
    config = ServiceConfig(executor="ray", ray_token_file=str(token))
    assert config.ray_auth_env() == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    assert "--allow-unauthenticated" not in config.resolved_worker_command()
    token.chmod(0o640)
    with pytest.raises(ValueError, match="readable by others"):
        ServiceConfig(executor="ray", ray_token_file=str(token))


def ray_node_host(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "vmagent.cli", "ray-node", "host", "--name", "h1",
                           "--slots", "1", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    return done, time.monotonic() - started


def test_a_host_says_in_a_sentence_when_its_head_does_not_answer_or_refuses_its_token(token_head, tmp_path):
    head, _ = token_head
    mine = tmp_path / "mine"
    cluster_auth.make_token(mine)
    # Nothing listens there: the host waits --wait-s, then says so and exits (a supervisor retries).
    silent, took = ray_node_host("--head", f"127.0.0.1:{free_port()}", "--wait-s", "3", "--token-file", str(mine))
    assert silent.returncode == 1 and took < 30, (silent.stderr, took)
    assert "did not answer within 3 s" in silent.stderr and "vmagent ray-node head" in silent.stderr
    # The head answers, and refuses this host's token (not the head's): said, exit 2.
    refused, took = ray_node_host("--head", head.address, "--wait-s", "60", "--token-file", str(mine))
    assert refused.returncode == 2 and "refused this host's token" in refused.stderr, refused.stderr
    assert took < 60
    # A token file others can read never leaves the host, nor does one that is missing.
    mine.chmod(0o644)
    loose, _ = ray_node_host("--head", head.address, "--token-file", str(mine))
    assert loose.returncode == 2 and "readable by others" in loose.stderr
    missing, _ = ray_node_host("--head", head.address, "--token-file", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "cannot be read" in missing.stderr
    for output in (silent, refused, loose, missing):
        assert mine.read_text() not in output.stdout + output.stderr


def test_a_head_on_every_interface_is_refused():
    done = subprocess.run([sys.executable, "-m", "vmagent.cli", "ray-node", "head", "--address", "0.0.0.0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "every interface" in done.stderr
