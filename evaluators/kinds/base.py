"""What a kind is, and the registry of kinds.

A kind is one module in this package. It defines a pydantic ``Parameters`` model (the settings
template; UI hints go in ``json_schema_extra`` through :func:`ui`), an outputs schema, presets,
and ``evaluate(parameters, inputs, outputs, trace)`` returning a raw value that
``evaluators.normalize`` turns into an outputs dict. It ends with ``register(Kind(...))``.
Adding a kind means copying a neighbour and adding its module to ``kinds/__init__.py``.

``evaluate`` raises ``EvaluationError`` for failures the user should read (a missing ground-truth
column, an unreachable webhook); any other exception is recorded as an error with its stack trace.

Sessions (DOMAIN.md, "The evaluator contract"): a kind that can judge a whole conversation gives
``evaluate_session(parameters, inputs, outputs, session)`` or the batch form
``evaluate_sessions(parameters, [(inputs, outputs, session)], context)``, where ``session`` is
``{"session_id", "traces": [trace, ...], "messages": [...]}``. ``Kind.session_support`` says
whether given parameters can (a code evaluator needs an ``evaluate_session`` entry point), and
why not when they cannot: that reason is what people read, on a refused session rule and on
every ``session_unsupported`` error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evaluators.normalize import EvaluationError

Trace = dict[str, Any] | None
Session = dict[str, Any]
EvaluateFn = Callable[[Any, dict[str, Any], Any, Trace], Any]
EvaluateSessionFn = Callable[[Any, dict[str, Any], Any, Session], Any]


def ui(
    *,
    advanced: bool = False,
    hidden: bool = False,
    widget: str = "",
    ground_truth_key: bool = False,
    label: str = "",
    sealed: bool = False,
) -> dict[str, Any]:
    """UI hints for a parameter, stored as ``x-*`` keys of its JSON Schema.

    ``widget`` is one of ``code``, ``regex``, ``json``, ``json-schema``, ``textarea``, ``choice``.
    ``ground_truth_key`` marks the setting that names the testcase column holding the truth.
    ``sealed`` marks a name -> secret map (a webhook's headers): its values are stored
    encrypted and read back as ``evaluators.crypto.MASK`` (``x-sealed``).
    """
    hints: dict[str, Any] = {}
    if sealed:
        hints["x-sealed"] = True
    if advanced:
        hints["x-advanced"] = True
    if hidden:
        hints["x-hidden"] = True
    if widget:
        hints["x-widget"] = widget
    if ground_truth_key:
        hints["x-ground-truth-key"] = True
    if label:
        hints["title"] = label
    return hints


class KindParameters(BaseModel):
    """Base of every kind's parameters: unknown keys are refused so typos surface."""

    model_config = ConfigDict(extra="forbid")


class GroundTruthParameters(KindParameters):
    correct_answer_key: str = Field(
        "correct_answer",
        description="The testcase column that holds the expected answer.",
        json_schema_extra=ui(ground_truth_key=True, advanced=True, label="Ground truth column"),
    )


def ground_truth(parameters: GroundTruthParameters, inputs: dict[str, Any]) -> Any:
    key = parameters.correct_answer_key
    if key not in inputs:
        columns = ", ".join(sorted(inputs)) or "none"
        raise EvaluationError(
            f"The ground-truth column {key!r} is not in the inputs (columns: {columns}). "
            f"Set correct_answer_key to the column that holds the expected answer.",
            code="missing_ground_truth",
        )
    return inputs[key]


@dataclass(frozen=True)
class PresetSpec:
    slug: str
    name: str
    parameters: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Kind:
    key: str
    name: str
    description: str
    parameters: type[KindParameters]
    evaluate: EvaluateFn | None
    outputs: dict[str, Any] | Callable[[Any], dict[str, Any]] | None
    presets: Sequence[PresetSpec] = ()
    needs_ground_truth: bool = False
    needs_trace: bool = False
    needs_model: bool = False
    executes: bool = True  # False for human feedback: nothing runs, people annotate
    category: str = "builtin"
    # Optional batch entry point: (parameters, [(inputs, outputs, trace)], context) -> [normalize.Raw]
    evaluate_many: Callable | None = None
    # Values a NEW evaluator starts with, beyond the model's defaults (code: interface version 2,
    # while a stored revision without a version means the legacy version 1).
    new_defaults: dict[str, Any] = field(default_factory=dict)
    # Checks that need more than the model, run before a revision is saved: parameters -> problems
    # as {field: [reasons]} (code: syntax errors with line numbers).
    check: Callable[[Any], dict[str, list[str]]] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    # Sessions: one call per session, or the batch form
    # (parameters, [(inputs, outputs, session)], context) -> [normalize.Raw].
    evaluate_session: EvaluateSessionFn | None = None
    evaluate_sessions: Callable | None = None
    # Parameters -> why these cannot judge sessions, or None (code: no evaluate_session).
    session_problem: Callable[[Any], str | None] | None = None

    def parse(self, raw: dict[str, Any] | None) -> KindParameters:
        """Validate parameters, filling defaults. Raises pydantic.ValidationError."""
        return self.parameters.model_validate(raw or {})

    def defaults(self) -> dict[str, Any]:
        """The parameters a new evaluator starts from; {} when some setting must be chosen."""
        if not _has_all_defaults(self):
            return {}
        try:
            return self.parse({}).model_dump(mode="json")
        except ValidationError:  # every field has a default, yet the model wants a choice
            return {}

    def outputs_schema(self, parameters: KindParameters) -> dict[str, Any] | None:
        if callable(self.outputs):
            return self.outputs(parameters)
        return self.outputs

    @property
    def judges_sessions(self) -> bool:
        """Whether the kind has a session entry point at all (parameters may still lack one)."""
        return self.evaluate_session is not None or self.evaluate_sessions is not None

    def session_support(self, parameters: KindParameters) -> str | None:
        """None when these parameters judge sessions; otherwise why not, in words for people."""
        if not self.judges_sessions:
            return (
                f"{self.name} evaluators judge one trace at a time, not sessions. To judge a "
                f"whole conversation use custom code with evaluate_session(inputs, outputs, "
                f"session), an LLM judge (its prompt may read {{{{session_transcript}}}}), or an "
                f"agent score."
            )
        return self.session_problem(parameters) if self.session_problem is not None else None

    def settings_template(self) -> dict[str, Any]:
        return self.parameters.model_json_schema()

    @property
    def sealed(self) -> tuple[str, ...]:
        """The settings whose values are secrets (``ui(sealed=True)``)."""
        return tuple(
            name
            for name, found in self.parameters.model_fields.items()
            if isinstance(found.json_schema_extra, dict) and found.json_schema_extra.get("x-sealed")
        )


def _has_all_defaults(kind: Kind) -> bool:
    return all(not f.is_required() for f in kind.parameters.model_fields.values())


REGISTRY: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    if kind.key in REGISTRY:
        raise RuntimeError(f"kind {kind.key!r} registered twice")
    REGISTRY[kind.key] = kind
    return kind


def get_kind(key: str) -> Kind:
    try:
        return REGISTRY[key]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"Unknown kind {key!r}; known kinds: {known}.") from None


# Outputs schemas shared by many kinds.
SCORE_SUCCESS = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "success": {"type": "boolean"},
    },
    "required": ["success"],
}
SUCCESS_ONLY = {
    "type": "object",
    "properties": {"success": {"type": "boolean"}},
    "required": ["success"],
}
