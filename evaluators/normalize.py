"""Normalisation of evaluator return values (DOMAIN.md, "The evaluator contract").

Every kind, every runtime and every judge ends here, so a value means the same thing wherever it
was produced:

- ``bool``   -> ``{"success": b}``
- number     -> ``{"score": x, "success": x >= threshold}`` (ints allowed)
- ``dict``   -> kept; nested dicts stay nested (metrics read them as dotted paths)
- ``str``    -> a number if it parses, else ``{"output": s}``
- ``None``, NaN, infinities, values JSON cannot carry and values nested deeper than
  ``evalsite.jsonsafe.MAX_DEPTH`` -> ``EvaluationError``

Also here, because kinds, judges and agent scorers all speak them: ``Raw`` (what a batch produced
for one item, before normalisation) and ``json_equal``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from evalsite import jsonsafe

ACCEPTED = "a bool, a finite number, a dict of JSON values, or a string"
DEFAULT_THRESHOLD = 0.5


class EvaluationError(Exception):
    """An evaluation that failed. Recorded as an error on the result, never as a score."""

    def __init__(
        self, message: str, *, code: str = "evaluation_error", type: str = "", stacktrace: str = ""
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.type = type or code
        self.stacktrace = stacktrace

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "type": self.type,
            "message": self.message,
            "stacktrace": self.stacktrace,
        }


@dataclass(frozen=True)
class Unrepresentable:
    """What a sandbox harness reports when user code returned something JSON cannot carry.

    ``what`` names it the way a user would recognise it: ``NaN``, ``Infinity``, ``undefined``,
    ``set``, ``function``, ``dict containing NaN at score`` ...
    """

    what: str


@dataclass
class Raw:
    """What a batch kind produced for one item before normalisation: a value or an error."""

    value: Any = None
    error: BaseException | None = None
    duration_ms: float = 0.0
    logs: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON means it: true is not 1 (Python says True == 1), 1 equals 1.0."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    if isinstance(left, dict | list) or isinstance(right, dict | list):
        return False
    return left == right


def invalid_return(what: str) -> EvaluationError:
    return EvaluationError(
        f"evaluate() returned {what}; expected {ACCEPTED}.", code="invalid_return"
    )


def normalize(value: Any, threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """Turn one raw return value into an outputs dict, or raise ``EvaluationError``."""
    if isinstance(value, Unrepresentable):
        raise invalid_return(value.what)
    if value is None:
        raise invalid_return("None/null")
    if isinstance(value, bool):
        return {"success": value}
    if isinstance(value, int | float):
        return _from_number(value, threshold)
    if isinstance(value, str):
        number = _parse_number(value)
        if number is None:
            return {"output": value}
        return _from_number(number, threshold)
    if isinstance(value, dict):
        # Checked first: the walk below recurses, and so does everything that stores the value.
        if jsonsafe.depth_exceeds(value):
            raise invalid_return(f"a value {jsonsafe.too_deep_message()}")
        problem = _find_non_json(value, "")
        if problem:
            raise invalid_return(f"a dict with {problem}")
        return value
    raise invalid_return(f"a value of type {type(value).__name__}")


def _from_number(x: float, threshold: float) -> dict[str, Any]:
    if math.isnan(x):
        raise invalid_return("NaN")
    if math.isinf(x):
        raise invalid_return("Infinity" if x > 0 else "-Infinity")
    return {"score": x, "success": x >= threshold}


def _parse_number(text: str) -> float | None:
    try:
        number = float(text.strip())
    except ValueError:
        return None
    # "nan" and "inf" parse as floats but nobody means them as a score.
    return number if math.isfinite(number) else None


def _find_non_json(value: Any, path: str) -> str | None:
    """Describe the first value inside a returned dict that JSON cannot carry, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} at {path or 'the top'}"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"a non-string key {key!r} at {path or 'the top'}"
            found = _find_non_json(item, f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_non_json(item, f"{path}[{index}]")
            if found:
                return found
        return None
    if isinstance(value, Unrepresentable):
        return f"{value.what} at {path or 'the top'}"
    if value is None or isinstance(value, str | int | float | bool):
        return None
    return f"a {type(value).__name__} at {path or 'the top'}"
