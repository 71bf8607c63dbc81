"""vmd's contract with its clients, one module per meaning; the only part of vmd that
vmagent imports (tests/project/test_layering.py). Pure pydantic and stdlib: no behaviour of vmd.

- params.py: each verb's params model, and `VERBS` (name -> model);
- results.py: each verb's answer model, `RESULTS` (name -> model) and `result_problem`;
- policy.py: the session's states and `POLICY`, when a session serves each verb and whether
  it is a step (`MACHINE_VERBS` derived from it);
- check.py: the agent's check as `finish` names it and as vmd answers its runs;
- verdict.py: `Verdict`, vmd's verdict on that check and its only words;
- bounds.py: the name rule and the bound of every size a request may hold;
- errors.py: the error codes on the wire;
- shown_text.py: text from a guest or a model made printable and fenced, one rule for both sides;
- json_depth.py: JSON from outside parsed only once its depth is known to be shallow.

A new verb is a params model and its `VERBS` entry, a result model and its `RESULTS` entry,
and a `POLICY` row; its handler is vmd's (vmd/session/handlers/).
"""
