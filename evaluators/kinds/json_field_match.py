"""JSON field match: chosen fields of the output equal the same fields of the ground truth.

A field is named by a path in one of three syntaxes, told apart by the first character:

- ``$.a.b[0]``: JSONPath (jsonpath-ng, with its extensions such as filters);
- ``/a/b/0``: JSON Pointer (RFC 6901), the one syntax for keys holding dots or brackets;
- ``a.b[0].c``: dot path with list indices (``a.b.0.c`` works too).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonpointer
from jsonpath_ng.ext import parse as jsonpath_parse
from pydantic import Field, ValidationInfo, field_validator

from evaluators.kinds.base import (
    GroundTruthParameters,
    Kind,
    PresetSpec,
    ground_truth,
    register,
    ui,
)
from evaluators.normalize import EvaluationError, json_equal

MISSING = object()
RESERVED = {"score", "success"}
_SEGMENT = re.compile(r"([^.\[\]]+)?((?:\[-?\d+\])*)")
_INDEX = re.compile(r"\[(-?\d+)\]")


class Parameters(GroundTruthParameters):
    fields: list[str] = Field(
        ...,
        min_length=1,
        description="Paths of the fields to compare: a.b[0].c, $.a.b (JSONPath) or /a/b "
        "(JSON Pointer).",
    )
    field_columns: dict[str, str] = Field(
        default_factory=dict,
        description="Optional: a testcase column per field path, when the expected values sit "
        "in their own columns instead of one JSON column.",
        json_schema_extra=ui(advanced=True, widget="json"),
    )
    threshold: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of fields that must match for success (1 = all of them).",
    )
    case_sensitive: bool = Field(True, json_schema_extra=ui(advanced=True))
    strip_whitespace: bool = Field(
        True,
        description="Ignore leading and trailing white space in string values.",
        json_schema_extra=ui(advanced=True),
    )

    @field_validator("fields")
    @classmethod
    def _paths_parse(cls, fields: list[str]) -> list[str]:
        for path in fields:
            try:
                _compiled(path)
            except ValueError as exc:
                raise ValueError(f"{path!r} is not a valid field path: {exc}")
        if len(set(fields)) != len(fields):
            raise ValueError("each field path may appear only once")
        return fields

    @field_validator("field_columns")
    @classmethod
    def _columns_name_fields(cls, columns: dict[str, str], info: ValidationInfo) -> dict:
        fields = info.data.get("fields")
        unknown = sorted(set(columns) - set(fields)) if fields is not None else []
        if unknown:
            raise ValueError(f"names paths that are not in fields: {', '.join(unknown)}")
        return columns


@lru_cache(maxsize=512)
def _compiled(path: str) -> tuple[str, Any]:
    """(syntax, parsed path); raises ValueError with a readable reason."""
    if not path.strip():
        raise ValueError("it is empty")
    if path.startswith("$"):
        try:
            return "jsonpath", jsonpath_parse(path)
        except Exception as exc:  # jsonpath-ng raises bare Exceptions for syntax errors
            raise ValueError(f"JSONPath syntax error ({exc})")
    if path.startswith("/"):
        try:
            return "pointer", jsonpointer.JsonPointer(path)
        except jsonpointer.JsonPointerException as exc:
            raise ValueError(f"JSON Pointer syntax error ({exc})")
    steps: list[str | int] = []
    for part in path.split("."):
        match = _SEGMENT.fullmatch(part)
        if not part or not match:
            raise ValueError("use a.b[0].c, $.a.b (JSONPath) or /a/b (JSON Pointer)")
        if match[1]:
            steps.append(match[1])
        steps.extend(int(index) for index in _INDEX.findall(match[2]))
    return "dots", tuple(steps)


def resolve(document: Any, path: str) -> Any:
    """The value at ``path``, or MISSING. A JSONPath with several matches yields their list."""
    syntax, parsed = _compiled(path)
    if syntax == "jsonpath":
        found = [match.value for match in parsed.find(document)]
        return MISSING if not found else found[0] if len(found) == 1 else found
    if syntax == "pointer":
        try:
            return parsed.resolve(document)
        except jsonpointer.JsonPointerException:
            return MISSING
    value = document
    for step in parsed:
        value = _step(value, step)
        if value is MISSING:
            break
    return value


def _step(value: Any, step: str | int) -> Any:
    if isinstance(value, dict):
        return value.get(step, MISSING) if isinstance(step, str) else MISSING
    if isinstance(value, list) and isinstance(step, str) and step.lstrip("-").isdecimal():
        step = int(step)
    if isinstance(value, list) and isinstance(step, int) and -len(value) <= step < len(value):
        return value[step]
    return MISSING


def metric_names(fields: list[str]) -> dict[str, str]:
    """A metric-safe, unique name per path: ``$.user.emails[0]`` -> ``user_emails_0``."""
    names: dict[str, str] = {}
    taken = set(RESERVED)
    for path in fields:
        base = re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_") or "root"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        names[path] = name
    return names


def outputs_schema(parameters: Parameters) -> dict[str, Any]:
    names = list(metric_names(parameters.fields).values())
    flag = {"type": "integer", "minimum": 0, "maximum": 1}
    return {
        "type": "object",
        "properties": {
            **{name: flag for name in names},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "success": {"type": "boolean"},
        },
        "required": [*names, "score", "success"],
    }


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    expected = _expected_values(parameters, inputs)
    document = _parsed(outputs)
    result: dict[str, Any] = {}
    for path, name in metric_names(parameters.fields).items():
        actual = MISSING if document is MISSING else resolve(document, path)
        result[name] = int(actual is not MISSING and _same(actual, expected[path], parameters))
    score = sum(result.values()) / len(result)
    return {**result, "score": score, "success": score >= parameters.threshold}


def _expected_values(parameters: Parameters, inputs: dict) -> dict[str, Any]:
    expected: dict[str, Any] = {}
    truth: Any = MISSING
    for path in parameters.fields:
        column = parameters.field_columns.get(path)
        if column is not None:
            if column not in inputs:
                columns = ", ".join(sorted(inputs)) or "none"
                raise EvaluationError(
                    f"The column {column!r} for field {path!r} is not in the inputs "
                    f"(columns: {columns}).",
                    code="missing_ground_truth",
                )
            expected[path] = inputs[column]
            continue
        if truth is MISSING:
            truth = _parsed(ground_truth(parameters, inputs))
            if not isinstance(truth, dict | list):
                raise EvaluationError(
                    f"The ground-truth column {parameters.correct_answer_key!r} does not hold a "
                    f"JSON object or array, so field {path!r} cannot be read from it.",
                    code="invalid_ground_truth",
                )
        expected[path] = resolve(truth, path)
        if expected[path] is MISSING:
            raise EvaluationError(
                f"The ground truth has no field {path!r}; nothing to compare the output with.",
                code="missing_ground_truth",
            )
    return expected


def _parsed(value: Any) -> Any:
    """A JSON string becomes its value; text that is not JSON becomes MISSING."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return MISSING


def _same(actual: Any, expected: Any, parameters: Parameters) -> bool:
    if isinstance(actual, str) and isinstance(expected, str):
        return _text(actual, parameters) == _text(expected, parameters)
    if isinstance(expected, str):
        # A CSV column holds "42" where the output has 42: compare the column's JSON value.
        expected = _scalar(expected)
    elif isinstance(actual, str):
        actual = _scalar(actual)
    return json_equal(actual, expected)


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _text(text: str, parameters: Parameters) -> str:
    text = text.strip() if parameters.strip_whitespace else text
    return text if parameters.case_sensitive else text.casefold()


kind = register(
    Kind(
        key="json_field_match",
        name="JSON field match",
        description="Compares chosen fields of a JSON output with the ground truth: one 0/1 per "
        "field, the share that matched as score.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=outputs_schema,
        needs_ground_truth=True,
        presets=[
            PresetSpec(
                "single_field",
                "One field",
                {"fields": ["answer"]},
                "The output's answer field equals the ground truth's answer field.",
            ),
            PresetSpec(
                "half_of_fields",
                "At least half the fields",
                {"fields": ["name", "email"], "threshold": 0.5},
                "Succeeds when at least half the listed fields match.",
            ),
        ],
    )
)
