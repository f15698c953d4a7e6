"""Agent score: how well an agent run went, from its messages and the trace's tool spans.

Four categories, each 0..1, and their weighted total (defaults 0.40 / 0.30 / 0.15 / 0.15):
goal completion, plan correctness, error-free execution, context efficiency. The formulas are in
``evaluators/agents/scoring.py`` and ``docs/agent-evaluators.md``.

Goal and plan come from one structured-output call each to a model connection of the project
when ``connection`` is set, from heuristics otherwise. A judge that fails falls back to the
heuristics, and ``details.fallback_reason`` says why.

A session is scored as one conversation (``evaluate_sessions``): the calls of every turn in
order, each step marked with its turn, the conversation's messages for goal and plan, and the
tokens of all turns (``evaluators.agents.extract.session_run``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from evaluators.agents import scoring
from evaluators.agents.extract import AgentRun, ToolCall, plain, session_run
from evaluators.judge.batch import structured_call
from evaluators.kinds.agent_base import AgentRunParameters
from evaluators.kinds.base import Kind, PresetSpec, register, ui
from evaluators.normalize import Raw

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"
COMPLETION_TOOLS = ["done", "done_tool", "finish", "final_answer"]
PLANNING_TOOLS = ["plan", "planner", "planner_tool", "create_plan", "classification_tool"]


class Parameters(AgentRunParameters):
    threshold: float = Field(
        0.7, ge=0, le=1, description="Success when the weighted total is at least this."
    )
    goal_weight: float = Field(0.40, ge=0, le=1, description="Weight of goal completion.")
    plan_weight: float = Field(0.30, ge=0, le=1, description="Weight of plan correctness.")
    errors_weight: float = Field(0.15, ge=0, le=1, description="Weight of error-free execution.")
    context_weight: float = Field(0.15, ge=0, le=1, description="Weight of context efficiency.")
    connection: str | None = Field(
        None,
        description="A model connection of the project (slug or id) that scores goal completion "
        "and plan correctness. Empty: heuristics score them.",
        json_schema_extra=ui(label="Model connection"),
    )
    completion_tools: list[str] = Field(
        default_factory=lambda: list(COMPLETION_TOOLS),
        description="Tools whose successful call means the agent finished its task.",
    )
    final_message_completes: bool = Field(
        True,
        description="A run that ends with an assistant answer (no tool calls) finished too. "
        "Off: only a completion tool counts.",
    )
    planning_tools: list[str] = Field(
        default_factory=lambda: list(PLANNING_TOOLS),
        description="Tools that are a planning step (plan heuristic).",
        json_schema_extra=ui(advanced=True),
    )
    max_plan_length: int = Field(
        20,
        ge=1,
        description="More tool calls than this scores the plan 0.3 (plan heuristic).",
        json_schema_extra=ui(advanced=True),
    )
    completed_score: float = Field(
        0.8,
        ge=0,
        le=1,
        description="Goal completion when the run finished (goal heuristic).",
        json_schema_extra=ui(advanced=True),
    )
    incomplete_score: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Goal completion when it did not (goal heuristic).",
        json_schema_extra=ui(advanced=True),
    )
    retry_penalty: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Subtracted from error-free execution per retry.",
        json_schema_extra=ui(advanced=True),
    )
    failure_penalty: float = Field(
        0.10,
        ge=0,
        le=1,
        description="Subtracted from error-free execution per failed call.",
        json_schema_extra=ui(advanced=True),
    )
    token_count: Literal["trace_peak", "trace_total", "estimate"] = Field(
        "trace_peak",
        description="Tokens for context efficiency: the largest single LLM call in the trace "
        "(trace_peak), the whole trace (trace_total), or characters / 4 of the messages "
        "(estimate, also used when the trace has no token counts).",
        json_schema_extra=ui(advanced=True, widget="choice"),
    )
    context_steps: list[tuple[int, float]] = Field(
        default_factory=lambda: list(scoring.CONTEXT_STEPS),
        description="[at most this many tokens, score] pairs, smallest first.",
        json_schema_extra=ui(advanced=True, widget="json"),
    )
    context_floor: float = Field(
        scoring.CONTEXT_FLOOR,
        ge=0,
        le=1,
        description="Context efficiency beyond the last step.",
        json_schema_extra=ui(advanced=True),
    )
    judge_messages: int = Field(
        5,
        ge=1,
        le=50,
        description="How many of the last messages the model reads to judge goal completion.",
        json_schema_extra=ui(advanced=True),
    )
    include_trajectory: bool = Field(
        True,
        description="Record the extracted steps in details.trajectory.",
        json_schema_extra=ui(advanced=True),
    )

    @field_validator("context_steps")
    @classmethod
    def _ascending(cls, steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
        limits = [limit for limit, _ in steps]
        if limits != sorted(set(limits)):
            raise ValueError("token limits must increase from one step to the next")
        if any(not 0 <= score <= 1 for _, score in steps):
            raise ValueError("scores must be between 0 and 1")
        return steps

    @field_validator("connection")
    @classmethod
    def _blank_is_none(cls, connection: str | None) -> str | None:
        return (connection or "").strip() or None

    @model_validator(mode="after")
    def _weights_sum_to_one(self) -> Parameters:
        total = sum(self.weights())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"the four weights must sum to 1; goal {self.goal_weight} + plan "
                f"{self.plan_weight} + errors {self.errors_weight} + context "
                f"{self.context_weight} = {round(total, 6)}"
            )
        return self

    def weights(self) -> tuple[float, float, float, float]:
        return (self.goal_weight, self.plan_weight, self.errors_weight, self.context_weight)


UNIT = {"type": "number", "minimum": 0, "maximum": 1}
COUNT = {"type": "integer", "minimum": 0}
OUTPUTS = {
    "type": "object",
    "properties": {
        "score": UNIT,
        "success": {"type": "boolean"},
        "goal_completion": UNIT,
        "plan_correctness": UNIT,
        "error_free_execution": UNIT,
        "context_efficiency": UNIT,
        "details": {
            "type": "object",
            "properties": {
                "tool_calls": COUNT,
                "failed_calls": COUNT,
                "retries": COUNT,
                "tokens": COUNT,
                "token_source": {
                    "type": "string",
                    "enum": ["trace_peak", "trace_total", "estimate"],
                },
                "method": {"type": "string", "enum": ["llm", "heuristic"]},
                "fallback_reason": {"type": ["string", "null"]},
                "reasoning": {"type": "string"},
                "trajectory": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["tool_calls", "failed_calls", "retries", "tokens", "method", "reasoning"],
        },
    },
    "required": [
        "score",
        "success",
        "goal_completion",
        "plan_correctness",
        "error_free_execution",
        "context_efficiency",
        "details",
    ],
}


def evaluate(
    parameters: Parameters, inputs: dict, outputs: Any, trace, project=None
) -> dict[str, Any]:
    return score_run(parameters, parameters.agent_run(inputs, outputs, trace), project)


def evaluate_session(
    parameters: Parameters, inputs: dict, outputs: Any, session: dict, project=None
) -> dict[str, Any]:
    run = session_run(
        session=session, messages_path=parameters.messages_path, use_trace=parameters.use_trace
    )
    return score_run(parameters, run, project)


def score_run(parameters: Parameters, run: AgentRun, project) -> dict[str, Any]:
    """The four categories and their total for an extracted run (one trace or a session)."""
    goal, plan, method, fallback, judged = _goal_and_plan(parameters, run, project)
    errors = scoring.error_free(run.calls, parameters.retry_penalty, parameters.failure_penalty)
    tokens, source = scoring.context_tokens(run, parameters.token_count)
    context = scoring.context_efficiency(tokens, parameters.context_steps, parameters.context_floor)
    scores = [scoring.rounded(x) for x in (goal, plan, errors, context)]
    total = scoring.weighted_total(scores, parameters.weights())
    details: dict[str, Any] = {
        "tool_calls": len(run.calls),
        "failed_calls": run.failed_calls,
        "retries": run.retries,
        "tokens": tokens,
        "token_source": source,
        "method": method,
        "fallback_reason": fallback,
        "reasoning": " ".join(
            [*judged, _errors_reason(run, scores[2]), _context_reason(tokens, source, scores[3])]
        ),
    }
    if parameters.include_trajectory:
        details["trajectory"] = run.steps()
    return {
        "score": total,
        "success": total >= parameters.threshold,
        "goal_completion": scores[0],
        "plan_correctness": scores[1],
        "error_free_execution": scores[2],
        "context_efficiency": scores[3],
        "details": details,
    }


def _goal_and_plan(
    parameters: Parameters, run: AgentRun, project
) -> tuple[float, float, str, str | None, list[str]]:
    """(goal, plan, method, fallback reason, reasoning sentences)."""
    if not parameters.connection:
        return _heuristics(parameters, run, None)
    last = (run.messages or [])[-parameters.judge_messages :]
    try:
        judged = _llm_scores(parameters.connection, run.task, last, run.calls, project)
    except JudgeFailed as exc:
        return _heuristics(parameters, run, f"the judge failed: {exc}")
    reasons = [
        f"Goal {judged['goal_completion']}: {judged['goal_reasoning']}",
        f"Plan {judged['plan_correctness']}: {judged['plan_reasoning']}",
    ]
    return judged["goal_completion"], judged["plan_correctness"], "llm", None, reasons


def _heuristics(
    parameters: Parameters, run: AgentRun, fallback: str | None
) -> tuple[float, float, str, str | None, list[str]]:
    finished = scoring.completion(
        run, parameters.completion_tools, parameters.final_message_completes
    )
    goal = parameters.completed_score if finished else parameters.incomplete_score
    plan, plan_reason = scoring.heuristic_plan(
        run.calls, parameters.planning_tools, parameters.max_plan_length
    )
    if not finished:
        finished = "no completion tool succeeded" + (
            " and the run does not end with an answer" if parameters.final_message_completes else ""
        )
    reasons = [f"Goal {goal}: {finished}.", f"Plan {plan}: {plan_reason}."]
    if fallback:
        reasons.insert(0, f"Heuristics scored goal and plan ({fallback}).")
    return goal, plan, "heuristic", fallback, reasons


def _context_reason(tokens: int, source: str, score: float) -> str:
    return f"Context {score}: {tokens:,} tokens ({source.replace('_', ' ')})."


def _errors_reason(run: AgentRun, score: float) -> str:
    calls = len(run.calls)
    if not calls:
        return f"Errors {score}: no tool calls."
    ok = calls - run.failed_calls
    return (
        f"Errors {score}: {ok} of {calls} calls succeeded, {run.retries} "
        f"{'retry' if run.retries == 1 else 'retries'}, {run.failed_calls} failed."
    )


# --- the model judge ----------------------------------------------------------------------------


class JudgeFailed(Exception):
    """The model connection did not give a usable answer; the heuristics take over."""


JUDGE_SCHEMA = {
    "type": "object",
    "properties": {  # reasoning first: the model explains before it scores
        "reasoning": {"type": "string"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["reasoning", "score"],
    "additionalProperties": False,
}
GOAL_PROMPT = """You grade whether an AI agent completed its task.

Task:
{task}

The last messages of the run:
{messages}

Did the agent complete the task? Score 1 = fully completed, 0.5 = partially, 0 = not at all.
Answer with a one-sentence reasoning and a score between 0 and 1."""
PLAN_PROMPT = """You grade the plan an AI agent followed.

Task:
{task}

The tools it called, in order ("failed" marks calls that failed):
{tools}

Was this a correct and efficient plan for the task? Score 1 = very good, 0.5 = acceptable,
0 = wrong or very wasteful. Answer with a one-sentence reasoning and a score between 0 and 1."""
PREVIEW = 500


def _llm_scores(
    connection_ref: str, task: str, messages: list[dict], tools: list[ToolCall], project
) -> dict[str, Any]:
    """Goal and plan from one structured-output call each on the project's model connection.

    Returns ``{"goal_completion", "goal_reasoning", "plan_correctness", "plan_reasoning"}``;
    raises ``JudgeFailed`` when the call fails or answers something unusable.
    """
    if project is None:
        raise JudgeFailed("no project to find the model connection in")
    prompts = {
        "goal": GOAL_PROMPT.format(task=_clip(task), messages=_transcript(messages)),
        "plan": PLAN_PROMPT.format(task=_clip(task), tools=_tool_sequence(tools)),
    }
    scores: dict[str, Any] = {}
    for category, prompt in prompts.items():
        try:
            answer = structured_call(
                project=project,
                connection=connection_ref,
                messages=[{"role": "user", "content": prompt}],
                schema=JUDGE_SCHEMA,
                name=f"agent_{category}",
            )
        except Exception as exc:  # network, provider or parsing: each means "no usable answer"
            raise JudgeFailed(f"{category}: {exc or type(exc).__name__}")
        score, reasoning = _judged(answer, category)
        key = "goal_completion" if category == "goal" else "plan_correctness"
        scores[key], scores[f"{category}_reasoning"] = score, reasoning
    return scores


def _judged(answer: Any, category: str) -> tuple[float, str]:
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except ValueError:
            raise JudgeFailed(f"{category}: the answer is not JSON: {answer[:200]!r}")
    score = answer.get("score") if isinstance(answer, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise JudgeFailed(f"{category}: expected a score between 0 and 1, got {answer!r:.200}")
    return float(score), str(answer.get("reasoning") or "").strip()


def _clip(text: str) -> str:
    return text if len(text) <= PREVIEW * 4 else text[: PREVIEW * 4] + "…"


def _transcript(messages: list[dict]) -> str:
    lines = []
    for message in messages:
        text = plain(message.get("content"))
        calls = [
            (c.get("function") or c).get("name", "?")
            for c in message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        if calls:
            text += f" [calls {', '.join(calls)}]"
        lines.append(f"{message.get('role')}: {text[:PREVIEW]}")
    return "\n".join(lines) or "(no messages)"


def _tool_sequence(tools: list[ToolCall]) -> str:
    names = [f"{call.name}{' (failed)' if call.failed else ''}" for call in tools]
    return " → ".join(names) or "(no tool calls)"


# --- batch entry point, so the judge knows the project ----------------------------------------


def evaluate_many(parameters: Parameters, items: list[tuple], context: dict[str, Any]) -> list[Raw]:
    return _each(evaluate, parameters, items, context)


def evaluate_sessions(
    parameters: Parameters, items: list[tuple], context: dict[str, Any]
) -> list[Raw]:
    return _each(evaluate_session, parameters, items, context)


def _each(score, parameters: Parameters, items: list[tuple], context: dict[str, Any]) -> list[Raw]:
    project = context.get("project")
    raws = []
    for inputs, outputs, trace_or_session in items:
        started = time.perf_counter()
        try:
            value = score(parameters, inputs, outputs, trace_or_session, project)
        except Exception as exc:
            raws.append(Raw(error=exc, duration_ms=_ms(started)))
        else:
            raws.append(Raw(value=value, duration_ms=_ms(started)))
    return raws


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _sample() -> dict[str, Any]:
    case = json.loads((EXAMPLES / "good_run.json").read_text())
    return {key: case[key] for key in ("inputs", "outputs", "trace")}


kind = register(
    Kind(
        key="agent_score",
        name="Agent score",
        description="Scores an agent run from its messages and tool spans: goal completion, plan "
        "correctness, error-free execution and context efficiency, and their weighted total.",
        parameters=Parameters,
        evaluate=evaluate,
        evaluate_many=evaluate_many,
        evaluate_sessions=evaluate_sessions,
        outputs=OUTPUTS,
        category="agent",
        presets=[
            PresetSpec(
                "agent_default",
                "Agent score",
                {},
                "Weights 0.40 / 0.30 / 0.15 / 0.15, success at a total of 0.7.",
            ),
            PresetSpec(
                "strict_completion",
                "Agent score, strict completion",
                {"final_message_completes": False, "threshold": 0.8},
                "Only a successful completion tool call (done, finish, final_answer) counts as "
                "finishing; success at 0.8.",
            ),
        ],
        extras={"sample": _sample()},
    )
)
