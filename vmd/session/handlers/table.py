"""The one table vmd/session/serving.py serves a session's verbs from: verb name ->
handler(session, params, notify) -> dict, gathered from the handlers' modules, one per
group of the verb table (docs/architecture.md).

session_open and session_attach are served by vmd/server/rpc.py (they bind the connection);
every other verb in vmd/contract/params.py that a session serves (POLICY `session`) has
exactly one handler here; the verbs that need no session are vmd/server/rpc.py's
(SESSIONLESS).
"""

from __future__ import annotations

from vmd.contract.params import VERBS
from vmd.contract.policy import POLICY
from vmd.session.handlers import (end_verbs, eval_verbs, people_verbs, screen_verbs, session_verbs, shell_verbs,
                                  task_verbs)

HANDLERS = {}
for _group in (session_verbs, task_verbs, shell_verbs, screen_verbs, people_verbs, end_verbs, eval_verbs):
    for _verb, _handler in _group.HANDLERS.items():
        if _verb in HANDLERS:
            raise RuntimeError(f"{_verb} has two handlers")
        HANDLERS[_verb] = _handler

_UNSERVED = {verb for verb in VERBS if POLICY[verb].session} - set(HANDLERS) - {"session_open", "session_attach"}
if _UNSERVED:
    raise RuntimeError(f"verbs without a handler: {sorted(_UNSERVED)}")
