"""Trajectory match: the agent's tool calls against a reference trajectory.

Modes and argument comparison are described in ``evaluators/agents/matching.py``. The reference
comes from a testcase column (``correct_answer_key``, default ``expected_trajectory``) or from the
``reference`` setting, which needs no testcase and so works on online runs. The outputs say
which step failed (``failed_step``: the agent's step, from 1; ``reference_step``: the reference
step not met) and why.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from evaluators.agents.matching import Mode, match_trajectory
from evaluators.kinds.agent_base import ReferenceParameters
from evaluators.kinds.base import Kind, PresetSpec, register, ui

STEP = {"type": ["integer", "null"], "minimum": 1}


class Parameters(ReferenceParameters):
    mode: Mode = Field(
        "strict",
        description="strict: same calls, same order; unordered: same calls, any order; subset: "
        "no call outside the reference; superset: every reference step called; in_order: every "
        "reference step called in order, other calls between allowed.",
        json_schema_extra=ui(widget="choice"),
    )


OUTPUTS = {
    "type": "object",
    "properties": {
        "success": {"type": "boolean"},
        "failed_step": STEP,
        "reference_step": STEP,
        "reason": {"type": "string"},
        "calls": {"type": "integer", "minimum": 0},
        "expected": {"type": "integer", "minimum": 0},
    },
    "required": ["success", "failed_step", "reference_step", "reason", "calls", "expected"],
}


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    expected = parameters.expected(inputs)
    run = parameters.agent_run(inputs, outputs, trace)
    verdict = match_trajectory(run.calls, expected, parameters.mode, parameters.matcher())
    return {**verdict.outputs(), "calls": len(run.calls), "expected": len(expected)}


kind = register(
    Kind(
        key="trajectory_match",
        name="Trajectory match",
        description="Compares the agent's tool calls with a reference trajectory (strict, "
        "unordered, subset, superset or in order; arguments exact, subset or ignored) and names "
        "the step that failed.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=OUTPUTS,
        needs_ground_truth=True,
        category="agent",
        presets=[
            PresetSpec(
                "strict_reference",
                "Same calls as the reference, in order",
                {"mode": "strict"},
                "The testcase's expected_trajectory column, matched call by call.",
            ),
            PresetSpec(
                "reference_tools_any_order",
                "Reference tools, any order",
                {"mode": "unordered", "arguments": "ignore"},
                "The same tools as expected_trajectory, in any order; arguments not compared.",
            ),
            PresetSpec(
                "search_before_answer",
                "Must call search before answer",
                {"mode": "in_order", "arguments": "ignore", "reference": ["search", "answer"]},
                "search is called, and answer after it; other calls may come between. Needs no "
                "testcase, so it works online.",
            ),
        ],
    )
)
