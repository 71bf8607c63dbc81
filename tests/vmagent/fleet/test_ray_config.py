"""The "ray" executor's settings and its absence: none of this needs Ray installed.

(The executor itself, on a real Ray cluster, is tests/vmagent/fleet/test_ray_executor.py.)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vmagent.fleet.host_labels import HostLabels, MissingHostLabels, job_resources
from vmagent.service.config import RAY_CANCEL_GRACE_S, RAY_MAX_CONCURRENT, ServiceConfig, load_config

REPO = Path(__file__).resolve().parents[3]


def test_executor_and_ray_address_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("VMAGENT_EXECUTOR", "ray")
    monkeypatch.setenv("RAY_ADDRESS", "head.example:6379")
    config = load_config()
    assert (config.executor, config.ray_address) == ("ray", "head.example:6379")
    # Ray's slots are the limit: the service's own default of 2 would hold jobs back.
    assert config.max_concurrent == RAY_MAX_CONCURRENT
    # ...and a cancelled job's report has the time to come back from its host through Ray.
    assert config.cancel_grace_s == RAY_CANCEL_GRACE_S > ServiceConfig().cancel_grace_s
    monkeypatch.setenv("VMAGENT_MAX_CONCURRENT", "5")
    assert load_config().max_concurrent == 5


def test_the_ray_executor_starts_the_shim_and_passes_the_worker_command_on():
    config = ServiceConfig(executor="ray", ray_address="127.0.0.1:6379",
                           worker_command=["python3", "my_worker.py"])
    command = config.resolved_worker_command()
    assert command[:3] == [sys.executable, "-m", "vmagent.service.ray_worker"]
    assert command[command.index("--ray-address") + 1] == "127.0.0.1:6379"
    assert json.loads(command[command.index("--worker-command") + 1]) == ["python3", "my_worker.py"]
    # No worker command set: the host runs its own Python's worker, not this machine's path.
    assert "--worker-command" not in ServiceConfig(executor="ray").resolved_worker_command()
    assert ServiceConfig().resolved_worker_command() == [sys.executable, "-m", "vmagent.worker"]


def test_the_ray_executor_without_ray_is_refused_with_the_install_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'vmagent\[ray\]'"):
        ServiceConfig(executor="ray")
    assert ServiceConfig().executor == "local"  # the local executor needs no Ray


def test_the_service_and_the_shim_import_without_ray(tmp_path):
    """Ray is optional: a Python where `import ray` fails still imports the service, the shim
    and the fleet modules, and a shim asked to run a job says what to install."""
    blocker = tmp_path / "block" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named ray (blocked)')\n")
    env = {"PYTHONPATH": str(blocker.parent), "PATH": "/usr/bin:/bin"}
    imports = ("import sys, vmagent.service.app, vmagent.service.ray_worker, vmagent.fleet.job_host, "
               "vmagent.fleet.placement, vmagent.fleet.host_labels; assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", imports], cwd=REPO, env=env, check=True)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({"job_id": "j1", "spec": {"task": "t", "os": "debian"},
                                                  "mode": "run", "cancel": False}))
    done = subprocess.run([sys.executable, "-m", "vmagent.service.ray_worker", "--job-dir", str(job_dir),
                           "--ray-address", "127.0.0.1:1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    assert frames[-1]["type"] == "done" and frames[-1]["outcome"]["state"] == "failed"
    assert "pip install 'vmagent[ray]'" in frames[-1]["outcome"]["report"]


def test_a_node_without_vmagents_labels_is_named_with_the_fix():
    assert HostLabels.from_labels({"vmagent-host": "a", "vmagent-vmd-socket": "/run/vmd.sock"}) == \
        HostLabels(host="a", vmd_socket="/run/vmd.sock")
    # The socket label may be left out (tests/vmagent/fleet/test_ray_reach.py); the host's name may not.
    with pytest.raises(MissingHostLabels, match="no vmagent-host label.*--labels"):
        HostLabels.from_labels({"vmagent-vmd-socket": "/run/vmd.sock"})


def test_a_job_holds_a_guest_slot_of_its_os_family():
    assert job_resources("debian") == {"vm_slot": 1.0, "os_linux": 1.0}
    assert job_resources("ubuntu") == {"vm_slot": 1.0, "os_linux": 1.0}
    assert job_resources("windows11") == {"vm_slot": 1.0, "os_windows": 1.0}


def test_a_checkouts_egg_info_is_not_the_installed_version(tmp_path):
    """`pip install -e .` leaves vmagent.egg-info in the checkout, and Ray puts the driver's
    folder on its workers' sys.path: a host must still report the vmagent installed, or a host
    with another version reads as current (seen when CI's setup made that folder)."""
    import subprocess
    import sys

    residue = tmp_path / "vmagent.egg-info"
    residue.mkdir()
    (residue / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vmagent\nVersion: 9.9.9\n")
    older = tmp_path / "site" / "vmagent-0.0.1.dist-info"
    older.mkdir(parents=True)
    (older / "METADATA").write_text("Metadata-Version: 2.1\nName: vmagent\nVersion: 0.0.1\n")
    probe = "from vmagent.fleet.host_labels import vmagent_version; print(vmagent_version())"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{older.parent}"}
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "0.0.1", shown
