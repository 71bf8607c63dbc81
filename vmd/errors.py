"""Every error code vmd answers with, and `VerbError`, the one way a verb fails.

JSON-RPC reserves -32768..-32000; the standard codes come first, vmd's own after.
A refusal (a rule of the session says no) is REFUSED with a message that starts with
"REFUSED:"; `finish` refuses in its result instead (accepted false), see vmd/verbs.py.
"""

from __future__ import annotations

# JSON-RPC's standard codes.
PARSE_ERROR = -32700  # the line is not JSON (or not UTF-8, or nested too deep)
INVALID_REQUEST = -32600  # JSON, but not a request object
METHOD_NOT_FOUND = -32601  # an unknown verb
INVALID_PARAMS = -32602  # params that do not fit the verb's model, or a task that does not exist
INTERNAL_ERROR = -32603  # a bug in vmd; the connection stays up

# vmd's own codes.
FAILED = -32000  # the verb ran and failed (a guest error, a git error)
REFUSED = -32001  # a rule of the session refuses the verb now; the message says why
NO_SESSION = -32002  # the connection has no session bound
NOT_READY = -32003  # the machine is not up (still booting, or it failed)
BUSY = -32004  # vmd serves its connection limit already; retry later


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
