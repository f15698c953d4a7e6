"""Step budget: the agent stayed within a number of tool calls, tool time, retries, failures.

Tool time is the sum of the tool spans' durations in the trace (``ag.metrics.unit.duration.total``)
matched to the calls; calls no span timed count as ``untimed_calls`` and add nothing. Each check
reports the step that broke it (``<check>_step``, from 1): the call over the limit, or the call
that took tool time past it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field, model_validator

from evaluators.agents.extract import AgentRun
from evaluators.kinds.agent_base import AgentRunParameters
from evaluators.kinds.base import Kind, PresetSpec, register
from evaluators.normalize import EvaluationError

CHECKS = ("calls", "tool_ms", "retries", "failed_calls")


class Parameters(AgentRunParameters):
    max_calls: int | None = Field(None, ge=0, description="Most tool calls allowed.")
    max_tool_ms: float | None = Field(
        None,
        ge=0,
        description="Most total tool time allowed, in milliseconds (from the trace's tool spans).",
    )
    max_retries: int | None = Field(
        None, ge=0, description="Most retries allowed (a tool called again right after itself)."
    )
    max_failed_calls: int | None = Field(None, ge=0, description="Most failed calls allowed.")

    @model_validator(mode="after")
    def _some_limit(self) -> Parameters:
        if all(self.limit(check) is None for check in CHECKS):
            raise ValueError(
                "set at least one limit: max_calls, max_tool_ms, max_retries or max_failed_calls"
            )
        return self

    def limit(self, check: str) -> float | None:
        return getattr(self, f"max_{check}")


def outputs_schema(parameters: Parameters) -> dict[str, Any]:
    properties: dict[str, Any] = {"success": {"type": "boolean"}, "reason": {"type": "string"}}
    for check in CHECKS:
        if parameters.limit(check) is not None:
            number = "number" if check == "tool_ms" else "integer"
            properties[check] = {"type": number, "minimum": 0}
            properties[f"{check}_ok"] = {"type": "boolean"}
            properties[f"{check}_step"] = {"type": ["integer", "null"], "minimum": 1}
    if parameters.max_tool_ms is not None:
        properties["untimed_calls"] = {"type": "integer", "minimum": 0}
    return {"type": "object", "properties": properties, "required": list(properties)}


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    run = parameters.agent_run(inputs, outputs, trace)
    result: dict[str, Any] = {}
    reasons = []
    for check in CHECKS:
        limit = parameters.limit(check)
        if limit is None:
            continue
        value, step, reason = MEASURES[check](run, limit)
        result.update({check: value, f"{check}_ok": step is None, f"{check}_step": step})
        if reason:
            reasons.append(reason)
    if parameters.max_tool_ms is not None:
        result["untimed_calls"] = sum(call.duration_ms is None for call in run.calls)
    return {"success": not reasons, "reason": "; ".join(reasons), **result}


Measure = tuple[float, int | None, str]


def _calls(run: AgentRun, limit: float) -> Measure:
    if len(run.calls) <= limit:
        return len(run.calls), None, ""
    step = int(limit) + 1
    name = run.calls[step - 1].name
    return len(run.calls), step, f"step {step}: call {step} ({name}) is over the limit of {limit}"


def _tool_ms(run: AgentRun, limit: float) -> Measure:
    if run.calls and all(call.duration_ms is None for call in run.calls):
        raise EvaluationError(
            f"max_tool_ms needs tool durations from the trace, and none of the "
            f"{len(run.calls)} tool calls has one (no tool spans matched them).",
            code="missing_trace",
        )
    total, step, reason = 0.0, None, ""
    for number, call in enumerate(run.calls, 1):
        total += call.duration_ms or 0.0
        if step is None and total > limit:
            step = number
            reason = (
                f"step {number}: {call.name} brings tool time to {_ms(total)} ms, over the "
                f"limit of {_ms(limit)} ms"
            )
    return round(total, 3), step, reason


def _counted(what: str, flag: Callable) -> Callable[[AgentRun, float], Measure]:
    def measure(run: AgentRun, limit: float) -> Measure:
        steps = [number for number, call in enumerate(run.calls, 1) if flag(call)]
        if len(steps) <= limit:
            return len(steps), None, ""
        step = steps[int(limit)]
        name = run.calls[step - 1].name
        reason = f"step {step}: {what} {int(limit) + 1} ({name}) is over the limit of {limit}"
        return len(steps), step, reason

    return measure


def _ms(value: float) -> str:
    return f"{value:,.1f}".removesuffix(".0")


MEASURES = {
    "calls": _calls,
    "tool_ms": _tool_ms,
    "retries": _counted("retry", lambda call: call.retry),
    "failed_calls": _counted("failed call", lambda call: call.failed),
}


kind = register(
    Kind(
        key="step_budget",
        name="Step budget",
        description="Succeeds when the agent stays within a number of tool calls, total tool time "
        "(from the trace), retries and failed calls; names the step that broke each limit.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=outputs_schema,
        category="agent",
        presets=[
            PresetSpec(
                "max_10_calls",
                "No more than 10 tool calls",
                {"max_calls": 10},
                "The agent made at most 10 tool calls.",
            ),
            PresetSpec(
                "tool_time_30s",
                "Tool time under 30 seconds",
                {"max_tool_ms": 30000},
                "The tool spans took at most 30 seconds together.",
            ),
            PresetSpec(
                "no_failed_calls",
                "No failed calls, at most 2 retries",
                {"max_failed_calls": 0, "max_retries": 2},
                "Every tool call succeeded, and no tool was retried more than twice in all.",
            ),
        ],
    )
)
