"""What goes wrong between vmagent and vmd, whatever the way to it: vmd cannot be reached
(`VmdUnavailable`, and the two ways the loop's link ends: `VmdGone`, `ResultLost`) or vmd
answered with an error (`VmdError`, and `ResultUnfit`: an answer that does not fit the verb's
result model)."""

from __future__ import annotations


class VmdUnavailable(ConnectionError):
    """The vmd socket cannot be reached (not running, wrong path, or it went away).

    in_flight: the request had been sent when the connection was lost, so whether vmd
    ran it, and what it answered, is unknown.
    """

    def __init__(self, message: str, *, in_flight: bool = False):
        super().__init__(message)
        self.in_flight = in_flight


class VmdGone(VmdUnavailable):
    """vmd stayed away past the bound (or came back without the session): the loop stops."""

    def __init__(self, message: str, *, method: str, seconds: float):
        super().__init__(message, in_flight=False)
        self.method = method
        self.seconds = seconds


class ResultLost(VmdUnavailable):
    """vmd went away while `method` was in flight and came back; the connection is
    re-attached to the session, but the call's result is lost (it may or may not have run)."""

    def __init__(self, method: str, seconds: float):
        super().__init__(f"vmd went away while {method} was in flight and came back after {seconds:.0f} s; "
                         "the call's result was lost.", in_flight=True)
        self.method = method
        self.seconds = seconds


class VmdError(RuntimeError):
    """vmd answered the call with an error: `code` one of vmd/contract/errors.py's (REFUSED: a rule
    of the session says no, and `message` starts with "REFUSED:"), `data` what vmd added
    (a refused finish's check: {"attempt": {...}}), else None."""

    def __init__(self, code: int, message: str, method: str = "", data: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.method = method
        self.data = data


class ResultUnfit(VmdError):
    """vmd answered, but not in the shape of the verb's result model: a vmd of another
    version than this vmagent, or a bug in vmd. The message names the fields."""
