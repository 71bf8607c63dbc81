"""The verb handlers: every verb of the contract is served from here, one module per group
of the verb table (docs/architecture.md): opening_verbs.py (session_open, session_attach),
session_verbs.py, task_verbs.py, shell_verbs.py, screen_verbs.py, people_verbs.py,
end_verbs.py (finish, and `close`, the one way a session ends), eval_verbs.py, and vmd's own
reads that need no session, history_verbs.py and host_verbs.py; output.py streams a
command's output to the client. Handed on: the three tables of table.py, `HANDLERS` (a
session's verbs, served by vmd/session/serving.py), `BINDING` and `SESSIONLESS` (served by
vmd/server/rpc.py).
"""

from vmd.session.handlers.table import BINDING, HANDLERS, SESSIONLESS

__all__ = ["HANDLERS", "BINDING", "SESSIONLESS"]
