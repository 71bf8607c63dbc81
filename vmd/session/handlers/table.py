"""Where every verb of the contract is served: one handler per verb, gathered here from the
handlers' modules (one per group of the verb table, docs/architecture.md) into three
tables, by what a handler is handed:

- `HANDLERS`: a session's verbs, handler(session, params, notify) -> dict, served by
  vmd/session/serving.py (the gate, the handler, the result's check, the count, the record);
- `BINDING`: session_open and session_attach, handler(sessions, params) -> (session, dict):
  they come before a session, and vmd/server/rpc.py binds its connection to the one answered;
- `SESSIONLESS`: vmd's own reads (POLICY `session=False`: history, host_info),
  handler(sessions, params) -> dict, answered on any connection.

Every verb in vmd/contract/params.py has exactly one handler in one of them; vmd refuses to
start otherwise.
"""

from __future__ import annotations

from vmd.contract.params import VERBS
from vmd.contract.policy import POLICY
from vmd.session.handlers import (end_verbs, eval_verbs, history_verbs, host_verbs, opening_verbs, people_verbs,
                                  screen_verbs, session_verbs, shell_verbs, task_verbs)


def _gathered(tables: list[dict]) -> dict:
    joined: dict = {}
    for table in tables:
        for verb, handler in table.items():
            if verb in joined:
                raise RuntimeError(f"{verb} has two handlers")
            joined[verb] = handler
    return joined


HANDLERS = _gathered([group.HANDLERS for group in (session_verbs, task_verbs, shell_verbs, screen_verbs,
                                                   people_verbs, end_verbs, eval_verbs)])
BINDING = _gathered([opening_verbs.BINDING])
SESSIONLESS = _gathered([history_verbs.SESSIONLESS, host_verbs.SESSIONLESS])

_TWICE = (set(HANDLERS) & set(BINDING)) | (set(HANDLERS) & set(SESSIONLESS)) | (set(BINDING) & set(SESSIONLESS))
if _TWICE:
    raise RuntimeError(f"verbs with two handlers: {sorted(_TWICE)}")
_UNSERVED = set(VERBS) - set(HANDLERS) - set(BINDING) - set(SESSIONLESS)
if _UNSERVED:
    raise RuntimeError(f"verbs without a handler: {sorted(_UNSERVED)}")
if set(SESSIONLESS) != {verb for verb, policy in POLICY.items() if not policy.session}:
    raise RuntimeError("the verbs served without a session are those with session=False in "
                       "vmd/contract/policy.py POLICY, and only those")
