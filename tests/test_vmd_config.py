"""vmd's settings (vmd/config.py) and where they take effect: a file, then the
environment, and the machine adapter and the record use what the config says."""

from __future__ import annotations

from types import SimpleNamespace

from vmd.config import VmdConfig
from vmd.machine_port import LibvirtMachine, LibvirtMachines
from vmd.record import Redactor


def test_defaults_and_the_environment_over_a_file(tmp_path):
    path = tmp_path / "vmd.toml"
    path.write_text('default_os = "ubuntu"\nboot_timeout_s = 60\n')
    config = VmdConfig.load(path, env={"VMD_BOOT_TIMEOUT_S": "90", "VMD_STATE_DIR": str(tmp_path)})
    assert config.default_os == "ubuntu"
    assert config.boot_timeout_s == 90, "the environment wins over the file"
    assert config.projects_dir == tmp_path / "projects"


def test_the_internet_probe_and_desktop_wait_are_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("VMD_INTERNET_PROBE", raising=False)
    config = VmdConfig.load(env={})
    assert config.internet_probe == "example.com" and config.desktop_wait_s == 30
    monkeypatch.setenv("VMD_INTERNET_PROBE", "probe.internal")
    assert VmdConfig.load(env={}).internet_probe == "probe.internal"
    path = tmp_path / "vmd.toml"
    path.write_text('internet_probe = "mirror.local"\ndesktop_wait_s = 5\n')
    config = VmdConfig.load(path, env={})
    assert config.internet_probe == "mirror.local" and config.desktop_wait_s == 5


class _Guest:
    def __init__(self):
        self.commands = []

    def run(self, command, timeout=None, cwd=None, on_output=None):
        self.commands.append(command)
        return SimpleNamespace(exit_code=0, stdout="reachable\n", stderr="")


def test_the_libvirt_adapter_probes_the_configured_host():
    config = VmdConfig.load(env={}, internet_probe="probe.internal")
    guest = _Guest()
    image = SimpleNamespace(os_family="linux", project_path="/mnt/project")
    adapter = LibvirtMachines(config)._adapter(SimpleNamespace(guest=guest), image)
    assert isinstance(adapter, LibvirtMachine) and adapter.desktop_wait_s == config.desktop_wait_s
    assert adapter.check_internet() == (True, "reachable")
    assert "/dev/tcp/probe.internal/80" in guest.commands[0]


def test_the_record_cuts_text_to_the_configured_limits():
    config = VmdConfig.load(env={}, record_output_chars=100, record_output_tail_chars=400)
    redactor = Redactor(text_limit=config.record_output_chars,
                        long_keys={"output_tail": config.record_output_tail_chars})
    kept = redactor.value({"stdout": "x" * 1000, "output_tail": "y" * 1000, "short": "z" * 50})
    assert kept["stdout"].startswith("x" * 50) and "900 characters cut" in kept["stdout"]
    assert "600 characters cut" in kept["output_tail"]
    assert kept["short"] == "z" * 50


def test_the_end_of_sessions_is_tuned_by_settings(tmp_path):
    defaults = VmdConfig.load(env={})
    assert defaults.orphan_grace_s == 600 and defaults.question_keep_s == 7 * 24 * 3600
    assert defaults.push_retry_s == 24 * 3600 and defaults.push_retry_backoff_max_s == 300
    config = VmdConfig.load(env={"VMD_ORPHAN_GRACE_S": "5", "VMD_QUESTION_KEEP_S": "60",
                                 "VMD_REAPER_INTERVAL_S": "0.5", "VMD_PUSH_RETRY_S": "120",
                                 "VMD_PUSH_RETRY_BACKOFF_S": "1", "VMD_PUSH_RETRY_BACKOFF_MAX_S": "4"})
    assert (config.orphan_grace_s, config.question_keep_s, config.reaper_interval_s) == (5, 60, 0.5)
    assert (config.push_retry_s, config.push_retry_backoff_s, config.push_retry_backoff_max_s) == (120, 1, 4)
