"""Regex: the output matches (or must not match) a regular expression.

Matching uses the ``regex`` library (a superset of Python's ``re``) for its timeout: a pattern
that backtracks catastrophically ends as an error instead of holding a worker.
"""

from __future__ import annotations

import json
import re
from typing import Any

import regex
from pydantic import Field, field_validator

from evaluators.kinds.base import SUCCESS_ONLY, Kind, KindParameters, PresetSpec, register, ui
from evaluators.normalize import EvaluationError


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
    timeout_s: float = Field(
        1.0,
        gt=0,
        le=30,
        description="Longest a match may take.",
        json_schema_extra=ui(advanced=True),
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}")
        return pattern


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> bool:
    text = outputs if isinstance(outputs, str) else json.dumps(outputs)
    flags = 0 if parameters.case_sensitive else regex.IGNORECASE
    try:
        found = (
            regex.search(parameters.pattern, text, flags, timeout=parameters.timeout_s) is not None
        )
    except TimeoutError:
        raise EvaluationError(
            f"The pattern took longer than {parameters.timeout_s:g} s on this output "
            "(catastrophic backtracking?); simplify it or raise timeout_s.",
            code="regex_timeout",
        )
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
