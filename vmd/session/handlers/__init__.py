"""The verb handlers, one module per group of the verb table (docs/architecture.md):
session_verbs.py, task_verbs.py, shell_verbs.py, screen_verbs.py, people_verbs.py,
end_verbs.py (finish, and `close`, the one way a session ends), eval_verbs.py; output.py,
a command's output streamed to the client. Handed on: `HANDLERS` (table.py), the one
table vmd/session/serving.py serves from.
"""

from vmd.session.handlers.table import HANDLERS

__all__ = ["HANDLERS"]
