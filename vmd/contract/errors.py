"""The error codes vmd answers with, part of the contract: every error on the wire is
`{"code", "message"}` (with `data` when the verb gives more than a sentence), and a client
tells a refusal, a failure and a machine that is not up apart by its code.

vmd raises them as `VerbError` (vmd/errors.py); the agent's client reads them back as its
own errors (vmagent/link/errors.py). Stdlib only.
"""

from __future__ import annotations

# JSON-RPC reserves -32768..-32000; the standard codes come first, vmd's own after.
# Every refusal (a rule of the session says no) is an error with code REFUSED whose
# message starts with REFUSED_PREFIX; nothing refuses inside a result.
PARSE_ERROR = -32700  # the line is not JSON (or not UTF-8, or nested too deep)
INVALID_REQUEST = -32600  # JSON, but not a request object
METHOD_NOT_FOUND = -32601  # an unknown verb
INVALID_PARAMS = -32602  # params that do not fit the verb's model, or a task that does not exist
INTERNAL_ERROR = -32603  # a bug in vmd; the connection stays up
FAILED = -32000  # the verb ran and failed (a guest error, a git error)
REFUSED = -32001  # a rule of the session refuses the verb now; the message says why
NO_SESSION = -32002  # the connection has no session bound
NOT_READY = -32003  # the machine is not up (still booting, or it failed)
BUSY = -32004  # vmd serves its connection limit already; retry later
REFUSED_PREFIX = "REFUSED:"
