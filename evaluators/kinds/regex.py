"""Regex: the output matches (or must not match) a regular expression."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import Field, field_validator

from evaluators.kinds.base import SUCCESS_ONLY, Kind, KindParameters, PresetSpec, register, ui


class Parameters(KindParameters):
    pattern: str = Field(
        ...,
        description="Python regular expression, searched anywhere in the output.",
        json_schema_extra=ui(widget="regex"),
    )
    should_match: bool = Field(
        True, description="Succeed when it matches; off: succeed when it does not."
    )
    case_sensitive: bool = Field(True, json_schema_extra=ui(advanced=True))

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}")
        return pattern


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> bool:
    text = outputs if isinstance(outputs, str) else json.dumps(outputs)
    flags = 0 if parameters.case_sensitive else re.IGNORECASE
    found = re.search(parameters.pattern, text, flags) is not None
    return found == parameters.should_match


def _words(*words: str) -> str:
    return "|".join(re.escape(word) for word in words)


kind = register(
    Kind(
        key="regex",
        name="Regex",
        description="Succeeds when the output matches a regular expression (or, inverted, does not).",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=SUCCESS_ONLY,
        presets=[
            PresetSpec(
                "starts_with",
                "Starts with",
                {"pattern": "^Answer:"},
                "Output starts with a prefix; edit the text after ^.",
            ),
            PresetSpec(
                "ends_with",
                "Ends with",
                {"pattern": r"\.$"},
                "Output ends with a suffix; edit the text before $.",
            ),
            PresetSpec("contains", "Contains", {"pattern": "Paris", "case_sensitive": False}),
            PresetSpec(
                "contains_any",
                "Contains any",
                {"pattern": _words("yes", "correct", "true"), "case_sensitive": False},
            ),
            PresetSpec(
                "contains_all",
                "Contains all",
                {"pattern": "^(?=[\\s\\S]*alpha)(?=[\\s\\S]*beta)", "case_sensitive": False},
                "Every word in a lookahead must appear somewhere.",
            ),
            PresetSpec(
                "no_apology",
                "Does not apologise",
                {
                    "pattern": r"\b(sorry|apologi[sz]e)\b",
                    "should_match": False,
                    "case_sensitive": False,
                },
            ),
        ],
    )
)
