"""The base of the agent kinds (agent_score, step_budget, tool_call_f1, trajectory_match): the
settings they share, where the run is and where its reference trajectory is."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from evaluators.agents.extract import AUTO, AgentRun, agent_run, check_path
from evaluators.agents.matching import ArgumentsMode, Expected, Matcher, reference_calls
from evaluators.kinds.base import KindParameters, ui
from evaluators.normalize import EvaluationError


class AgentRunParameters(KindParameters):
    messages_path: str = Field(
        AUTO,
        description="Where the agent's messages are: auto (outputs, outputs.messages, "
        "inputs.messages, then the trace's root span: trace.ag.data.outputs.messages ...), or a "
        "dotted path starting with outputs, inputs or trace.",
        json_schema_extra=ui(label="Messages path"),
    )
    use_trace: bool = Field(
        True,
        description="Read the trace's tool spans: their durations and failures, and the run "
        "itself when there are no messages.",
        json_schema_extra=ui(advanced=True),
    )

    @field_validator("messages_path")
    @classmethod
    def _valid_path(cls, path: str) -> str:
        return check_path(path.strip())

    def agent_run(self, inputs: dict[str, Any], outputs: Any, trace: Any) -> AgentRun:
        return agent_run(
            inputs=inputs,
            outputs=outputs,
            trace=trace,
            messages_path=self.messages_path,
            use_trace=self.use_trace,
        )


class ReferenceParameters(AgentRunParameters):
    correct_answer_key: str = Field(
        "expected_trajectory",
        description="The testcase column that holds the reference trajectory: tool names, "
        '{"name", "arguments"} objects, or a message history (JSON text is read too).',
        json_schema_extra=ui(ground_truth_key=True, label="Reference trajectory column"),
    )
    reference: list[Any] | None = Field(
        None,
        description="A reference trajectory given here, used instead of the testcase column "
        '(so it works online, without a testcase): ["search", "answer"] or '
        '[{"name": "search", "arguments": {"q": "..."}}].',
        json_schema_extra=ui(widget="json"),
    )
    arguments: ArgumentsMode = Field(
        "exact",
        description="How arguments are compared: exact, subset (the reference's arguments, "
        "extra ones allowed) or ignore (tool names only).",
        json_schema_extra=ui(widget="choice"),
    )
    tool_arguments: dict[str, ArgumentsMode] = Field(
        default_factory=dict,
        description='Per-tool argument comparison, e.g. {"search": "subset", "now": "ignore"}.',
        json_schema_extra=ui(advanced=True, widget="json"),
    )

    @field_validator("reference")
    @classmethod
    def _readable_reference(cls, reference: list[Any] | None) -> list[Any] | None:
        if reference is not None:
            try:
                reference_calls(reference, "in the reference setting")
            except EvaluationError as exc:
                raise ValueError(exc.message.removesuffix("."))
        return reference

    def expected(self, inputs: dict[str, Any]) -> list[Expected]:
        if self.reference is not None:
            return reference_calls(self.reference, "in the reference setting")
        key = self.correct_answer_key
        if key not in inputs:
            columns = ", ".join(sorted(inputs)) or "none"
            raise EvaluationError(
                f"The reference trajectory column {key!r} is not in the inputs (columns: "
                f"{columns}). Set correct_answer_key to the testcase column that holds it, or "
                f"give the trajectory in the reference setting (online runs have no testcase).",
                code="missing_ground_truth",
            )
        return reference_calls(inputs[key], f"in column {key!r}")

    def matcher(self) -> Matcher:
        return Matcher(self.arguments, self.tool_arguments)
