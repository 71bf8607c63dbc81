"""Which model client a job gets: the backend its settings name (`model_api`).

Kept apart from vmagent/models/model.py, the interface every backend implements, so that
the interface imports none of them; and each backend is imported only when it is chosen,
so that a job on an OpenAI-compatible server never loads the ollama client, and the
other way round.
"""

from __future__ import annotations

from vmagent.config import AgentConfig
from vmagent.models.model import Model


def open_model(config: AgentConfig) -> Model:
    """The model the settings name: Ollama's /api/chat (model_api "ollama", the default) or
    an OpenAI-compatible /v1/chat/completions (vLLM, llama.cpp, SGLang, LM Studio)."""
    if config.model_api == "openai":
        # Imported here, not above: only the chosen backend's client is loaded.
        from vmagent.models.openai.model import OpenAICompatModel

        return OpenAICompatModel(config)
    # Imported here, not above: only the chosen backend's client is loaded.
    from vmagent.models.ollama.model import OllamaModel

    return OllamaModel(config)
