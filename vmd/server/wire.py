"""The wire of vmd's socket: one line of JSON read (bounded in length and depth, numbers
finite, lone surrogates replaced) and one written (parseable by any reader), error replies
made in one place, and a verb's params error as a sentence with the params it takes."""

from __future__ import annotations

import json
import math
import re
import typing

from pydantic import ValidationError

from vmd.contract import json_depth
from vmd.contract.errors import INVALID_REQUEST, PARSE_ERROR
from vmd.contract.params import Params
from vmd.contract.shown_text import printable
from vmd.errors import VerbError

# A request line longer than this is refused: write_file bodies are the largest thing
# sent, and 64 MiB is far past any source file an agent should write in one call.
MAX_LINE = 64 * 1024 * 1024
# Requests nested deeper than this are refused before they are parsed (vmd/contract/json_depth.py
# says why a RecursionError is no bound). vmd's deepest request is 3 levels (request ->
# params -> verification).
MAX_DEPTH = 64
# A lone UTF-16 surrogate (JSON allows "\ud800") cannot be written as UTF-8: one in an
# answer or a summary made every later save of session.json fail. They become U+FFFD.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# The id of a line that cannot be parsed, when the line begins with it as vmagent's
# client writes it: `{"id": 7, ...`. A client waits for its id; a null one never comes.
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(-?[0-9][0-9.eE+-]{0,40}'  # a number
                         rb'|"(?:[^"\\\x00-\x1f]|\\.){0,200}"'  # a string
                         rb'|null|true|false)\s*[,}]')


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return "|".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        args = typing.get_args(annotation)
        return f"list[{_type_name(args[0])}]" if args else "list"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, Params):
        return "{" + shape(annotation) + "}"
    return getattr(annotation, "__name__", str(annotation))


def shape(model: type[Params]) -> str:
    """`command: str, timeout: float = 300, cwd: str|null = null` for a verb's params."""
    parts = []
    for name, field in model.model_fields.items():
        part = f"{name}: {_type_name(field.annotation)}"
        if not field.is_required():
            default = field.get_default(call_default_factory=True)
            part += f" = {json.dumps(default, default=str)}"
        parts.append(part)
    return ", ".join(parts) or "no params"


def params_error(verb: str, exc: ValidationError, model: type[Params]) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "params"
        if err["type"] == "extra_forbidden":
            problems.append(f"{where}: not a param of {verb}")
        elif err["type"] == "missing":
            problems.append(f"{where}: required")
        else:
            problems.append(f"{where}: {err['msg']}")
    return f"bad params for {verb}: {'; '.join(problems)}. Expected {{{shape(model)}}}."


def error_reply(request_id, code: int, message: str, data: dict | None = None) -> dict:
    # The one place every error reply's message is made: guest text in it (a path, a
    # command's stderr, an SFTP server's status) reaches a terminal as data, escapes gone.
    error = {"code": code, "message": printable(message)}
    if data is not None:  # JSON-RPC: `data` is absent, not null, when there is none
        error["data"] = data
    return {"id": request_id, "error": error}


def encode(message: dict) -> bytes:
    """One line of JSON that any reader can parse: lone surrogates become U+FFFD; NaN,
    cycles and keys that are not strings raise (ValueError, TypeError)."""
    text = json.dumps(message, ensure_ascii=False, default=str, allow_nan=False)
    return (_SURROGATE.sub("\ufffd", text) + "\n").encode()


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _json(text: str):
    return json.loads(text, parse_float=_finite, parse_constant=_no_constant)


def read_json(line: bytes):
    """The JSON value on one line; raises VerbError (PARSE_ERROR, or INVALID_REQUEST
    for nesting deeper than json can read) saying what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VerbError(f"the request is not UTF-8 text (byte {line[exc.start]:#04x} at offset "
                        f"{exc.start}); send one UTF-8 JSON object per line.", PARSE_ERROR) from None
    try:
        json_depth.check(text, MAX_DEPTH)
    except json_depth.TooDeep:
        raise VerbError(f"the request is nested too deep: at most {MAX_DEPTH} levels of objects and "
                        "lists are read.", INVALID_REQUEST) from None
    try:
        return _json(text)
    except ValueError as exc:  # JSONDecodeError, an int of over 4300 digits, NaN, 1e400
        raise VerbError(f"the request is not valid JSON ({str(exc)[:200]}); send one JSON object per "
                        'line: {"id": 1, "method": "...", "params": {...}}.', PARSE_ERROR) from None


def clean_request(request) -> dict:
    """The request with no lone surrogates, nested at most MAX_DEPTH deep; raises
    VerbError (INVALID_REQUEST) when it is not a request object or nested deeper."""
    if not isinstance(request, dict):
        raise VerbError('a request is an object with "id", "method" (a string) and "params" (an '
                        f"object), not a JSON {type(request).__name__}.", INVALID_REQUEST)
    return _clean(request, 1)


def id_of(request: dict):
    """A request's id, cleaned, for the reply even when the rest of it is refused."""
    try:
        return _clean(request.get("id"), 2)
    except VerbError:
        return None


def _clean(value, depth: int):
    """`value` with every lone surrogate (in keys and strings) replaced by U+FFFD; deeper
    than MAX_DEPTH raises. The recursion stops at MAX_DEPTH, far below Python's limit."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, (dict, list)) and depth > MAX_DEPTH:
        raise VerbError(f"the request is nested too deep: at most {MAX_DEPTH} levels of objects and "
                        "lists are read.", INVALID_REQUEST)
    if isinstance(value, dict):
        return {_SURROGATE.sub("\ufffd", k): _clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value]
    return value


def leading_id(line: bytes):
    """The id at the head of a line that may not parse; None when there is none."""
    match = _LEADING_ID.match(line[:512])
    if match is None:
        return None
    try:
        return _clean(_json(match[1].decode("utf-8")), 2)
    except (ValueError, VerbError):
        return None
