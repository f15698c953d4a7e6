"""Score shapes: what the model must answer, how the answer is read, what the outputs are.

=============  ==========================================  ======================================
score_type     the model answers (JSON object)             outputs
=============  ==========================================  ======================================
binary         ``{"reasoning", "verdict": true|false}``    ``{"success"}``
numeric        ``{"reasoning", "score": lo..hi}``          ``{"score", "success": score >= threshold}``
categorical    ``{"reasoning", "label": one of labels}``   ``{"label", "score": map[label], "success"}``
rubric         ``{"reasoning", "criteria": {name: 0..1}}``  ``{"score": weighted mean, "success", "criteria"}``
=============  ==========================================  ======================================

``reasoning`` is asked for (first, so the model reasons before it decides) and kept in the outputs
only when the judge's ``reasoning`` setting is on. Types are JSON's: ``true`` is a boolean, never
the number 1, and ``1`` is never a verdict.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import referencing


class BadAnswer(Exception):
    """The model's answer cannot be used; the message says why (it is sent back on repair)."""


def answer_schema(p) -> dict[str, Any]:
    """The JSON Schema the model's answer must match (strict structured-output compatible)."""
    properties: dict[str, Any] = {"reasoning": {"type": "string"}} if p.reasoning else {}
    if p.score_type == "binary":
        properties["verdict"] = {"type": "boolean"}
    elif p.score_type == "numeric":
        properties["score"] = {
            "type": "integer" if p.integer_scores else "number",
            "minimum": p.score_min,
            "maximum": p.score_max,
        }
    elif p.score_type == "categorical":
        properties["label"] = {"type": "string", "enum": [c.label for c in p.categories]}
    else:
        names = [c.name for c in p.criteria]
        properties["criteria"] = {
            "type": "object",
            "properties": {n: {"type": "number", "minimum": 0, "maximum": 1} for n in names},
            "required": names,
            "additionalProperties": False,
        }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def outputs_schema(p) -> dict[str, Any]:
    """The revision's ``schemas.outputs`` for these parameters."""
    properties: dict[str, Any] = {}
    if p.score_type == "numeric":
        properties["score"] = {
            "type": "integer" if p.integer_scores else "number",
            "minimum": p.score_min,
            "maximum": p.score_max,
        }
    elif p.score_type == "categorical":
        properties["label"] = {"type": "string", "enum": [c.label for c in p.categories]}
        properties["score"] = {"type": "number"}
    elif p.score_type == "rubric":
        properties["score"] = {"type": "number", "minimum": 0, "maximum": 1}
        properties["criteria"] = {
            "type": "object",
            "properties": {
                c.name: {"type": "number", "minimum": 0, "maximum": 1} for c in p.criteria
            },
            "required": [c.name for c in p.criteria],
        }
    properties["success"] = {"type": "boolean"}
    required = list(properties)
    if p.reasoning:
        properties["reasoning"] = {"type": "string"}
    return {"type": "object", "properties": properties, "required": required}


def instructions(p) -> str:
    """Told to the model in a system message: structured output alone is not always honoured."""
    lines = ["Answer with one JSON object and nothing else."]
    if p.reasoning:
        lines.append('Put your step-by-step reasoning in "reasoning" first, then decide.')
    if p.score_type == "binary":
        lines.append('Set "verdict" to true if the answer passes, false if it does not.')
    elif p.score_type == "numeric":
        kind = "an integer" if p.integer_scores else "a number"
        lines.append(
            f'Set "score" to {kind} from {p.score_min:g} (worst) to {p.score_max:g} (best).'
        )
    elif p.score_type == "categorical":
        labels = ", ".join(json.dumps(c.label) for c in p.categories)
        lines.append(f'Set "label" to exactly one of: {labels}.')
    else:
        lines.append('Score each criterion in "criteria" from 0 (not met) to 1 (fully met):')
        lines += [
            f"- {c.name}: {c.description}" if c.description else f"- {c.name}" for c in p.criteria
        ]
    lines.append("JSON Schema of the answer: " + json.dumps(answer_schema(p)))
    return "\n".join(lines)


def parse(text: str, p) -> dict[str, Any]:
    """The outputs for one answer text; raises ``BadAnswer``."""
    return outputs_of(parse_object(text, answer_schema(p)), p)


def parse_object(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON object in an answer, checked against ``schema``; raises ``BadAnswer``."""
    answer = _json_object(text)
    validator = jsonschema.Draft202012Validator(schema, registry=referencing.Registry())
    error = jsonschema.exceptions.best_match(validator.iter_errors(answer))
    if error is not None:
        where = ".".join(str(x) for x in error.absolute_path) or "the answer"
        raise BadAnswer(f"{where}: {error.message}")
    return answer


def outputs_of(answer: dict[str, Any], p) -> dict[str, Any]:
    if p.score_type == "binary":
        outputs: dict[str, Any] = {"success": answer["verdict"]}
    elif p.score_type == "numeric":
        outputs = {"score": answer["score"], "success": answer["score"] >= p.threshold}
    elif p.score_type == "categorical":
        score = next(c.score for c in p.categories if c.label == answer["label"])
        outputs = {"label": answer["label"], "score": score, "success": score >= p.threshold}
    else:
        criteria = answer["criteria"]
        total = sum(c.weight for c in p.criteria)
        score = round(sum(criteria[c.name] * c.weight for c in p.criteria) / total, 6)
        outputs = {"score": score, "success": score >= p.threshold, "criteria": criteria}
    if p.reasoning:
        outputs["reasoning"] = answer.get("reasoning", "")
    return outputs


def _json_object(text: str) -> dict[str, Any]:
    """The JSON object in an answer, tolerating code fences and prose around it."""
    stripped = (text or "").strip()
    if not stripped:
        raise BadAnswer("the answer was empty")
    try:
        value = json.loads(stripped)
    except ValueError:
        value = _embedded_object(stripped)
    if not isinstance(value, dict):
        raise BadAnswer(f"the answer is JSON {type(value).__name__}, not an object")
    return value


def _embedded_object(text: str) -> Any:
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
            return value
        except ValueError:
            start = text.find("{", start + 1)
    raise BadAnswer(f"the answer is not JSON: {text[:200]!r}")
