"""Reading traces: the trace dict evaluators receive (DOMAIN.md), trace lists and filters, and the
invocation trace of a scenario."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from evalsite.models import Project
from runs.models import Result, Span, Trace
from runs.traces.spans import iso
from runs.traces.tree import span_tree

OUTPUTS_PATH = "attributes.ag.data.outputs"  # inside a root span: what the application returned


def _readable(attributes: dict) -> dict:
    """The stored attributes with ag's keys back in the documented order (jsonb reorders)."""
    ag = attributes.get("ag")
    if not isinstance(ag, dict):
        return attributes
    ag = _keys_first(ag, ("data", "metrics", "meta"))
    if isinstance(ag.get("data"), dict):
        ag["data"] = _keys_first(ag["data"], ("inputs", "outputs", "internals"))
    if isinstance(metrics := ag.get("metrics"), dict):
        metrics = ag["metrics"] = _keys_first(metrics, ("unit", "acc"))
        for scope in ("unit", "acc"):
            if isinstance(groups := metrics.get(scope), dict):
                metrics[scope] = {
                    group: _keys_first(values, ("prompt", "completion", "total"))
                    for group, values in _keys_first(
                        groups, ("duration", "tokens", "costs")
                    ).items()
                }
    return {"ag": ag, **{key: value for key, value in attributes.items() if key != "ag"}}


def _keys_first(value: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(value, dict):
        return value
    return {**{key: value[key] for key in keys if key in value}, **value}


def trace_dict(trace: Trace) -> dict[str, Any]:
    """The trace as evaluators receive it (DOMAIN.md): root spans keyed by span id, each with
    its children nested. One query. Spans whose parent never arrived are roots, after the
    real root; their ``parent_id`` still names the missing parent."""
    return trace_dicts([trace])[trace.pk]


def trace_dicts(traces: Iterable[Trace]) -> dict[int, dict[str, Any]]:
    """``trace_dict`` of many traces, by trace pk, in one query for all their spans."""
    traces = list(traces)
    spans_of: dict[int, list[Span]] = defaultdict(list)
    for span in trace_spans(traces).order_by():
        spans_of[span.trace_id].append(span)
    return {t.pk: {"trace_id": t.trace_id, "spans": _nested(spans_of[t.pk])} for t in traces}


def trace_spans(traces: Iterable[Trace]) -> QuerySet[Span]:
    """The spans of these traces, read from their days' partitions only: a span's
    ``trace_time`` is its trace's ``created_at``, the spans table's partition key, so naming
    it lets PostgreSQL skip every other day (docs/traces.md, "Partitions and retention")."""
    traces = list(traces)
    return Span.objects.filter(
        trace_id__in=[t.pk for t in traces], trace_time__in={t.created_at for t in traces}
    )


def trace_roots(traces: Iterable[Trace], *keys: str) -> dict[int, dict[str, Any]]:
    """Each trace's root span, by trace pk, as ``{"span_id", "status", "status_message"}`` and
    the root's ``ag.data.<key>`` for each of ``keys`` (``inputs``, ``outputs``): one query that
    reads those keys out of the attributes in PostgreSQL, so neither the rest of a root's
    attributes nor the trace's other spans leave the database. The root is the trace's
    ``root_span_id``, else its earliest span without a parent (``trace_dict`` puts it first)."""
    traces = list(traces)
    root_of = {t.pk: t.root_span_id for t in traces}
    paths = [f"attributes__ag__data__{key}" for key in keys]
    rows = (
        trace_spans(traces)
        .filter(parent_id="")
        .order_by("trace_id", "start_time", "id")
        .values_list("trace_id", "span_id", "status", "status_message", *paths)
    )
    found: dict[int, dict[str, Any]] = {}
    for trace_pk, span_id, status, message, *values in rows:
        if trace_pk not in found or span_id == root_of[trace_pk]:
            root = {"span_id": span_id, "status": status, "status_message": message}
            found[trace_pk] = {**root, **dict(zip(keys, values, strict=True))}
    return found


def _nested(spans: list[Span]) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {}
    roots: dict[str, Any] = {}
    for span, parent in span_tree(spans):
        node = nodes[span.span_id] = {
            "span_id": span.span_id,
            "parent_id": span.parent_id or None,
            "name": span.name,
            "kind": span.kind,
            "start_time": iso(span.start_time),
            "end_time": iso(span.end_time),
            "status": span.status,
            "status_message": span.status_message or None,
            "attributes": _readable(span.attributes),
            "children": {},
        }
        siblings = roots if parent is None else nodes[parent.span_id]["children"]
        siblings[span.span_id] = node
    return roots


def trace_list(
    *,
    project: Project,
    name: str = "",
    search: str = "",
    status: str = "",
    source: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    attributes: dict[str, str] | None = None,
) -> QuerySet[Trace]:
    """Traces of the project, filtered. ``attributes`` maps a dotted path to a value: a trace
    matches when any of its spans has it, read as nested keys (``ag.meta.env``) or as one flat
    OpenTelemetry key (``gen_ai.request.model``); ``"3"`` matches the string and the number."""
    traces = Trace.objects.for_project(project)
    if name:
        traces = traces.filter(name=name)
    if search:
        traces = traces.filter(Q(name__icontains=search) | Q(trace_id=search))
    if status:
        traces = traces.filter(status=status)
    if source:
        traces = traces.filter(source=source)
    if since:
        traces = traces.filter(start_time__gte=since)
    if until:
        traces = traces.filter(start_time__lt=until)
    for path, value in (attributes or {}).items():
        spans = Span.objects.filter(
            trace_id=OuterRef("pk"), trace_time=OuterRef("created_at")
        ).filter(_attribute_q(path, value))
        traces = traces.filter(Exists(spans))
    return traces


def _attribute_q(path: str, raw: str) -> Q:
    values: list[Any] = [raw]
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw
    if parsed != raw and not isinstance(parsed, dict | list):
        values.append(parsed)
    query = Q()
    for value in values:
        nested: Any = value
        for part in reversed(path.split(".")):
            nested = {part: nested}
        query |= Q(attributes__contains=nested) | Q(attributes__contains={path: value})
    return query


def scenario_invocation_trace(scenario, repeat: int = 0) -> Trace | None:
    """The trace a scenario's evaluators read: its invocation's (batch runs), else the trace it
    evaluates (online runs), else None (nothing invoked yet)."""
    result = (
        Result.objects.filter(scenario=scenario, repeat_idx=repeat, trace__isnull=False)
        .select_related("trace")
        .first()
    )
    if result is not None:
        return result.trace
    return scenario.trace if scenario.trace_id else None
