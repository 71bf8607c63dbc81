"""docker-compose.yml parses and describes the stack the issue asks for (no Docker needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
ONE_SHOTS = {"gitea-init"}
SECRET_NAME = re.compile(r"TOKEN|PASSWORD|SECRET|_KEY$", re.I)
ENV_REFERENCE = re.compile(r"^\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}$")


def env_of(service: str) -> dict:
    env = SERVICES[service].get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return env


def test_the_stack_has_every_part():
    assert set(SERVICES) >= {"vmd", "vmagent", "gitea", "gitea-init", "ollama", "open-webui"}


@pytest.mark.parametrize("name", sorted(set(SERVICES) - ONE_SHOTS))
def test_every_long_running_service_has_a_healthcheck_and_restarts(name):
    health = SERVICES[name].get("healthcheck")
    assert health and health["test"][0] in ("CMD", "CMD-SHELL") and len(health["test"]) > 1
    assert SERVICES[name].get("restart") == "unless-stopped"


def test_vmd_is_privileged_with_kvm_and_keeps_images_state_and_projects():
    vmd = SERVICES["vmd"]
    assert vmd["privileged"] is True and "/dev/kvm:/dev/kvm" in vmd["devices"]
    targets = {v.split(":")[1] for v in vmd["volumes"]}
    assert {"/var/lib/vmagent/images", "/var/lib/vmagent/state", "/var/lib/vmagent/projects", "/run/vmd"} <= targets
    entrypoint = (REPO / "docker" / "vmd-entrypoint.sh").read_text()
    assert "libvirtd -d" in entrypoint and "virtlogd -d" in entrypoint and "exec vmd serve" in entrypoint


def test_the_job_service_reaches_vmd_and_ollama_and_is_unprivileged():
    vmagent = SERVICES["vmagent"]
    assert not vmagent.get("privileged") and not vmagent.get("devices")
    assert any(v.startswith("vmd-socket:/run/vmd") for v in vmagent["volumes"])
    assert env_of("vmagent")["VMD_SOCKET"] == "/run/vmd/vmd.sock"
    assert env_of("vmagent")["OLLAMA_HOST"] == "http://ollama:11434"
    assert vmagent["depends_on"]["vmd"]["condition"] == "service_healthy"


def test_gitea_is_install_locked_and_a_one_shot_creates_the_admin_and_token():
    assert env_of("gitea")["GITEA__security__INSTALL_LOCK"] == "true"
    init = SERVICES["gitea-init"]
    assert init["restart"] == "no" and init["depends_on"]["gitea"]["condition"] == "service_healthy"
    script = (REPO / "docker" / "gitea-init.sh").read_text()
    assert "admin user create --admin" in script and "generate-access-token" in script
    assert SERVICES["vmd"]["depends_on"]["gitea-init"]["condition"] == "service_completed_successfully"


def test_ollama_pulls_the_configured_model_and_open_webui_forwards_user_headers():
    assert "ollama pull" in (REPO / "docker" / "ollama-entrypoint.sh").read_text()
    assert env_of("ollama")["OLLAMA_MODEL"] == env_of("vmagent")["VMAGENT_MODEL"]
    webui = env_of("open-webui")
    assert webui["ENABLE_FORWARD_USER_INFO_HEADERS"] == "true"
    assert webui["OLLAMA_BASE_URL"] == "http://ollama:11434"


def test_no_secret_is_written_inline():
    for name in SERVICES:
        for key, value in env_of(name).items():
            if SECRET_NAME.search(key) and not key.endswith("_FILE"):
                assert ENV_REFERENCE.match(str(value)), f"{name}.{key} must come from the environment"


def test_named_volumes_are_declared_and_build_files_exist():
    declared = set(COMPOSE["volumes"])
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} uses undeclared volume {source}"
            else:
                assert (REPO / source).exists(), f"{name} mounts missing {source}"
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).exists()
