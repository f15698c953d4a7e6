"""Contains JSON: the output holds a parseable JSON object or array, alone or inside text."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from evaluators.kinds.base import SUCCESS_ONLY, Kind, KindParameters, PresetSpec, register

# Every "{" or "[" is a place JSON may start; a bound keeps pathological outputs (thousands of
# brackets) from costing quadratic time.
MAX_CANDIDATES = 1000
_WANTED: dict[str, type | tuple[type, ...]] = {"any": (dict, list), "object": dict, "array": list}


class Parameters(KindParameters):
    json_type: Literal["any", "object", "array"] = Field(
        "any", description="What must be found: an object, an array, or either."
    )


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> bool:
    wanted = _WANTED[parameters.json_type]
    if not isinstance(outputs, str):
        return isinstance(outputs, wanted)
    return any(isinstance(value, wanted) for value in _json_values(outputs))


def _json_values(text: str):
    """Each JSON value that starts at a bracket of the text (a ```json fence needs no special
    case: its content starts at a bracket too)."""
    decoder = json.JSONDecoder()
    starts = (i for i, char in enumerate(text) if char in "{[")
    for count, start in enumerate(starts):
        if count >= MAX_CANDIDATES:
            return
        try:
            yield decoder.raw_decode(text, start)[0]
        except (ValueError, RecursionError):
            continue


kind = register(
    Kind(
        key="contains_json",
        name="Contains JSON",
        description="Succeeds when the output contains a parseable JSON object or array, "
        "on its own or inside text (prose, a ```json fence).",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=SUCCESS_ONLY,
        presets=[
            PresetSpec("json_object", "Contains a JSON object", {"json_type": "object"}),
            PresetSpec("json_array", "Contains a JSON array", {"json_type": "array"}),
        ],
    )
)
