"""Every call to the same model sends one num_ctx: Ollama reloads a model whose num_ctx
changes, tens of seconds for a 32B model each time the agent and /ask alternate."""

from __future__ import annotations

from tests.support.ollama_server import start_ollama
from vmagent.config import AgentConfig
from vmagent.models.ollama import OllamaModel as LLM
from vmagent.service.ask import _ask_model
from vmagent.service.config import ServiceConfig


def test_ask_sends_the_agents_num_ctx(monkeypatch):
    monkeypatch.setenv("VMAGENT_NUM_CTX", "24576")
    monkeypatch.delenv("VMAGENT_CONFIG", raising=False)
    with start_ollama(["an answer", "a turn"]) as server:
        config = ServiceConfig(ollama_url=server.url, ask_model="qwen3-vl:32b")
        assert _ask_model(config, "What changed?", [("report", "main.py was added")]) == "an answer"
        LLM(AgentConfig.load().model_copy(update={"ollama_host": server.url})).chat(
            [{"role": "user", "content": "go"}])
    asked, agent = server.chat_requests
    assert asked["options"]["num_ctx"] == agent["options"]["num_ctx"] == 24576


def test_ask_without_agent_settings_sends_the_agents_default(monkeypatch):
    for name in ("VMAGENT_NUM_CTX", "VMAGENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    with start_ollama(["an answer"]) as server:
        _ask_model(ServiceConfig(ollama_url=server.url, ask_model="qwen3-vl:32b"), "What?", [("report", "x")])
    assert server.chat_requests[0]["options"]["num_ctx"] == AgentConfig().num_ctx
