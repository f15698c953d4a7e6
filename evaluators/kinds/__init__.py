"""Every evaluator kind, registered on import. Add a new kind's module here."""

from evaluators.kinds import (  # noqa: F401
    code,
    contains_json,
    exact_match,
    feedback,
    human,
    json_diff,
    json_field_match,
    json_schema,
    numeric_match,
    regex,
    similarity,
    trace_budget,
    webhook,
)
from evaluators.kinds.base import REGISTRY, Kind, get_kind

__all__ = ["REGISTRY", "Kind", "get_kind"]
