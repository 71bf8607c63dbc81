"""JSON from outside (a socket, a model server, a web page, a guest) is parsed only once its
nesting is known to be shallow.

json's C scanner recurses once per level: a line of 10,000 '[' raises RecursionError, and
on CPython 3.11.2 (Debian 12's python3) a RecursionError raised in C code can leave the
interpreter's recursion count wrong, so that a later, unrelated `compile()` fails with
"SystemError: AST constructor recursion depth mismatch". Catching the RecursionError is
therefore no bound at all: the depth is measured first, outside strings, with no recursion,
and a text deeper than the limit is refused before json sees it.

Stdlib only: part of the contract, which vmagent imports too.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

# Deep enough for any real document (OpenAPI schemas, tool arguments, search results nest
# 10-20 levels), far below the ~1,000 frames where json would raise.
MAX_DEPTH = 200

# A complete JSON string (escapes included); what is inside one never nests.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STRING_B = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NOT_BRACKET_B = re.compile(rb"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1, 91: 1, 123: 1, 93: -1, 125: -1}


class TooDeep(ValueError):
    """The text nests objects and lists deeper than the limit (a ValueError, as json's
    own errors are, so a caller that sorts bad JSON sorts this with it)."""

    def __init__(self, limit: int):
        super().__init__(f"nested deeper than {limit} levels of objects and lists")
        self.limit = limit


def depth(text: str | bytes) -> int:
    """How deep `text` nests objects and lists, counted outside strings (an unterminated
    string counts as text, which can only make the figure larger)."""
    if isinstance(text, (bytes, bytearray)):
        brackets = _NOT_BRACKET_B.sub(b"", _STRING_B.sub(b"", text))
    else:
        brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def check(text: str | bytes, limit: int = MAX_DEPTH) -> None:
    """Raises TooDeep when `text` nests deeper than `limit`."""
    # Most texts have fewer brackets in all than the limit: they cannot nest deeper.
    if isinstance(text, (bytes, bytearray)):
        opened = text.count(b"[") + text.count(b"{")
    else:
        opened = text.count("[") + text.count("{")
    if opened > limit and depth(text) > limit:
        raise TooDeep(limit)


def loads(text: str | bytes, limit: int = MAX_DEPTH, **kwargs):
    """json.loads, after check(): TooDeep (a ValueError) instead of a RecursionError."""
    check(text, limit)
    return json.loads(text, **kwargs)
