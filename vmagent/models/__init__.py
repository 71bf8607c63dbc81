"""The model interface and its backends: one folder per backend (`ollama/`, `openai/`),
each a `Model` (model.py) that implements `chat` through one hook and feeds the one stream
accumulator (stream.py). What the rest of vmagent uses is named here; a backend's own
modules are imported only by `open_model`, when the settings choose it.
"""

from vmagent.models.backends import open_model
from vmagent.models.failures import ContextTooLong, ModelCancelled, ModelError, Outage
from vmagent.models.history import (SCREENSHOT_DROPPED, drop_images_in_batches, drop_old_images, image_count,
                                    only_latest_thinking)
from vmagent.models.model import Model
from vmagent.models.reply import Reply, ToolCall

__all__ = [
    "Model", "open_model", "Reply", "ToolCall", "ModelError", "ContextTooLong", "ModelCancelled", "Outage",
    "SCREENSHOT_DROPPED", "drop_images_in_batches", "drop_old_images", "image_count", "only_latest_thinking",
]
