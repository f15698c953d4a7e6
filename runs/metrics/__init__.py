"""Metrics: outputs schemas to metric keys, statistics in SQL, mappings, schema inference and
backfill (docs/metrics.md)."""

from runs.metrics.backfill import (
    affected_runs,
    backfill_candidates,
    backfill_progress,
    disagreeing_outputs,
    run_mappings_and_metrics_refresh,
    schema_backfill_apply,
    schema_validate,
)
from runs.metrics.mappings import mappings_build, mappings_refresh_deferred
from runs.metrics.packs import indexes_decode, pack_decode, runs_unpacked, values_pack
from runs.metrics.schema import (
    OUTPUTS_PREFIX,
    MetricSpec,
    inferred_schema,
    non_null_type,
    revision_outputs_schema,
    schema_infer,
    schema_metrics,
)
from runs.metrics.stats import (
    buckets_refresh,
    refresh_lock,
    run_refresh,
    run_stats,
    scenarios_refresh,
    step_specs,
)

__all__ = [
    "OUTPUTS_PREFIX",
    "MetricSpec",
    "affected_runs",
    "backfill_candidates",
    "backfill_progress",
    "buckets_refresh",
    "disagreeing_outputs",
    "indexes_decode",
    "inferred_schema",
    "mappings_build",
    "mappings_refresh_deferred",
    "non_null_type",
    "pack_decode",
    "refresh_lock",
    "revision_outputs_schema",
    "run_mappings_and_metrics_refresh",
    "run_refresh",
    "run_stats",
    "runs_unpacked",
    "scenarios_refresh",
    "schema_backfill_apply",
    "schema_infer",
    "schema_metrics",
    "schema_validate",
    "step_specs",
    "values_pack",
]
