"""Similarity: how close the output's text is to the ground truth, from 0 to 1 (rapidfuzz)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field
from rapidfuzz import fuzz
from rapidfuzz.distance import Levenshtein

from evaluators.kinds.base import (
    SCORE_SUCCESS,
    GroundTruthParameters,
    Kind,
    PresetSpec,
    ground_truth,
    register,
    ui,
)

# fuzz.ratio is the Indel similarity (insertions and deletions only), as difflib's
# SequenceMatcher.ratio approximates it; Levenshtein also counts a substitution as one edit.
METHODS = {
    "sequence_ratio": lambda a, b: fuzz.ratio(a, b) / 100,
    "levenshtein": Levenshtein.normalized_similarity,
}


class Parameters(GroundTruthParameters):
    method: Literal["sequence_ratio", "levenshtein"] = Field(
        "sequence_ratio",
        description="sequence_ratio: normalized Indel similarity (rapidfuzz fuzz.ratio / 100). "
        "levenshtein: 1 - Levenshtein distance / length of the longer text.",
    )
    threshold: float = Field(
        0.5, ge=0, le=1, description="Success when the similarity is at least this (0 to 1)."
    )
    case_sensitive: bool = Field(True, json_schema_extra=ui(advanced=True))
    normalize_whitespace: bool = Field(
        True,
        description="Trim both ends and turn every run of white space into one space.",
        json_schema_extra=ui(advanced=True),
    )


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    expected = _text(ground_truth(parameters, inputs), parameters)
    score = float(METHODS[parameters.method](_text(outputs, parameters), expected))
    return {"score": score, "success": score >= parameters.threshold}


def _text(value: Any, parameters: Parameters) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if parameters.normalize_whitespace:
        text = re.sub(r"\s+", " ", text).strip()
    return text if parameters.case_sensitive else text.casefold()


kind = register(
    Kind(
        key="similarity",
        name="Similarity",
        description="Scores how similar the output's text is to the ground truth (0 to 1): "
        "normalized Indel (sequence ratio) or Levenshtein similarity.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=SCORE_SUCCESS,
        needs_ground_truth=True,
        presets=[
            PresetSpec(
                "fuzzy_match",
                "Fuzzy match",
                {"method": "sequence_ratio", "threshold": 0.8, "case_sensitive": False},
                "Nearly the same text, ignoring case and spacing.",
            ),
            PresetSpec(
                "typo_tolerant",
                "Typo tolerant",
                {"method": "levenshtein", "threshold": 0.9, "case_sensitive": False},
                "A few wrong characters are fine.",
            ),
        ],
    )
)
