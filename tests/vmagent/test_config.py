"""Agent settings: defaults, a TOML or YAML file, then the environment."""

from __future__ import annotations

import pytest

from vmagent.config import AgentConfig, ConfigError


def test_defaults_set_num_ctx_explicitly():
    config = AgentConfig.load(env={})
    assert config.num_ctx == 32768
    assert config.ollama_host == "http://127.0.0.1:11434"
    assert config.model == "qwen3-vl:32b"
    assert config.think is None


def test_a_toml_file_then_the_environment(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('model = "llama3.3"\nnum_ctx = 65536\nkeep_images = 1\n')
    config = AgentConfig.load(path, env={"VMAGENT_NUM_CTX": "16384", "OLLAMA_HOST": "gpu-box:11434"})
    assert config.model == "llama3.3"
    assert config.num_ctx == 16384, "the environment wins over the file"
    assert config.keep_images == 1
    assert config.ollama_host == "gpu-box:11434"


def test_a_yaml_file_named_by_the_environment_with_an_agent_section(tmp_path):
    path = tmp_path / "vmagent.yaml"
    path.write_text("agent:\n  compact_at: 0.6\n  think: false\nvmd:\n  socket: /x\n")
    config = AgentConfig.load(env={"VMAGENT_CONFIG": str(path), "VMAGENT_MODEL": "qwen3:8b"})
    assert config.compact_at == 0.6 and config.think is False and config.model == "qwen3:8b"


def test_a_misspelt_setting_is_refused_with_its_name(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text("num_cxt = 4096\n")
    with pytest.raises(ConfigError, match="num_cxt"):
        AgentConfig.load(path, env={})


def test_a_missing_file_is_refused_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml"):
        AgentConfig.load(env={"VMAGENT_CONFIG": str(tmp_path / "nope.toml")})


def test_think_accepts_auto_from_the_environment():
    assert AgentConfig.load(env={"VMAGENT_THINK": "auto"}).think is None
    assert AgentConfig.load(env={"VMAGENT_THINK": "on"}).think is True


def test_the_boot_wait_and_the_preview_interval_are_settings():
    config = AgentConfig.load(env={})
    assert config.boot_wait_s == 900 and config.screen_watch_s == 5
    config = AgentConfig.load(env={"VMAGENT_SCREEN_WATCH_S": "0", "VMAGENT_BOOT_WAIT_S": "120"})
    assert config.screen_watch_s == 0 and config.boot_wait_s == 120


def test_the_prompts_directory_is_a_setting_read_from_vmagent_prompts(tmp_path):
    assert AgentConfig.load(env={}).prompts_dir is None, "the repository's prompts only"
    assert AgentConfig.load(env={"VMAGENT_PROMPTS": str(tmp_path)}).prompts_dir == tmp_path
    assert AgentConfig.load(env={"VMAGENT_PROMPTS": "   "}).prompts_dir is None, "blank is not set"
    both = {"VMAGENT_PROMPTS_DIR": "/long/form", "VMAGENT_PROMPTS": str(tmp_path)}
    assert AgentConfig.load(env=both).prompts_dir == tmp_path, "the short name wins, like OLLAMA_HOST"
    path = tmp_path / "agent.toml"
    path.write_text(f'prompts_dir = "{tmp_path / "from-file"}"\n')
    assert AgentConfig.load(path, env={}).prompts_dir == tmp_path / "from-file"


def test_the_prompts_are_looked_for_in_the_configured_directory_first(tmp_path):
    from vmagent.prompts import load_prompts

    (tmp_path / "prompt.md").write_text("CONFIGURED RULES\n")
    config = AgentConfig.load(env={"VMAGENT_PROMPTS": str(tmp_path)})
    loaded = load_prompts("linux", desktop=False, config=config)
    assert loaded.system.startswith("CONFIGURED RULES") and loaded.sources[0] == tmp_path / "prompt.md"
    repo = load_prompts("linux", desktop=False, config=AgentConfig.load(env={}))
    assert not repo.system.startswith("CONFIGURED RULES"), "without the setting: the repository's"


def test_the_default_guest_is_vmds_default_os(tmp_path):
    assert AgentConfig.load(env={}).default_os == "debian"
    assert AgentConfig.load(env={"VMD_DEFAULT_OS": "ubuntu"}).default_os == "ubuntu"
    assert AgentConfig.load(env={"VMAGENT_DEFAULT_OS": "win11"}).default_os == "win11"
    path = tmp_path / "agent.toml"
    path.write_text('default_os = ""\n')
    with pytest.raises(ConfigError, match="default_os"):
        AgentConfig.load(path, env={})
