"""A vendored subset of Gitea's API spec (v1_subset.json, from Gitea 1.22's swagger) and a
small structural check of JSON against it: the Gitea stand-in's answers and the bodies vmd
sends are held to the upstream shapes, so that neither drifts into a private dialect.

The check is strict where drift hides: an object may carry only the properties its
definition lists (no invented fields), every value has its declared type, enum and
format, and required properties are present. It follows `$ref`s into `definitions` and
`responses`; a ref to a definition the subset does not vendor is itself a problem.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path

SPEC_FILE = Path(__file__).with_name("v1_subset.json")


@lru_cache(maxsize=1)
def spec() -> dict:
    return json.loads(SPEC_FILE.read_text())


def shape_problems(value: object, schema: dict, where: str = "$") -> list[str]:
    """What is wrong with `value` under `schema` (empty when it fits)."""
    if "$ref" in schema:
        kind, _, name = schema["$ref"].removeprefix("#/").partition("/")
        target = spec().get(kind, {}).get(name)
        if target is None:
            return [f"{where}: refers to {schema['$ref']}, which the vendored subset lacks"]
        if kind == "responses":
            return shape_problems(value, target["schema"], where) if "schema" in target else []
        return shape_problems(value, target, where)
    expected = schema.get("type")
    if expected is None:
        return []
    checks = {"object": dict, "array": list, "string": str, "boolean": bool}
    if expected == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where}: expected an integer, got {type(value).__name__}"]
        return []
    if not isinstance(value, checks[expected]):
        return [f"{where}: expected {expected}, got {type(value).__name__}"]
    problems: list[str] = []
    if expected == "string":
        if "enum" in schema and value not in schema["enum"]:
            problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
        if schema.get("format") == "date-time":
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                problems.append(f"{where}: {value!r} is not a date-time")
        if schema.get("format") == "email" and value and not re.fullmatch(r"[^@\s]+@[^@\s]+", value):
            problems.append(f"{where}: {value!r} is not an e-mail address")
    elif expected == "array":
        for i, item in enumerate(value):
            problems += shape_problems(item, schema.get("items", {}), f"{where}[{i}]")
    elif expected == "object":
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                problems += shape_problems(item, properties[key], f"{where}.{key}")
            elif extra is None and properties:
                problems.append(f"{where}: property {key!r} is not in the definition")
            elif isinstance(extra, dict):
                problems += shape_problems(item, extra, f"{where}.{key}")
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{where}: required property {key!r} is missing")
    return problems


def operation(method: str, api_path: str) -> tuple[str, dict] | None:
    """The vendored operation a request path (under /api/v1, query left off) matches:
    (its path template, the operation), or None."""
    for template, methods in spec()["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, api_path) and method.lower() in methods:
            return template, methods[method.lower()]
    return None


def response_problems(method: str, api_path: str, status: int, body: object) -> list[str]:
    """What is wrong with one answer to `method api_path`: an operation the subset does not
    hold, a status it does not document, or a body of the wrong shape. Error answers
    (documented with headers only, as Gitea's swagger does) must be an APIError-like
    object: a string `message`, and nothing beyond `url`, `errors` and `invalidTopics`."""
    found = operation(method, api_path)
    if found is None:
        return [f"{method} {api_path}: no such operation in the vendored spec"]
    template, op = found
    documented = op["responses"].get(str(status))
    if documented is None:
        return [f"{method} {template}: status {status} is not documented "
                f"(documented: {sorted(op['responses'])})"]
    if "$ref" in documented:
        documented = spec()["responses"][documented["$ref"].rsplit("/", 1)[1]]
    if "schema" in documented:
        return shape_problems(body, documented["schema"], f"{method} {template} {status}")
    if status >= 400 and body is not None:
        return error_problems(body, f"{method} {template} {status}")
    return []


def error_problems(body: object, where: str) -> list[str]:
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        return [f"{where}: an error body needs a string 'message', got {body!r}"]
    extra = set(body) - {"message", "url", "errors", "invalidTopics"}
    return [f"{where}: unexpected error fields {sorted(extra)}"] if extra else []


def request_problems(method: str, api_path: str, body: object) -> list[str]:
    """What is wrong with a request body vmd sent, against the operation's body schema."""
    found = operation(method, api_path)
    if found is None:
        return [f"{method} {api_path}: no such operation in the vendored spec"]
    template, op = found
    for parameter in op.get("parameters", []):
        if parameter.get("in") == "body":
            return shape_problems(body, parameter["schema"], f"{method} {template} body")
    return [] if body in (None, {}, b"") else [f"{method} {template}: takes no body, got {body!r}"]
