"""Tool call F1: precision, recall and F1 of the agent's tool calls against a reference.

Calls are paired one to one with reference steps (as many pairs as possible) by tool name, and
by arguments when ``arguments`` is exact or subset. Precision is the share of the agent's calls
that paired, recall the share of reference steps that did, ``score`` their F1. A side with
nothing in it counts as fully precise (no calls) or fully recalled (nothing expected).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from evaluators.agents.matching import ArgumentsMode, f1_scores
from evaluators.kinds.agent_base import ReferenceParameters
from evaluators.kinds.base import Kind, PresetSpec, register, ui

UNIT = {"type": "number", "minimum": 0, "maximum": 1}
COUNT = {"type": "integer", "minimum": 0}
NAMES = {"type": "array", "items": {"type": "string"}}


class Parameters(ReferenceParameters):
    arguments: ArgumentsMode = Field(
        "ignore",
        description="ignore: compare tool names only; exact or subset: arguments must match too.",
        json_schema_extra=ui(widget="choice"),
    )
    threshold: float = Field(0.5, ge=0, le=1, description="Success when F1 is at least this.")


OUTPUTS = {
    "type": "object",
    "properties": {
        "score": UNIT,
        "success": {"type": "boolean"},
        "precision": UNIT,
        "recall": UNIT,
        "matched": COUNT,
        "calls": COUNT,
        "expected": COUNT,
        "missing": NAMES,
        "unexpected": NAMES,
    },
    "required": ["score", "success", "precision", "recall", "matched", "calls", "expected"],
}


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> dict[str, Any]:
    expected = parameters.expected(inputs)
    run = parameters.agent_run(inputs, outputs, trace)
    scores = f1_scores(run.calls, expected, parameters.matcher())
    f1 = scores.pop("f1")
    return {"score": f1, "success": f1 >= parameters.threshold, **scores}


kind = register(
    Kind(
        key="tool_call_f1",
        name="Tool call F1",
        description="Precision, recall and F1 of the agent's tool calls against a reference "
        "trajectory, by tool name and optionally arguments.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=OUTPUTS,
        needs_ground_truth=True,
        category="agent",
        presets=[
            PresetSpec(
                "tool_names",
                "Tool names",
                {},
                "F1 of the tools called against expected_trajectory, names only.",
            ),
            PresetSpec(
                "tool_names_and_arguments",
                "Tool names and arguments",
                {"arguments": "subset", "threshold": 0.8},
                "A call counts when the reference's arguments match; success at F1 0.8.",
            ),
        ],
    )
)
