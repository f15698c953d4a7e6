"""Human feedback: nothing runs; people fill a form whose fields the parameters define.

The outputs schema is computed from the fields, and it is what the annotation form is built
from, what annotations are checked against, and where the run's metrics come from.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evaluators.kinds.base import Kind, KindParameters, PresetSpec, register, ui

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class FeedbackField(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="The metric key, e.g. score or helpful.")
    type: Literal["number", "integer", "boolean", "categorical", "string"]
    description: str = ""
    required: bool = True
    min: float | None = None
    max: float | None = None
    choices: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _metric_key(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a valid field name: use letters, digits and _, "
                f"starting with a letter or _ (at most 64 characters)"
            )
        return name

    @model_validator(mode="after")
    def _consistent(self) -> FeedbackField:
        numeric = self.type in ("number", "integer")
        if not numeric and (self.min is not None or self.max is not None):
            raise ValueError(f"{self.name}: min and max apply only to number and integer fields")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"{self.name}: min ({self.min:g}) is above max ({self.max:g})")
        if self.type == "categorical":
            if not self.choices:
                raise ValueError(f"{self.name}: a categorical field needs choices")
            if len(set(self.choices)) != len(self.choices):
                raise ValueError(f"{self.name}: choices must be different from each other")
        elif self.choices is not None:
            raise ValueError(f"{self.name}: choices apply only to categorical fields")
        return self

    def output_schema(self) -> dict[str, Any]:
        if self.type == "categorical":
            prop: dict[str, Any] = {"type": "string", "enum": list(self.choices or ())}
        elif self.type in ("number", "integer"):
            prop = {"type": self.type}
            if self.min is not None:
                prop["minimum"] = self.min
            if self.max is not None:
                prop["maximum"] = self.max
        else:
            prop = {"type": self.type}
        return {**prop, "description": self.description} if self.description else prop


def _default_fields() -> list[FeedbackField]:
    return [
        FeedbackField(name="score", type="number", min=1, max=5, description="1 (bad) to 5 (good)"),
        FeedbackField(name="comment", type="string", required=False),
    ]


class Parameters(KindParameters):
    fields: list[FeedbackField] = Field(
        default_factory=_default_fields,
        min_length=1,
        description="The feedback form: each field has a name, a type (number, integer, "
        "boolean, categorical, string), optional min/max, and choices for categorical.",
        json_schema_extra=ui(widget="json"),
    )

    @field_validator("fields")
    @classmethod
    def _unique_names(cls, fields: list[FeedbackField]) -> list[FeedbackField]:
        names = [field.name for field in fields]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"field names must be unique; repeated: {', '.join(repeated)}")
        return fields


def outputs_schema(parameters: Parameters) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {field.name: field.output_schema() for field in parameters.fields},
        "required": [field.name for field in parameters.fields if field.required],
        "additionalProperties": False,
    }


kind = register(
    Kind(
        key="human",
        name="Human feedback",
        description="People annotate outputs with a form you define (scores, yes/no, labels, "
        "comments); nothing runs automatically.",
        parameters=Parameters,
        evaluate=None,
        outputs=outputs_schema,
        executes=False,
        category="human",
        presets=[
            PresetSpec(
                "five_stars",
                "Score 1 to 5",
                {
                    "fields": [
                        {"name": "score", "type": "number", "min": 1, "max": 5},
                        {"name": "comment", "type": "string", "required": False},
                    ]
                },
            ),
            PresetSpec(
                "thumbs",
                "Thumbs up or down",
                {
                    "fields": [
                        {"name": "success", "type": "boolean"},
                        {"name": "comment", "type": "string", "required": False},
                    ]
                },
            ),
            PresetSpec(
                "correctness_label",
                "Correct / partially / incorrect",
                {
                    "fields": [
                        {
                            "name": "correctness",
                            "type": "categorical",
                            "choices": ["correct", "partially_correct", "incorrect"],
                        },
                        {"name": "comment", "type": "string", "required": False},
                    ]
                },
            ),
        ],
    )
)
