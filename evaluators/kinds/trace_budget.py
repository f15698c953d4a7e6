"""Trace budget: the invocation stayed within latency, token and cost limits.

Reads the trace contract (DOMAIN.md, "The trace that evaluators receive"): latency is the root
span's own duration, tokens and costs are the whole tree's (``acc``) or the root span's
(``unit``) totals.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from evalsite.jsonpaths import dig
from evaluators.kinds.base import Kind, KindParameters, PresetSpec, register, ui
from evaluators.normalize import EvaluationError

LATENCY = ("duration", "total")
TOKENS = ("tokens", "total")
COST = ("costs", "total")


class Parameters(KindParameters):
    max_latency_ms: float | None = Field(
        None, ge=0, description="Longest allowed duration of the root span, in milliseconds."
    )
    max_tokens: int | None = Field(None, ge=0, description="Most tokens allowed (total).")
    max_cost: float | None = Field(None, ge=0, description="Highest cost allowed (total).")
    scope: Literal["acc", "unit"] = Field(
        "acc",
        description="Tokens and cost of the whole tree (acc) or of the root span alone (unit).",
        json_schema_extra=ui(advanced=True),
    )

    @model_validator(mode="after")
    def _some_limit(self) -> Parameters:
        if self.max_latency_ms is None and self.max_tokens is None and self.max_cost is None:
            raise ValueError("set at least one limit: max_latency_ms, max_tokens or max_cost")
        return self


def _limits(parameters: Parameters) -> list[tuple[str, float | None, str, tuple[str, ...]]]:
    """(measure, limit, scope, metric path) for each limit; latency is always the root's own."""
    return [
        ("latency_ms", parameters.max_latency_ms, "unit", LATENCY),
        ("tokens", parameters.max_tokens, parameters.scope, TOKENS),
        ("cost", parameters.max_cost, parameters.scope, COST),
    ]


def outputs_schema(parameters: Parameters) -> dict[str, Any]:
    properties: dict[str, Any] = {"success": {"type": "boolean"}}
    for measure, limit, _, _ in _limits(parameters):
        if limit is not None:
            name = measure.removesuffix("_ms")
            properties[measure] = {"type": "number", "minimum": 0}
            properties[f"{name}_ok"] = {"type": "boolean"}
    return {"type": "object", "properties": properties, "required": list(properties)}


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    root = _root_span(trace)
    result: dict[str, Any] = {}
    for measure, limit, scope, path in _limits(parameters):
        if limit is None:
            continue
        value = _metric(root, ("attributes", "ag", "metrics", scope, *path))
        result[measure] = value
        result[f"{measure.removesuffix('_ms')}_ok"] = value <= limit
    return {"success": all(v for k, v in result.items() if k.endswith("_ok")), **result}


def _root_span(trace: Any) -> dict[str, Any]:
    if trace is None:
        raise EvaluationError(
            "trace_budget needs the invocation's trace, and none was given.",
            code="missing_trace",
        )
    spans = trace.get("spans") if isinstance(trace, dict) else None
    if not isinstance(spans, dict) or not spans:
        raise EvaluationError("The trace has no root span under spans.", code="missing_trace")
    # One invocation has one root; should there be several, the first is the invocation.
    root = next(iter(spans.values()))
    if not isinstance(root, dict):
        raise EvaluationError("The trace's root span is not an object.", code="missing_trace")
    return root


def _metric(root: dict[str, Any], path: tuple[str, ...]) -> float:
    value = dig(root, path)
    where = ".".join(path)
    name = root.get("name") or root.get("span_id") or "?"
    if value is None:
        raise EvaluationError(
            f"The trace's root span ({name}) has no {where}.", code="missing_trace_metric"
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EvaluationError(
            f"The trace's root span ({name}) has {where} = {value!r}, not a number.",
            code="missing_trace_metric",
        )
    return value


kind = register(
    Kind(
        key="trace_budget",
        name="Trace budget",
        description="Succeeds when the invocation's latency, tokens and cost stay within limits "
        "(read from the trace).",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=outputs_schema,
        needs_trace=True,
        presets=[
            PresetSpec(
                "latency_check",
                "Latency check",
                {"max_latency_ms": 5000},
                "The invocation took at most 5 seconds.",
            ),
            PresetSpec(
                "token_budget",
                "Token budget",
                {"max_tokens": 4000},
                "The whole trace used at most 4,000 tokens.",
            ),
            PresetSpec("cost_budget", "Cost budget", {"max_cost": 0.01}, "At most 0.01 per call."),
        ],
    )
)
