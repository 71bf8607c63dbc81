"""The link to vmd: the errors (errors.py), the socket transport with its `Vmd` connection
(unix_socket.py), the turn loop's `SessionLink` that rides out a vmd restart
(session_link.py), and the small interface both transports offer, a short list of calls on
one vmd (calls.py; the Ray transport is vmagent/fleet/on_host.py). vmagent reaches vmd
through these and nothing else.
"""

from vmagent.link.calls import CallAnswer, VmdCall, VmdCalls
from vmagent.link.errors import ResultLost, ResultUnfit, VmdError, VmdGone, VmdUnavailable
from vmagent.link.session_link import Outage, SessionLink
from vmagent.link.unix_socket import DEFAULT_SOCKET, SocketCalls, Vmd, default_socket, typed_result

__all__ = [
    "Vmd", "SessionLink", "Outage", "default_socket", "DEFAULT_SOCKET", "typed_result",
    "VmdError", "VmdUnavailable", "VmdGone", "ResultLost", "ResultUnfit",
    "VmdCall", "CallAnswer", "VmdCalls", "SocketCalls",
]
