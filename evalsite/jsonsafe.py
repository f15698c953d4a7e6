"""JSON from strangers: strict (no NaN or Infinity) and no deeper than ``MAX_DEPTH`` levels.

Python's own parser accepts ``NaN`` and nests as deep as the interpreter's recursion allows; a
body of 5,000 ``[`` ends in a ``RecursionError`` far from the parser, and a value nested 900
levels passes the parser but not the code that walks it later (normalisation, JSON encoding,
PostgreSQL's ``jsonb``). Every door that parses JSON a tenant wrote (the API's parser, the
pages' JSON fields, OTLP/JSON, evaluator outputs) goes through here, so one limit holds
everywhere and the error names it.

``MAX_DEPTH`` is generous for real data: a trace dict spends two levels per span (the span and
its ``children``), so 128 levels hold a span tree about 60 spans deep.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 128


class UnsafeJSON(ValueError):
    """Not JSON we accept; the message says why in words a user can act on."""


def too_deep_message(limit: int = MAX_DEPTH) -> str:
    return f"nested deeper than {limit} levels"


def _refuse_constant(name: str) -> Any:
    raise UnsafeJSON(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def loads(text: str | bytes, *, limit: int = MAX_DEPTH) -> Any:
    """Parse ``text``; raise ``UnsafeJSON`` for malformed, non-standard or too-deep JSON."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except UnsafeJSON:
        raise
    except RecursionError:
        raise UnsafeJSON(f"the JSON is {too_deep_message(limit)}")
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UnsafeJSON(str(exc))
    if _may_be_deep(text, limit) and depth_exceeds(value, limit):
        raise UnsafeJSON(f"the JSON is {too_deep_message(limit)}")
    return value


def _may_be_deep(text: str | bytes, limit: int) -> bool:
    # Nesting needs an opening bracket per level: counting them is C-speed, walking is not.
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{") > limit
    return text.count("[") + text.count("{") > limit


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and dicts nest deeper than ``limit`` levels (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
