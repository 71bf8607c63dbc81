"""Which model client a job gets: the backend its settings name (`model_api`).

Kept apart from vmagent/model.py, the interface both backends implement, so that the
interface imports neither of them.
"""

from __future__ import annotations

from .config import AgentConfig
from .llm import OllamaModel
from .model import Model
from .openai_model import OpenAICompatModel


def open_model(config: AgentConfig) -> Model:
    """The model the settings name: Ollama's /api/chat (model_api "ollama", the default) or
    an OpenAI-compatible /v1/chat/completions (vLLM, llama.cpp, SGLang, LM Studio)."""
    if config.model_api == "openai":
        return OpenAICompatModel(config)
    return OllamaModel(config)
