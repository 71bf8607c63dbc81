"""vmd's settings (vmd/config/settings.py) and where they take effect: a file, then the
environment, and the machine adapter and the record use what the config says."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vmd.config import ENV_FIELDS, VmdConfig, VmdConfigError
from vmd.guests.linux.verbs import LinuxVerbs
from vmd.machines.libvirt_machines import LibvirtMachine, LibvirtMachines
from vmd.session.handlers import screen_verbs
from vmd.session.record import Redactor


def test_defaults_and_the_environment_over_a_file(tmp_path):
    path = tmp_path / "vmd.toml"
    path.write_text('default_os = "ubuntu"\nboot_timeout_s = 60\n')
    config = VmdConfig.load(path, env={"VMD_BOOT_TIMEOUT_S": "90", "VMD_STATE_DIR": str(tmp_path)})
    assert config.default_os == "ubuntu"
    assert config.boot_timeout_s == 90, "the environment wins over the file"
    assert config.projects_dir == tmp_path / "projects"


def test_the_internet_probe_and_desktop_wait_are_settings(tmp_path, monkeypatch):
    config = VmdConfig.load(env={})
    assert config.internet_probe == "example.com" and config.desktop_wait_s == 30
    assert VmdConfig.load(env={"VMD_INTERNET_PROBE": "probe.internal"}).internet_probe == "probe.internal"
    monkeypatch.setenv("VMD_INTERNET_PROBE", "probe.internal")
    assert VmdConfig.load().internet_probe == "probe.internal", "read from the process's environment"
    assert VmdConfig().internet_probe == "example.com", "only load() reads the environment"
    path = tmp_path / "vmd.toml"
    path.write_text('internet_probe = "mirror.local"\ndesktop_wait_s = 5\n')
    config = VmdConfig.load(path, env={})
    assert config.internet_probe == "mirror.local" and config.desktop_wait_s == 5


class _Guest(LinuxVerbs):
    def __init__(self):
        self.commands = []

    def run(self, command, timeout=None, cwd=None, on_output=None):
        self.commands.append(command)
        return SimpleNamespace(exit_code=0, stdout="reachable\n", stderr="")


def test_the_probe_goes_to_the_configured_host_and_the_adapter_waits_as_configured():
    config = VmdConfig.load(env={}, internet_probe="probe.internal", desktop_wait_s=5)
    guest = _Guest()
    session = SimpleNamespace(config=config, ready_machine=lambda: SimpleNamespace(guest=guest))
    assert screen_verbs.check_internet(session, None, None)["online"] is True
    assert "/dev/tcp/probe.internal/80" in guest.commands[0]
    image = SimpleNamespace(os_family="linux", project_path="/mnt/project")
    machine = SimpleNamespace(guest=guest, screen=None, reboot=None, suspend=None, resume=None, destroy=None,
                              set_egress=None, cut_egress=None, stalled=None, name="vmagent-s-1")
    adapter = LibvirtMachines(config)._adapter(machine, image)
    assert isinstance(adapter, LibvirtMachine) and adapter.desktop_wait_s == 5 and adapter.guest is guest


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


def test_every_variable_names_a_setting():
    assert set(ENV_FIELDS.values()) <= set(VmdConfig.model_fields)
    assert len(set(ENV_FIELDS.values())) == len(ENV_FIELDS), "one variable per setting"


def test_the_accelerator_is_a_setting(tmp_path):
    assert VmdConfig.load(env={}).accel == "auto", "probe by default"
    assert VmdConfig.load(env={"VMD_ACCEL": "kvm"}).accel == "kvm"
    assert VmdConfig.load(env={"VMD_ACCEL": " QEMU "}).accel == "qemu", "in any case"
    assert VmdConfig.load(env={"VMD_ACCEL": "tcg"}).accel == "tcg"
    path = tmp_path / "vmd.toml"
    path.write_text('accel = ""\n')
    assert VmdConfig.load(path, env={}).accel == "auto", "an empty value is not set"


def test_a_bad_value_names_its_variable_and_what_it_may_be(tmp_path):
    with pytest.raises(VmdConfigError) as caught:
        VmdConfig.load(env={"VMD_ACCEL": "fast"})
    message = str(caught.value)
    assert "VMD_ACCEL (accel)" in message and "'auto', 'kvm', 'qemu' or 'tcg'" in message
    assert isinstance(caught.value, ValueError), "what vmd's commands catch"
    path = tmp_path / "vmd.toml"
    path.write_text('internet_probe = ""\n')
    with pytest.raises(VmdConfigError, match=rf"\(file {path} and environment\): internet_probe: "):
        VmdConfig.load(path, env={})
    with pytest.raises(VmdConfigError, match=r"VMD_BOOT_TIMEOUT_S \(boot_timeout_s\): Input should be greater than 0"):
        VmdConfig.load(env={"VMD_BOOT_TIMEOUT_S": "-1"})
    with pytest.raises(VmdConfigError, match=r": accel: "):  # a flag, not the environment, gave it
        VmdConfig.load(env={"VMD_ACCEL": "kvm"}, accel="fast")


def test_what_the_doctor_checks_is_configured_too(tmp_path):
    from vmagent.config import AgentConfig

    defaults = VmdConfig.load(env={})
    assert defaults.socket_group == "" and defaults.gitea_token_file is None
    agent = AgentConfig()
    assert (defaults.ollama_host, defaults.ollama_model) == (agent.ollama_host, agent.model), "vmagent's defaults"
    config = VmdConfig.load(env={"VMD_SOCKET_GROUP": "1001", "GITEA_TOKEN_FILE": str(tmp_path / "token"),
                                 "OLLAMA_HOST": "http://ollama:11434", "VMAGENT_MODEL": "qwen3:8b"})
    assert config.socket_group == "1001" and config.gitea_token_file == tmp_path / "token"
    assert (config.ollama_host, config.ollama_model) == ("http://ollama:11434", "qwen3:8b")
