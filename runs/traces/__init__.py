"""Traces in and out: native spans, OTLP and invocation records stored as spans; the trace dict
evaluators receive (DOMAIN.md); docs/traces.md describes it for users."""

from runs.traces.otlp import JSON, PROTOBUF, otlp_spans
from runs.traces.partitions import (
    Retention,
    partitions_ensure,
    retention_apply,
    retention_plan,
)
from runs.traces.reads import (
    OUTPUTS_PATH,
    scenario_invocation_trace,
    trace_dict,
    trace_dicts,
    trace_list,
    trace_roots,
    trace_spans,
)
from runs.traces.spans import Limits, TooLarge, limits, spans_valid
from runs.traces.store import otlp_ingest, trace_ingest, trace_record, traces_store

__all__ = [
    "JSON",
    "OUTPUTS_PATH",
    "PROTOBUF",
    "Limits",
    "Retention",
    "TooLarge",
    "limits",
    "otlp_ingest",
    "otlp_spans",
    "partitions_ensure",
    "retention_apply",
    "retention_plan",
    "scenario_invocation_trace",
    "spans_valid",
    "trace_dict",
    "trace_dicts",
    "trace_ingest",
    "trace_list",
    "trace_record",
    "trace_roots",
    "trace_spans",
    "traces_store",
]
