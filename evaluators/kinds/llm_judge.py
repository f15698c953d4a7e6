"""LLM-as-a-judge: a model grades the output from a prompt, answering in a declared shape.

The prompt is chat messages whose text is a template (``curly`` by default, or sandboxed
``jinja2``; see ``evaluators.judge.templates``), or the output of a script run in the code
sandbox (``evaluators.judge.scripts``), preceded by any few-shot examples, sent as literal
messages and never rendered (``evaluators.judge.shots``). The model is one of the project's model connections;
its answer is forced into the score shape (binary, numeric range, categorical, weighted rubric)
with JSON-schema structured output, read back with one repair request if it is malformed, and
turned into outputs (``evaluators.judge.scores``). Rate limits, retries, spend caps and traces
are handled per batch by ``evaluators.judge.batch``; docs/llm-judge.md is the user's guide.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evaluators.judge import scores
from evaluators.judge.batch import judge_many, judge_sessions
from evaluators.judge.presets import CORRECTNESS, PRESETS
from evaluators.judge.shots import expected_problem
from evaluators.judge.templates import syntax_problems
from evaluators.kinds.base import GroundTruthParameters, Kind, PresetSpec, register, ui


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class Category(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=200)
    score: float


class Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str = ""
    weight: float = Field(1.0, gt=0)


MAX_SHOTS = 20
MAX_SHOT_CHARS = 200_000


class FewShot(BaseModel):
    """A case already judged, shown to the model with the answer it should get."""

    model_config = ConfigDict(extra="forbid")

    inputs: dict[str, Any] = Field(default_factory=dict)
    outputs: Any = None
    expected: Any = Field(
        ...,
        description="The answer: true/false (binary), a score (numeric), a label "
        "(categorical), or {criterion: 0..1} (rubric).",
    )
    note: str = Field("", max_length=5_000, description="Why; the answer's reasoning.")

    @model_validator(mode="after")
    def _bounded(self) -> FewShot:
        size = len(json.dumps([self.inputs, self.outputs], ensure_ascii=False, default=str))
        if size > MAX_SHOT_CHARS:
            raise ValueError(f"an example's inputs and outputs exceed {MAX_SHOT_CHARS} characters")
        return self


class Parameters(GroundTruthParameters):
    connection: str = Field(
        ...,
        min_length=1,
        max_length=100,
        description="Slug of one of this project's model connections (the Connections page).",
        json_schema_extra=ui(label="Model connection"),
    )
    model: str = Field(
        "", max_length=200, description="One of the connection's models; empty means its first."
    )
    prompt_source: Literal["messages", "script"] = Field(
        "messages",
        description="messages: the templates below; script: the prompt a script prints.",
        json_schema_extra=ui(widget="choice"),
    )
    template_format: Literal["curly", "jinja2"] = Field(
        "curly",
        description="curly: {{inputs.country}}, {{$.json.path}}, {{/json/pointer}}; or jinja2.",
        json_schema_extra=ui(widget="choice"),
    )
    # Plain defaults (pydantic copies them per instance) so the settings template shows them.
    messages: list[Message] = Field(
        [Message(**m) for m in CORRECTNESS],
        description='Chat messages, [{"role": "system"|"user"|"assistant", "content": "..."}]; '
        "each content is a template.",
        json_schema_extra=ui(widget="json"),
    )
    few_shot: list[FewShot] = Field(
        [],
        max_length=MAX_SHOTS,
        description='Examples sent before the prompt, as they are (never rendered): [{"inputs": '
        '{...}, "outputs": ..., "expected": true, "note": "why"}]; expected in the score '
        "shape: a verdict, a score, a label or {criterion: 0..1}.",
        json_schema_extra=ui(widget="json", advanced=True),
    )
    score_type: Literal["binary", "numeric", "categorical", "rubric"] = Field(
        "numeric", json_schema_extra=ui(widget="choice")
    )
    score_min: float = Field(0.0, description="Numeric scores: the lowest score.")
    score_max: float = Field(1.0, description="Numeric scores: the highest score.")
    integer_scores: bool = Field(False, description="Numeric scores: whole numbers only.")
    categories: list[Category] = Field(
        [],
        description='Categorical: [{"label": "helpful", "score": 1}, ...].',
        json_schema_extra=ui(widget="json"),
    )
    criteria: list[Criterion] = Field(
        [],
        description='Rubric: [{"name": "accuracy", "description": "...", "weight": 2}, ...].',
        json_schema_extra=ui(widget="json"),
    )
    reasoning: bool = Field(True, description="Ask for reasoning and keep it in the outputs.")
    threshold: float = Field(
        0.5, description="success = score >= threshold (numeric, categorical, rubric)."
    )
    script_runtime: Literal["python", "javascript", "typescript"] = Field(
        "python", json_schema_extra=ui(widget="choice", advanced=True)
    )
    script: str = Field(
        "",
        max_length=200_000,
        description="Script prompt: reads the context JSON on stdin, prints the prompt.",
        json_schema_extra=ui(widget="code", advanced=True),
    )
    script_timeout_s: float = Field(10.0, gt=0, le=60, json_schema_extra=ui(advanced=True))
    config: dict[str, Any] = Field(
        {},
        description="Passed to script prompts as config.",
        json_schema_extra=ui(widget="json", advanced=True),
    )
    temperature: float = Field(0.0, ge=0, le=2, json_schema_extra=ui(advanced=True))
    max_tokens: int | None = Field(None, ge=1, json_schema_extra=ui(advanced=True))
    structured_output: bool = Field(
        True,
        description="Send the answer's JSON Schema as response_format (json_schema).",
        json_schema_extra=ui(advanced=True),
    )
    format_instructions: bool = Field(
        True,
        description="Tell the model the answer format in a system message.",
        json_schema_extra=ui(advanced=True),
    )
    max_retries: int = Field(
        4,
        ge=0,
        le=10,
        description="Retries on 429, 5xx and timeouts before the evaluation fails.",
        json_schema_extra=ui(advanced=True),
    )
    max_cost_usd: float | None = Field(
        None,
        gt=0,
        description="Stop calling the model once this run (or online rule) has spent this much.",
        json_schema_extra=ui(advanced=True),
    )

    @model_validator(mode="after")
    def _consistent(self) -> Parameters:
        if self.score_type == "numeric" and self.score_min >= self.score_max:
            raise ValueError("score_min must be below score_max")
        if self.score_type == "categorical":
            labels = [c.label for c in self.categories]
            if len(labels) < 2 or len(set(labels)) != len(labels):
                raise ValueError("categorical scores need at least two categories, labels unique")
        if self.score_type == "rubric":
            names = [c.name for c in self.criteria]
            if not names or len(set(names)) != len(names):
                raise ValueError("a rubric needs at least one criterion, names unique")
        for index, shot in enumerate(self.few_shot):
            problem = expected_problem(shot.expected, self)
            if problem:
                raise ValueError(f"few_shot[{index}].expected: {problem}")
        if self.prompt_source == "messages":
            if not self.messages:
                raise ValueError("give at least one message")
            _check_templates(self)
        elif not self.script.strip():
            raise ValueError("a script prompt needs a script")
        return self


def _check_templates(parameters: Parameters) -> None:
    """Syntax errors surface at save time; unresolved names only when there are inputs."""
    problems = syntax_problems(
        [m.content for m in parameters.messages], format=parameters.template_format
    )
    if problems:
        raise ValueError("; ".join(problems))


def _outputs(parameters: Parameters) -> dict[str, Any]:
    return scores.outputs_schema(parameters)


kind = register(
    Kind(
        key="llm_judge",
        name="LLM-as-a-judge",
        description="A model grades the output from a prompt template (curly, jinja2 or a "
        "script) and answers in a declared shape: binary, numeric, categorical or a rubric.",
        parameters=Parameters,
        evaluate=None,
        evaluate_many=judge_many,
        evaluate_sessions=judge_sessions,
        outputs=_outputs,
        needs_model=True,
        category="llm",
        presets=[PresetSpec(slug, name, values, text) for slug, name, text, values in PRESETS],
    )
)
