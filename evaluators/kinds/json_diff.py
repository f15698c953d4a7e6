"""JSON diff: the share of the ground truth's leaf keys that the output gets right."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from evaluators.kinds.base import (
    SCORE_SUCCESS,
    GroundTruthParameters,
    Kind,
    PresetSpec,
    ground_truth,
    register,
    ui,
)
from evaluators.normalize import EvaluationError, json_equal

NOT_JSON = object()
Path = tuple[str, ...]


class Parameters(GroundTruthParameters):
    threshold: float = Field(
        0.5, ge=0, le=1, description="Success when the score is at least this."
    )
    compare_schema_only: bool = Field(
        False,
        description="A leaf matches when its JSON type matches (string, number, boolean, null, "
        "array, object), whatever its value.",
    )
    case_insensitive_keys: bool = Field(
        False,
        description="Key names match regardless of case.",
        json_schema_extra=ui(advanced=True),
    )
    penalize_extra_keys: bool = Field(
        False,
        description="Count leaf keys the output has and the ground truth lacks as mismatches.",
        json_schema_extra=ui(advanced=True),
    )


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    truth = _parsed(ground_truth(parameters, inputs))
    if truth is NOT_JSON:
        raise EvaluationError(
            f"The ground-truth column {parameters.correct_answer_key!r} is not JSON.",
            code="invalid_ground_truth",
        )
    produced = _parsed(outputs)
    expected = leaves(truth, parameters.case_insensitive_keys)
    actual = {} if produced is NOT_JSON else leaves(produced, parameters.case_insensitive_keys)
    matched = sum(
        1
        for path, value in expected.items()
        if path in actual and _same(actual[path], value, parameters)
    )
    total = (
        len(expected.keys() | actual.keys()) if parameters.penalize_extra_keys else len(expected)
    )
    score = matched / total if total else 1.0
    return {"score": score, "success": score >= parameters.threshold}


def leaves(value: Any, fold_case: bool, path: Path = ()) -> dict[Path, Any]:
    """Every leaf of nested objects by its key path. Arrays and empty objects are leaves:
    arrays compare whole, in order."""
    if not isinstance(value, dict) or not value:
        return {path: value}
    found: dict[Path, Any] = {}
    for key, item in value.items():
        found.update(leaves(item, fold_case, (*path, key.casefold() if fold_case else key)))
    return found


def _same(actual: Any, expected: Any, parameters: Parameters) -> bool:
    if parameters.compare_schema_only:
        return _json_type(actual) == _json_type(expected)
    return json_equal(actual, expected)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _parsed(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return NOT_JSON


kind = register(
    Kind(
        key="json_diff",
        name="JSON diff",
        description="Scores the share of the ground truth's leaf keys whose values (or, "
        "optionally, types) the output matches.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=SCORE_SUCCESS,
        needs_ground_truth=True,
        presets=[
            PresetSpec(
                "same_shape",
                "Same shape",
                {"compare_schema_only": True, "threshold": 1},
                "Every key of the ground truth is present with the same JSON type.",
            ),
            PresetSpec("exact_values", "All values", {"threshold": 1}),
        ],
    )
)
