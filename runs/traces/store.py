"""Storing traces: native spans, OTLP and one-call invocation records, upserted on (trace, span_id)
so re-sending changes nothing and a trace may arrive in pieces, in any order. After each ingest
the touched traces are re-read whole and their ``acc`` metrics and summary recomputed."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project
from runs import queue
from runs.bulk import copy_insert, copy_rows
from runs.models import Span, Trace
from runs.traces.otlp import otlp_spans
from runs.traces.sessions import sessions_refresh
from runs.traces.spans import span_rows, spans_flatten
from runs.traces.tree import SUMMARY_FIELDS, acc_accumulate, span_tree, trace_summarise


def _store(
    project: Project, rows: list[tuple[str, Span]], source: str, *, fresh: bool = False
) -> list[Trace]:
    """Upsert the spans, then recompute acc and the summary of every touched trace.

    ``fresh`` promises that the traces are new (generated ids): nothing to lock or read.
    """
    incoming: dict[str, dict[str, Span]] = {}
    for trace_id, row in rows:
        incoming.setdefault(trace_id, {})[row.span_id] = row
    stored = {} if fresh else _lock_and_load(project, list(incoming))
    traces, writes, sessions = [], [], set()
    for trace_id, new_spans in incoming.items():
        trace, old_spans = stored.get(trace_id) or (None, {})
        trace = trace or Trace(project=project, trace_id=trace_id, source=source)
        sessions.add(trace.session_id)
        trace.spans_received = len(new_spans)
        before = {sid: span.attributes["ag"]["metrics"]["acc"] for sid, span in old_spans.items()}
        merged = {**old_spans, **new_spans}
        walked = span_tree(merged.values())
        acc_accumulate(walked)
        trace_summarise(trace, walked)
        sessions.add(trace.session_id)
        traces.append(trace)
        changed = [
            span
            for sid, span in old_spans.items()
            if sid not in new_spans and span.attributes["ag"]["metrics"]["acc"] != before[sid]
        ]
        for span in changed:
            span.pk = None  # rewritten through the same upsert as the new spans
        writes.append((trace, [*new_spans.values(), *changed]))
    Trace.objects.bulk_create(
        traces,
        update_conflicts=True,
        unique_fields=["project", "trace_id"],
        update_fields=SUMMARY_FIELDS,
    )
    for trace, trace_spans in writes:
        for span in trace_spans:
            span.trace_id = trace.pk
            span.trace_time = trace.created_at
    Span.objects.bulk_create(
        [span for _, trace_spans in writes for span in trace_spans],
        update_conflicts=True,
        unique_fields=["trace", "span_id", "trace_time"],
        update_fields=[
            "parent_id",
            "name",
            "kind",
            "start_time",
            "end_time",
            "status",
            "status_message",
            "attributes",
        ],
    )
    sessions_refresh(project.pk, sessions)
    return traces


def _lock_and_load(
    project: Project, trace_ids: list[str]
) -> dict[str, tuple[Trace, dict[str, Span]]]:
    # Spans of one trace often arrive in concurrent requests (one batch per service). A
    # transaction-scoped lock per trace makes each recompute see the spans committed before it;
    # keys are taken in sorted order so two requests never wait on each other in a circle.
    keys = sorted({_lock_key(project.pk, trace_id) for trace_id in trace_ids})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k", [keys])
    traces = {t.pk: t for t in Trace.objects.filter(project=project, trace_id__in=trace_ids)}
    if not traces:
        return {}
    spans: dict[int, dict[str, Span]] = defaultdict(dict)
    for span in Span.objects.filter(trace_id__in=list(traces)).order_by():
        spans[span.trace_id][span.span_id] = _loaded(span)
    return {trace.trace_id: (trace, spans[pk]) for pk, trace in traces.items()}


def _loaded(span: Span) -> Span:
    # A row written by other means may lack parts of "ag": it counts as having no metrics.
    attributes = span.attributes if isinstance(span.attributes, dict) else {}
    metrics = attributes.setdefault("ag", {}).setdefault("metrics", {})
    metrics.setdefault("unit", {})
    metrics.setdefault("acc", {})
    span.attributes = attributes
    return span


def _lock_key(project_id: int, trace_id: str) -> int:
    digest = hashlib.blake2b(f"trace:{project_id}:{trace_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def trace_ingest(*, project: Project, spans: list[dict], source: str = "api") -> list[Trace]:
    """Store spans in the native shape and return the touched traces (first-seen order).

    ``spans`` holds flat spans (each with ``trace_id``, ``span_id``, ``parent_id``, ``name``,
    ``kind``, ``start_time``, ``end_time``, ``status``, ``status_message``, ``attributes``)
    and/or nested trace dicts in the evaluator contract shape. Re-sending a span replaces it;
    a span whose parent has not arrived is kept. Each returned trace carries
    ``spans_received`` (its spans in this call). Raises ``InvalidInput`` naming the first bad
    field (``TooLarge`` for a size limit); nothing is stored then.
    """
    if not isinstance(spans, list):
        raise InvalidInput({"spans": ["must be a list of spans or traces"]})
    rows = span_rows(project, list(spans_flatten(spans)))
    with transaction.atomic():
        traces = _store(project, rows, source) if rows else []
    queue.online_dispatch(project.pk, [trace.pk for trace in traces if trace.pk])
    return traces


def otlp_ingest(*, project: Project, body: bytes, content_type: str) -> list[Trace]:
    """Store an OTLP/HTTP ``ExportTraceServiceRequest`` (protobuf or JSON encoding).

    GenAI and OpenInference attributes map into ``ag`` (docs/traces.md has the table); every
    other attribute is kept verbatim. Raises ``InvalidInput`` for a malformed body.
    """
    rows = span_rows(project, otlp_spans(body, content_type))
    with transaction.atomic():
        traces = _store(project, rows, "otlp") if rows else []
    queue.online_dispatch(project.pk, [trace.pk for trace in traces if trace.pk])
    return traces


def trace_record(
    *,
    project: Project,
    name: str,
    inputs: Any,
    outputs: Any,
    duration_ms: float | None = None,
    tokens: dict | int | None = None,
    costs: dict | float | None = None,
    start_time: datetime | None = None,
    status: str = "ok",
    error: str | dict | None = None,
    kind: str = "workflow",
    source: str = "invocation",
    children: list[dict] | None = None,
) -> Trace:
    """Record one invocation (an application call, a judge call) as a new single-root trace.

    ``tokens``/``costs`` are ``{prompt, completion, total}`` dicts or a total. ``children`` are
    native spans (``span_id``, ``parent_id`` and ``trace_id`` may be left out: they default to
    generated ids under the root). Two INSERTs, no reads: runs call this for every cell.
    """
    trace_id = uuid.uuid4().hex
    root_id = secrets.token_hex(8)
    if start_time is None:
        start_time = timezone.now() - timedelta(milliseconds=duration_ms or 0)
    end_time = start_time + timedelta(milliseconds=duration_ms) if duration_ms is not None else None
    unit: dict[str, Any] = {}
    if duration_ms is not None:
        unit["duration"] = {"total": duration_ms}
    if tokens is not None:
        unit["tokens"] = tokens if isinstance(tokens, dict) else {"total": tokens}
    if costs is not None:
        unit["costs"] = costs if isinstance(costs, dict) else {"total": costs}
    message = error.get("message", "") if isinstance(error, dict) else (error or "")
    meta = {"error": error} if isinstance(error, dict) else {}
    root = {
        "trace_id": trace_id,
        "span_id": root_id,
        "name": name,
        "kind": kind,
        "start_time": start_time,
        "end_time": end_time,
        "status": "error" if error else status,
        "status_message": message,
        "attributes": {
            "ag": {"data": {"inputs": inputs, "outputs": outputs}, "metrics": {"unit": unit}}
            | ({"meta": meta} if meta else {})
        },
    }
    rows = span_rows(project, [("span", root), *_child_spans(trace_id, root_id, children or [])])
    with transaction.atomic(savepoint=False):
        return _store(project, rows, source, fresh=True)[0]


def _child_spans(trace_id: str, root_id: str, children: list[dict]) -> list[tuple[str, Any]]:
    located = []
    for index, child in enumerate(children):
        loc = f"children[{index}]"
        if not isinstance(child, dict):
            located.append((loc, child))
            continue
        child = {"span_id": secrets.token_hex(8), "parent_id": root_id, **child}
        grandchildren = child.pop("children", None) or []
        located.append((loc, {**child, "trace_id": trace_id}))
        nested = _child_spans(trace_id, child["span_id"], list(grandchildren))
        located.extend((f"{loc}.{inner}", span) for inner, span in nested)
    return located


SPAN_COLUMNS = (
    "project_id", "trace_id", "span_id", "parent_id", "name", "kind", "start_time", "end_time",
    "status", "status_message", "attributes", "trace_time",
)  # fmt: skip


def traces_store(
    project: Project, trace_dicts: list[dict[str, Any]], source: str = "invocation"
) -> list[Trace]:
    """Store contract-shaped trace dicts in bulk (two COPYs for any number of traces); one Trace
    per dict, in order.

    Used for the traces evalsite records of invocations; they are complete, so no upsert and no
    re-aggregation is needed (ingestion of user traces goes through ``trace_ingest``). A trace
    id already stored (an application that also exported its trace, or returns one trace id on
    every call) is linked, not stored again.
    """
    now = timezone.now()
    ids = {data["trace_id"] for data in trace_dicts}
    known = {t.trace_id: t for t in Trace.objects.filter(project=project, trace_id__in=ids)}
    traces, spans, fresh = [], [], []
    for data in trace_dicts:
        if data["trace_id"] in known:
            traces.append(known[data["trace_id"]])
            continue
        roots = list(data["spans"].values())
        walked = list(_walk(roots))
        root = roots[0] if roots else {}
        acc = root.get("attributes", {}).get("ag", {}).get("metrics", {}).get("acc", {})
        trace = Trace(
            project=project,
            trace_id=data["trace_id"],
            name=root.get("name", ""),
            root_span_id=root.get("span_id", ""),
            start_time=root.get("start_time"),
            end_time=root.get("end_time"),
            duration_ms=(acc.get("duration") or {}).get("total"),
            status=root.get("status", "ok"),
            tokens=(acc.get("tokens") or {}).get("total"),
            cost=(acc.get("costs") or {}).get("total"),
            source=source,
            span_count=len(walked),
            session_id=_session_of(walked),
            created_at=now,
            updated_at=now,
        )
        traces.append(trace)
        fresh.append(trace)
        known[trace.trace_id] = trace
        spans.extend((trace, span) for span in walked)
    copy_insert(fresh, with_ids=True)
    copy_rows(
        Span,
        SPAN_COLUMNS,
        (
            (
                project.pk,
                trace.pk,
                span["span_id"],
                span.get("parent_id") or "",
                span.get("name", ""),
                span.get("kind", "task"),
                span.get("start_time"),
                span.get("end_time"),
                span.get("status", "ok"),
                span.get("status_message", ""),
                span.get("attributes", {}),
                trace.created_at,
            )
            for trace, span in spans
        ),
    )
    sessions_refresh(project.pk, {trace.session_id for trace in fresh})
    return traces


def _session_of(spans: list[dict]) -> str:
    for span in spans:
        meta = (span.get("attributes") or {}).get("ag", {}).get("meta")
        if isinstance(meta, dict) and isinstance(meta.get("session_id"), str):
            return meta["session_id"][:200]
    return ""


def _walk(spans):
    for span in spans:
        yield span
        yield from _walk((span.get("children") or {}).values())
