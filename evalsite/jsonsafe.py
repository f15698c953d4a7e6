"""JSON from strangers: strict (no NaN or Infinity) and no deeper than ``MAX_DEPTH`` levels.

Python's own parser accepts ``NaN`` and nests as deep as the interpreter's recursion allows; a
body of 5,000 ``[`` ends in a ``RecursionError`` far from the parser, and a value nested 900
levels passes the parser but not the code that walks it later (normalisation, JSON encoding,
PostgreSQL's ``jsonb``). Every door that parses JSON a tenant wrote (the API's parser, the
pages' JSON fields, OTLP/JSON, evaluator outputs) goes through here, so one limit holds
everywhere and the error names it.

``MAX_DEPTH`` is generous for real data: a trace dict spends two levels per span (the span and
its ``children``), so 128 levels hold a span tree about 60 spans deep.

Bodies are parsed by orjson (strict already, and a fifth of the standard library's time) and
their depth is read off the text's brackets with byte operations, not by walking the parsed
value: both were most of an ingest request's parsing. Whatever orjson refuses goes to the
standard library, which accepts it (integers past 64 bits, lone surrogates) or names the
problem as before.
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

import orjson

MAX_DEPTH = 128


class UnsafeJSON(ValueError):
    """Not JSON we accept; the message says why in words a user can act on."""


def too_deep_message(limit: int = MAX_DEPTH) -> str:
    return f"nested deeper than {limit} levels"


def _refuse_constant(name: str) -> Any:
    raise UnsafeJSON(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def loads(text: str | bytes, *, limit: int = MAX_DEPTH) -> Any:
    """Parse ``text``; raise ``UnsafeJSON`` for malformed, non-standard or too-deep JSON."""
    raw = text if isinstance(text, bytes) else text.encode(errors="surrogatepass")
    if _LONG_NUMBER in raw.translate(_DIGITS):  # orjson would make a float of a huge integer
        return _loads_slowly(text, limit)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _loads_slowly(text, limit)
    if raw.count(b"[") + raw.count(b"{") > limit and _text_too_deep(raw, limit):
        raise UnsafeJSON(f"the JSON is {too_deep_message(limit)}")
    return value


_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # 64-bit integers have at most 19 digits (20 unsigned)


def _loads_slowly(text: str | bytes, limit: int) -> Any:
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except UnsafeJSON:
        raise
    except RecursionError:
        raise UnsafeJSON(f"the JSON is {too_deep_message(limit)}")
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UnsafeJSON(str(exc))
    if depth_exceeds(value, limit):
        raise UnsafeJSON(f"the JSON is {too_deep_message(limit)}")
    return value


# One C call deletes every byte but brackets and quotes, and makes braces square: in valid
# JSON only the nesting matters, not which bracket nests.
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'[]{}"')
_SQUARE = bytes.maketrans(b"{}", b"[]")
_STEP = {ord("["): 1, ord("]"): -1}


def _text_too_deep(text: bytes, limit: int) -> bool:
    """Whether valid JSON ``text`` nests deeper than ``limit``, from its brackets alone.

    Brackets inside strings do not count: escaped backslashes and quotes go first, then all but
    brackets and quotes; what stands between a pair of quotes is then a string's. Empty pairs
    of brackets are removed a level at a time (each pass in C, and a pass removes exactly one
    level: ``replace`` does not look again at what it joined); a text still nested after a few
    passes has its depth summed bracket by bracket.
    """
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    # An empty string, or the end of one and the start of the next: no bracket between them.
    brackets = text.translate(_SQUARE, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in brackets:
        brackets = b"".join(brackets.split(b'"')[::2])
    passes = min(limit, 16)
    for _ in range(passes):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit - passes


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
