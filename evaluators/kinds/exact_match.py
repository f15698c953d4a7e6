"""Exact match: the output equals the ground-truth column. JSON values compare as JSON."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from evaluators.kinds.base import (
    SUCCESS_ONLY,
    GroundTruthParameters,
    Kind,
    PresetSpec,
    ground_truth,
    register,
    ui,
)
from evaluators.normalize import json_equal


class Parameters(GroundTruthParameters):
    case_sensitive: bool = Field(True, json_schema_extra=ui(advanced=True))
    strip_whitespace: bool = Field(
        True,
        description="Ignore leading and trailing white space.",
        json_schema_extra=ui(advanced=True),
    )


def _as_json(value: Any) -> Any:
    """A string that holds JSON compares by its value, so '{"a": 1}' equals {"a": 1}."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict | list) else value
    return value


def _text(value: Any, parameters: Parameters) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if parameters.strip_whitespace:
        text = text.strip()
    return text if parameters.case_sensitive else text.casefold()


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> bool:
    expected = ground_truth(parameters, inputs)
    left, right = _as_json(outputs), _as_json(expected)
    if isinstance(left, dict | list) or isinstance(right, dict | list):
        return json_equal(left, right)
    return _text(outputs, parameters) == _text(expected, parameters)


kind = register(
    Kind(
        key="exact_match",
        name="Exact match",
        description="Succeeds when the output equals the ground truth (JSON compared as JSON).",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=SUCCESS_ONLY,
        needs_ground_truth=True,
        presets=[
            PresetSpec("case_insensitive", "Case-insensitive match", {"case_sensitive": False}),
            PresetSpec(
                "strict",
                "Character for character",
                {"case_sensitive": True, "strip_whitespace": False},
                "Case and surrounding white space count too.",
            ),
        ],
    )
)
