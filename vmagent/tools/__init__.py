"""The tools the model is offered, tolerant reading of what it sends, and the calls to vmd.

Three jobs, in the order a turn meets them, each in a module of its own:

- `offered_schemas(os_family, web_tools, screen)` (schemas.py) — the function
  schemas offered to the model, decided when the job starts and the same in every phase (`schemas(os_family, phase, desktop)`: those a
  phase allows): each verb's params model from vmd/contract/params.py (the one contract)
  with the tool table's descriptions (table.py), worded for the guest's
  shell (bash and /mnt/project, or PowerShell 5.1 and Z:\\).
- `parse_arguments(name, raw)` (parsing.py) — tool arguments are untrusted
  input, read as well as they can be; what cannot be read becomes an error text that
  shows the expected shape, never an exception.
- `call(vmd, name, arguments)` (results.py) — runs one verb and turns vmd's
  result into the text (and, for a screenshot, the image) the model reads next. It takes
  the arguments as sent or as `parse_arguments` read them (the loop reads them once). It
  raises nothing but `VmdUnavailable`: the loop must learn when the supervisor is gone,
  and nothing else. web_search and read_page are run on the host instead
  (vmagent/web/agent_tools.py), never by vmd or in the guest.

And `calls_in_text(content)` (text_calls.py): tool calls a model wrote as text in its
reply instead of through the tool-calling interface, recovered. The guest's OS family the
tools are worded for is decided in vmagent/os_family.py (`os_family_of`, handed on here).

This package's face is the one door the loop, the CLI and the tests use; its modules
import each other, never this face.
"""

from __future__ import annotations

from vmagent.os_family import OsFamily, os_family_of
from vmagent.tools.parsing import ParsedArguments, parse_arguments, verb_of
from vmagent.tools.results import SCREEN_UNSEEN, ToolOutcome, call
from vmagent.tools.schemas import json_schema, offered_names, offered_schemas, schemas, shape
from vmagent.tools.table import (OFFERED_TOOLS, OS_WORDS, PLANNING_TOOLS, SCREEN_TOOLS, TOOLS, WEB_TOOLS, Phase, Tool,
                                 tool_names)
from vmagent.tools.text_calls import USE_THE_TOOL_INTERFACE, calls_in_text

__all__ = [
    "OsFamily", "Phase", "ParsedArguments", "verb_of", "parse_arguments", "ToolOutcome", "call", "SCREEN_UNSEEN",
    "json_schema", "offered_names", "offered_schemas", "schemas", "shape", "OFFERED_TOOLS", "OS_WORDS", "PLANNING_TOOLS",
    "SCREEN_TOOLS", "TOOLS", "WEB_TOOLS", "Tool", "os_family_of", "tool_names", "USE_THE_TOOL_INTERFACE",
    "calls_in_text",
]
