"""Every error code vmd answers with, and `VerbError`, the one way a verb fails.

The codes themselves are in the contract, vmd/verbs.py.
"""

from __future__ import annotations

# The codes are part of the contract (vmd/verbs.py); they are named here too so that
# vmd's modules keep importing them from the errors module.
from vmd.verbs import (  # noqa: F401  (re-exported)
    BUSY, FAILED, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, NO_SESSION,
    NOT_READY, PARSE_ERROR, REFUSED, REFUSED_PREFIX,
)


class VerbError(Exception):
    """A verb that cannot be served; `message` is a sentence the model can act on."""

    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.message = message
        self.code = code


# Errors whose text is already a sentence for the model (vmd's own exception types).
_SENTENCES = ("GuestError", "ScreenError", "MachineError", "ImageMissing", "PublishError", "GiteaError",
              "TaskError")


def sentence(exc: BaseException, fallback: str) -> str:
    """What a person or the model reads of `exc`: its own words when vmd wrote them,
    else `fallback` with the exception's type, so the cause is never hidden."""
    if isinstance(exc, VerbError):
        return exc.message
    text = str(exc).strip()
    known = type(exc).__name__ in _SENTENCES
    if known and text:
        return text
    return f"{fallback}: {type(exc).__name__}: {text}" if text else f"{fallback}: {type(exc).__name__}"
