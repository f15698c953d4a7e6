"""JSON Schema: the output (JSON, or a string holding JSON) is valid against a schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
from jsonschema.validators import validator_for
from pydantic import Field, field_validator

from evaluators.kinds.base import Kind, KindParameters, PresetSpec, register, ui
from evaluators.normalize import EvaluationError

MAX_COUNTED_ERRORS = 1000


class Parameters(KindParameters):
    json_schema: dict[str, Any] = Field(
        ...,
        description="The JSON Schema the output must satisfy (draft 2020-12 unless $schema says "
        "otherwise).",
        json_schema_extra=ui(widget="json-schema", label="JSON Schema"),
    )
    parse_strings: bool = Field(
        True,
        description="A string output is parsed as JSON first; off: the string itself is validated.",
        json_schema_extra=ui(advanced=True),
    )
    check_formats: bool = Field(
        False,
        description="Enforce 'format' (email, date-time, uri ...) instead of treating it as a note.",
        json_schema_extra=ui(advanced=True),
    )

    @field_validator("json_schema")
    @classmethod
    def _is_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        try:
            validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            raise ValueError(
                f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
            )
        return schema


OUTPUTS = {
    "type": "object",
    "properties": {
        "success": {"type": "boolean"},
        "errors": {"type": "integer", "minimum": 0},
        "message": {"type": "string"},
    },
    "required": ["success", "errors", "message"],
}


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    document = outputs
    if parameters.parse_strings and isinstance(outputs, str):
        try:
            document = json.loads(outputs)
        except ValueError as exc:
            return {"success": False, "errors": 1, "message": f"The output is not JSON: {exc}"}
    schema = parameters.json_schema
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = cls.FORMAT_CHECKER if parameters.check_formats else None
    # An empty registry (the drafts' meta-schemas are always known) stops jsonschema from
    # fetching a remote $ref: a schema must not make evalsite send requests.
    validator = cls(schema, format_checker=checker, registry=referencing.Registry())
    errors = []
    try:
        for error in validator.iter_errors(document):
            errors.append(error)
            if len(errors) >= MAX_COUNTED_ERRORS:
                break
    except referencing.exceptions.Unresolvable as exc:
        raise EvaluationError(
            f"The schema refers to {exc.ref!r}, which is not inside it; evalsite does not fetch "
            f"remote schemas, so put the definition under $defs.",
            code="invalid_schema",
        )
    if not errors:
        return {"success": True, "errors": 0, "message": ""}
    best = jsonschema.exceptions.best_match(errors)
    where = ".".join(str(p) for p in best.absolute_path) or "(the output)"
    return {"success": False, "errors": len(errors), "message": f"at {where}: {best.message}"}


kind = register(
    Kind(
        key="json_schema",
        name="JSON Schema",
        description="Succeeds when the output is valid against a JSON Schema; counts the "
        "violations and explains the most relevant one.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=OUTPUTS,
        presets=[
            PresetSpec(
                "valid_json",
                "Valid JSON",
                {"json_schema": {}},
                "Any JSON value: the output only has to parse.",
            ),
            PresetSpec(
                "json_object",
                "A JSON object",
                {"json_schema": {"type": "object"}},
            ),
            PresetSpec(
                "answer_with_confidence",
                "Answer with confidence",
                {
                    "json_schema": {
                        "type": "object",
                        "properties": {
                            "answer": {"type": "string", "minLength": 1},
                            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        },
                        "required": ["answer", "confidence"],
                    }
                },
                "Edit the properties to describe your output.",
            ),
        ],
    )
)
