"""The OpenAI-compatible backend: /v1/chat/completions over httpx (model.py), its wire
(wire.py), its event stream (stream.py) and its failures (failures.py). Loaded only by
`open_model` for model_api "openai"."""

from vmagent.models.openai.model import OpenAICompatModel

__all__ = ["OpenAICompatModel"]
