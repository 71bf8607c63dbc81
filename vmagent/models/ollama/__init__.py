"""The Ollama backend: /api/chat through the official `ollama` client (model.py), its wire
(wire.py), its failures (failures.py) and the transport that measures each JSON line
before the client parses it (depth_transport.py). Loaded only by `open_model` for
model_api "ollama"."""

from vmagent.models.ollama.model import OllamaModel

__all__ = ["OllamaModel"]
