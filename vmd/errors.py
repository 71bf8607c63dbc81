"""How vmd fails: `VerbError`, the one way a verb fails, `refused()`, the one way to refuse,
`checked_result()`, a result held against its model, and `WordedError`, the base of vmd's
own errors, whose text is already a sentence.

The codes on the wire are the contract's (vmd/contract/errors.py).
"""

from __future__ import annotations

from vmd.contract.errors import FAILED, INTERNAL_ERROR, REFUSED, REFUSED_PREFIX
from vmd.contract.results import result_problem


class VerbError(Exception):
    """A verb that cannot be served; `message` is a sentence the model can act on, `data`
    what a client may read besides it (vmd/server/rpc.py sends it as the error's `data` member).

    A refusal (code REFUSED) always starts with REFUSED_PREFIX: clients and the model tell
    a rule of the session from a failure by it, so a refusal that lacks it gets it here."""

    def __init__(self, message: str, code: int = FAILED, data: dict | None = None):
        if code == REFUSED and not message.startswith(REFUSED_PREFIX):
            message = f"{REFUSED_PREFIX} {message}"
        super().__init__(message)
        self.message = message
        self.code = code
        self.data = data


def refused(message: str, data: dict | None = None) -> VerbError:
    """The one way a rule of the session says no: an error with code REFUSED."""
    return VerbError(message, REFUSED, data)


def checked_result(verb: str, result: dict) -> dict:
    """`result` as it is, once it fits `verb`'s result model (vmd/contract/results.py). One
    that does not is a bug in vmd and fails as one (INTERNAL_ERROR), naming the verb and
    the field, rather than reaching a client that would read it wrong."""
    problem = result_problem(verb, result)
    if problem:
        raise VerbError(f"{problem}. This is a bug in vmd: report it with the call that caused it.",
                        INTERNAL_ERROR)
    return result


class WordedError(Exception):
    """An error vmd worded for its reader: its text is already a sentence for the model or
    a person (GuestError, MachineError, ScreenError, ImageMissing, PublishError, GiteaError,
    TaskError inherit it), so `sentence()` shows it as it is."""


def sentence(exc: BaseException, fallback: str) -> str:
    """What a person or the model reads of `exc`: its own words when vmd wrote them,
    else `fallback` with the exception's type, so the cause is never hidden."""
    if isinstance(exc, VerbError):
        return exc.message
    text = str(exc).strip()
    known = isinstance(exc, WordedError)
    if known and text:
        return text
    return f"{fallback}: {type(exc).__name__}: {text}" if text else f"{fallback}: {type(exc).__name__}"
