"""Reading a value out of nested JSON (dicts and lists) by a path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def dig(value: Any, path: str | Sequence[str | int], *, default: Any = None) -> Any:
    """The value at ``path`` inside ``value``, or ``default`` when there is none.

    ``path`` is a dotted string (``"outputs.items.0.name"``; empty parts are skipped, so ``""``
    is ``value`` itself) or a sequence of keys (``["outputs", "items", "0", "name"]``, for keys
    that contain dots). A key indexes a list when it is an int or all digits; negative indexes
    are not read. Pass a sentinel as ``default`` to tell a missing value from a JSON null.
    """
    keys = [part for part in path.split(".") if part] if isinstance(path, str) else path
    for key in keys:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and 0 <= _position(key) < len(value):
            value = value[_position(key)]
        else:
            return default
    return value


def _position(key: str | int) -> int:
    """The list position ``key`` names; -1 when it names none."""
    if isinstance(key, bool):
        return -1
    if isinstance(key, int):
        return key
    return int(key) if key.isascii() and key.isdecimal() else -1
