"""`vmd doctor`'s model check for an OpenAI-compatible server (vmd/server/model_check.py): a
real llama.cpp server that takes tools, and the stand-in for what it cannot show (a key, a
server that refuses tools); each failure says what to set."""

from __future__ import annotations

import socket

import pytest

from tests.support.llamacpp_server import require_llamacpp, start_llamacpp
from tests.support.ollama_server import Turn
from tests.support.openai_server import start_openai
from vmd.config import VmdConfig
from vmd.server import doctor
from vmd.server.model_check import check_openai_model


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_llama_cpp_server_with_its_model_takes_tools(tmp_path):
    require_llamacpp()
    with start_llamacpp(tmp_path) as server:
        found = check_openai_model(server.base_url, server.model, tesseract=True)
        wrong = check_openai_model(server.base_url, "qwen3-vl:32b", tesseract=True)
    assert found.status == "ok" and f"{server.model} at {server.base_url} takes tools" in found.text, found
    assert wrong.status == "fail" and "serves no model qwen3-vl:32b" in wrong.text and server.model in wrong.text


def test_a_key_the_server_refuses_says_to_set_the_key_and_never_shows_it():
    with start_openai(default=Turn(content="ok"), key="right-key") as server:
        refused = check_openai_model(server.base_url, server.model_name, key="wrong-key-123")
        taken = check_openai_model(server.base_url, server.model_name, key="right-key", tesseract=True)
    assert refused.status == "fail" and "VMAGENT_MODEL_KEY" in refused.text and "wrong-key-123" not in refused.text
    assert taken.status == "ok" and "sees images" in taken.text
    assert server.headers[-1]["Authorization"] == "Bearer right-key"


def test_a_server_that_refuses_tools_says_how_to_turn_them_on():
    with start_openai(default=Turn(status=500, error='"tools" param requires --jinja flag')) as server:
        found = check_openai_model(server.base_url, server.model_name)
    assert found.status == "fail" and "--jinja" in found.text and "tool calling on" in found.text


def test_a_blind_model_needs_ocr_and_no_server_is_a_sentence():
    with start_openai(default=Turn(content="ok"), vision=False) as server:
        blind = check_openai_model(server.base_url, server.model_name, tesseract=False)
        told = check_openai_model(server.base_url, server.model_name, vision=True, tesseract=False)
    assert blind.status == "warn" and "tesseract-ocr" in blind.text and "VMAGENT_MODEL_VISION" in blind.text
    assert told.status == "ok"
    gone = check_openai_model(f"http://127.0.0.1:{unused_port()}/v1", "m", timeout=3)
    assert gone.status == "fail" and "does not answer" in gone.text and "VMAGENT_MODEL_URL" in gone.text


def test_the_doctor_checks_the_server_the_agent_is_set_to_use(monkeypatch):
    seen = {}
    monkeypatch.setattr(doctor, "check_openai_model", lambda *a: seen.update(openai=a))
    monkeypatch.setattr(doctor, "check_ollama", lambda *a: seen.update(ollama=a))
    doctor.run_checks(["ollama"], VmdConfig.load(env={
        "VMAGENT_MODEL_API": "openai", "VMAGENT_MODEL_URL": "http://models:8000/v1", "VMAGENT_MODEL": "qwen",
        "VMAGENT_MODEL_KEY": "k", "VMAGENT_MODEL_VISION": "true"}))
    assert seen == {"openai": ("http://models:8000/v1", "qwen", "k", True)}
    seen.clear()
    doctor.run_checks(["ollama"], VmdConfig.load(env={"VMAGENT_MODEL_API": "openai"}))
    assert seen["openai"][0] == "http://127.0.0.1:8080/v1", "vmagent's default for an OpenAI-compatible server"
    seen.clear()
    doctor.run_checks(["ollama"], VmdConfig.load(env={}))
    assert list(seen) == ["ollama"]


def test_a_model_api_vmagent_does_not_know_is_refused_at_load():
    with pytest.raises(ValueError, match="VMAGENT_MODEL_API"):
        VmdConfig.load(env={"VMAGENT_MODEL_API": "vllm"})
