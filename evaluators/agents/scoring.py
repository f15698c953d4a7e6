"""The agent score's formulas (docs/agent-evaluators.md shows each with a worked example).

- error-free execution = succeeded calls / calls - retry_penalty x retries
  - failure_penalty x failed calls, floored at 0; 1.0 for a run without calls;
- context efficiency: a step function of the tokens the run's context took;
- goal completion and plan correctness, when no model scores them: the heuristics below;
- total = the weighted sum of the four.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from evaluators.agents.extract import AgentRun, ToolCall

# (at most this many tokens, score), the last step's score for anything larger.
CONTEXT_STEPS: tuple[tuple[int, float], ...] = (
    (32_000, 1.0),
    (64_000, 0.8),
    (128_000, 0.6),
    (256_000, 0.4),
)
CONTEXT_FLOOR = 0.2
# Plan heuristic scores (the seed's): no calls, too many calls, a planning step, otherwise.
PLAN_NONE, PLAN_TOO_LONG, PLAN_WITH_PLANNING, PLAN_PLAIN = 0.0, 0.3, 0.7, 0.5
DIGITS = 4


def error_free(calls: Sequence[ToolCall], retry_penalty: float, failure_penalty: float) -> float:
    if not calls:
        return 1.0
    failed = sum(call.failed for call in calls)
    retries = sum(call.retry for call in calls)
    ratio = (len(calls) - failed) / len(calls)
    return max(0.0, ratio - retry_penalty * retries - failure_penalty * failed)


def estimated_tokens(chars: int) -> int:
    """Characters / 4, rounded up: n tokens means at most 4n characters."""
    return math.ceil(chars / 4)


def context_efficiency(
    tokens: int, steps: Sequence[Sequence[float]] = CONTEXT_STEPS, floor: float = CONTEXT_FLOOR
) -> float:
    for limit, score in steps:
        if tokens <= limit:
            return score
    return floor


def context_tokens(run: AgentRun, source: str) -> tuple[int, str]:
    """(tokens, where they came from): the trace's counts when asked for and present, else the
    estimate from the history's characters."""
    if source == "trace_peak" and run.tokens_peak is not None:
        return run.tokens_peak, "trace_peak"
    if source == "trace_total" and run.tokens_total is not None:
        return run.tokens_total, "trace_total"
    return estimated_tokens(run.chars), "estimate"


def completion(
    run: AgentRun, completion_tools: Sequence[str], final_message_completes: bool
) -> str | None:
    """How the run finished (for the reasoning), or None when it did not."""
    names = set(completion_tools)
    for number, call in enumerate(run.calls, 1):
        if call.name in names and not call.failed:
            return f"the completion tool {call.name} succeeded at step {number}"
    if final_message_completes and run.final_answer:
        return "the run ends with the assistant's answer"
    return None


def heuristic_plan(
    calls: Sequence[ToolCall], planning_tools: Sequence[str], max_plan_length: int
) -> tuple[float, str]:
    if not calls:
        return PLAN_NONE, "no tool calls, so no plan"
    if len(calls) > max_plan_length:
        return PLAN_TOO_LONG, f"{len(calls)} tool calls, more than {max_plan_length}"
    names = set(planning_tools)
    planner = next((call.name for call in calls if call.name in names), None)
    if planner:
        return PLAN_WITH_PLANNING, f"{len(calls)} tool calls with a planning step ({planner})"
    return PLAN_PLAIN, f"{len(calls)} tool calls, no planning step"


def weighted_total(scores: Sequence[float], weights: Sequence[float]) -> float:
    return rounded(sum(score * weight for score, weight in zip(scores, weights, strict=True)))


def rounded(value: float) -> float:
    return round(value, DIGITS)
