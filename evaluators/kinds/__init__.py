"""Every evaluator kind, registered on import. Add a new kind's module here, and to the
`kinds` independence contract in .importlinter."""

from evaluators.kinds import (  # noqa: F401
    agent_score,
    code,
    contains_json,
    exact_match,
    feedback,
    human,
    json_diff,
    json_field_match,
    json_schema,
    llm_judge,
    numeric_match,
    regex,
    similarity,
    step_budget,
    tool_call_f1,
    trace_budget,
    trajectory_match,
    webhook,
)
from evaluators.kinds.base import REGISTRY, Kind, get_kind

__all__ = ["REGISTRY", "Kind", "get_kind"]
