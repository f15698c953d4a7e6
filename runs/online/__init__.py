"""Online evaluation: rules over production traces (docs/online.md)."""

from runs.online.backfill import online_backfill, online_backfill_progress
from runs.online.evaluate import (
    online_buckets,
    online_dispatch,
    online_evaluate_ids,
    online_evaluate_traces,
    online_unit_process,
    online_units_plan,
)
from runs.online.rules import (
    BUCKET_CHOICES,
    ONLINE_SOURCES,
    RuleFilter,
    filter_parse,
    online_rule_create,
    online_rule_delete,
    online_rule_matches,
    online_rule_pause,
    online_rule_resume,
    online_rule_update,
    online_sampled,
    rule_candidates,
    rule_slug,
    traces_matching,
    traces_sampled,
)

__all__ = [
    "BUCKET_CHOICES",
    "ONLINE_SOURCES",
    "RuleFilter",
    "filter_parse",
    "online_backfill",
    "online_backfill_progress",
    "online_buckets",
    "online_dispatch",
    "online_evaluate_ids",
    "online_evaluate_traces",
    "online_rule_create",
    "online_rule_delete",
    "online_rule_matches",
    "online_rule_pause",
    "online_rule_resume",
    "online_rule_update",
    "online_sampled",
    "online_unit_process",
    "online_units_plan",
    "rule_candidates",
    "rule_slug",
    "traces_matching",
    "traces_sampled",
]
