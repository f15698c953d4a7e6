"""Numeric match: the output, read as a number, is within tolerance of the ground truth."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import Field

from evaluators.kinds.base import (
    GroundTruthParameters,
    Kind,
    PresetSpec,
    ground_truth,
    register,
    ui,
)
from evaluators.normalize import EvaluationError

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_WHOLE = re.compile(_NUMBER)
# Not after a letter, digit or dot, so "2024-05" does not yield -5 and "v1.2.3" no 2.3.
_ANYWHERE = re.compile(r"(?<![\w.])" + _NUMBER)


class Parameters(GroundTruthParameters):
    absolute_tolerance: float = Field(
        0.0, ge=0, description="Allowed absolute difference |output - expected|."
    )
    relative_tolerance: float = Field(
        0.0,
        ge=0,
        description="Allowed difference as a share of |expected| (0.05 = within 5 %).",
    )
    extract_number: bool = Field(
        False,
        description='Read the last number in a longer text ("... so the answer is 42.") '
        "instead of requiring the whole output to be a number.",
        json_schema_extra=ui(advanced=True),
    )


OUTPUTS = {
    "type": "object",
    "properties": {
        "success": {"type": "boolean"},
        "abs_error": {"type": "number", "minimum": 0},
    },
    "required": ["success", "abs_error"],
}


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    expected = as_number(ground_truth(parameters, inputs), extract=False)
    if expected is None:
        raise EvaluationError(
            f"The ground-truth column {parameters.correct_answer_key!r} is not a number: "
            f"{_shown(inputs[parameters.correct_answer_key])}.",
            code="invalid_ground_truth",
        )
    actual = as_number(outputs, extract=parameters.extract_number)
    if actual is None:
        hint = "" if parameters.extract_number else "; turn on extract_number to read the last "
        hint = hint and hint + "number in a longer text"
        raise EvaluationError(
            f"The output is not a number: {_shown(outputs)}. Expected a number or a string "
            f'holding one ("42", "-3.5", "1,234.5", "6.02e23"){hint}.',
            code="output_not_numeric",
        )
    error = abs(actual - expected)
    allowed = max(parameters.absolute_tolerance, parameters.relative_tolerance * abs(expected))
    return {"success": error <= allowed, "abs_error": error}


def as_number(value: Any, *, extract: bool) -> float | None:
    """A finite float from a number or a numeric string; None when there is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        number = _parse(value, extract)
    else:
        return None
    return number if number is not None and math.isfinite(number) else None


def _parse(text: str, extract: bool) -> float | None:
    if extract:
        found = _ANYWHERE.findall(text)
        text = found[-1] if found else ""
    text = text.strip()
    if not _WHOLE.fullmatch(text):
        return None
    try:
        return float(text.replace(",", ""))
    except OverflowError:
        return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


kind = register(
    Kind(
        key="numeric_match",
        name="Numeric match",
        description="Succeeds when the output is a number within an absolute or relative "
        "tolerance of the ground truth.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=OUTPUTS,
        needs_ground_truth=True,
        presets=[
            PresetSpec("exact_number", "Same number", {}),
            PresetSpec(
                "within_1_percent", "Within 1 %", {"relative_tolerance": 0.01}, "Relative error."
            ),
            PresetSpec(
                "final_answer",
                "Final answer in text",
                {"extract_number": True},
                "The last number of a worked answer equals the ground truth.",
            ),
        ],
    )
)
