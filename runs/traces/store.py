"""Storing traces: native spans, OTLP and one-call invocation records, upserted on (trace, span_id)
so re-sending changes nothing and a trace may arrive in pieces, in any order. After each ingest
the touched traces are re-read whole and their ``acc`` metrics and summary recomputed."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

import orjson
from django.db import connection, transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project
from runs import queue
from runs.bulk import copy_insert, copy_rows
from runs.models import RuleTarget, Span, Trace
from runs.traces.otlp import otlp_spans
from runs.traces.sessions import prepared_cursor, sessions_refresh
from runs.traces.spans import SpanRow, attributes_json, json_bytes, limits, span_rows, spans_flatten
from runs.traces.tree import SUMMARY_FIELDS, acc_accumulate, span_tree, trace_summarise

SPAN_UPSERT = """
INSERT INTO runs_span (
    project_id, trace_id, span_id, parent_id, name, kind, start_time, end_time, status,
    status_message, attributes, trace_time
)
SELECT %s, r.trace_id, r.span_id, r.parent_id, r.name, r.kind, r.start_time, r.end_time,
       r.status, r.status_message, r.attributes, r.trace_time
FROM jsonb_to_recordset(%s::jsonb) AS r(
    trace_id bigint, span_id text, parent_id text, name text, kind text,
    start_time timestamptz, end_time timestamptz, status text, status_message text,
    attributes jsonb, trace_time timestamptz
)
ON CONFLICT (trace_id, span_id, trace_time) DO UPDATE SET
    parent_id = EXCLUDED.parent_id, name = EXCLUDED.name, kind = EXCLUDED.kind,
    start_time = EXCLUDED.start_time, end_time = EXCLUDED.end_time, status = EXCLUDED.status,
    status_message = EXCLUDED.status_message, attributes = EXCLUDED.attributes
"""


def _store(project: Project, rows: list[SpanRow], source: str) -> tuple[list[Trace], bool]:
    """Write the spans, then recompute acc and the summary of every touched trace. Returns the
    traces (first-seen order) and whether something watches the project's new traces (an active
    online rule or an annotation queue's feed).

    Every trace is first taken for new and inserted by one statement that leaves stored ones
    alone: most requests bring new traces only, and pay neither a lock nor a read. The traces
    that were stored already are then locked, read and merged. A trace none of whose spans
    changed (the same batch sent again) is not written at all.
    """
    incoming: dict[str, dict[str, SpanRow]] = {}
    for row in rows:
        incoming.setdefault(row.trace_id, {})[row.span_id] = row
    new_trace = _trace_maker(project, source)
    traces = []
    for trace_id, spans in incoming.items():
        trace = new_trace(trace_id)
        walked = span_tree(spans.values())
        acc_accumulate(walked)
        trace_summarise(trace, walked)
        traces.append(trace)
    watched = _traces_insert(project, traces)
    added = [(trace, list(incoming[trace.trace_id].values())) for trace in traces if trace.pk]
    arrived = [(trace.pk, trace.session_id) for trace, _ in added]  # new: added to sessions
    sessions: set[str] = set()  # recounted
    stored = {t.trace_id: t for t in traces if t.pk is None}
    if stored:
        merged = _merge(project, stored, {trace_id: incoming[trace_id] for trace_id in stored})
        changed = [m for m in merged if m.new or m.again]
        sessions.update(session for m in changed for session in (m.session, m.trace.session_id))
        _traces_upsert([m.trace for m in changed])
        added += [(m.trace, m.new) for m in changed]
        _spans_upsert(project, [(m.trace, m.again) for m in changed])
        by_id = {m.trace.trace_id: m.trace for m in merged}
        traces = [by_id[trace.trace_id] if trace.pk is None else trace for trace in traces]
    for trace in traces:
        trace.spans_received = len(incoming[trace.trace_id])
    _spans_add(project, added)
    sessions_refresh(project.pk, sessions, added=arrived)
    return traces, watched


class _Merged(NamedTuple):
    trace: Trace
    new: list[SpanRow]  # not stored yet
    again: list[SpanRow]  # stored, and changed: sent again so, or an acc its descendants moved
    session: str  # the one it had: a trace may move to another, and both change


def _merge(
    project: Project, unsaved: dict[str, Trace], incoming: dict[str, dict[str, SpanRow]]
) -> list[_Merged]:
    """Traces stored already and the spans sent for them, merged under their locks (each
    trace's summary recomputed when something changed). A trace deleted meanwhile is stored
    anew."""
    stored = _lock_and_load(project, list(incoming))
    merged = []
    for trace_id, new_spans in incoming.items():
        trace, old_spans = stored.get(trace_id) or (unsaved[trace_id], {})
        session = trace.session_id if trace.pk else ""
        before = {sid: span.attributes["ag"]["metrics"]["acc"] for sid, span in old_spans.items()}
        merged_spans = {**old_spans, **new_spans}
        walked = span_tree(merged_spans.values())
        acc_accumulate(walked)
        new = [span for sid, span in new_spans.items() if sid not in old_spans]
        again = [
            span
            for sid, span in merged_spans.items()
            if sid in old_spans
            and (span != old_spans[sid] or span.attributes["ag"]["metrics"]["acc"] != before[sid])
        ]
        if new or again:
            trace_summarise(trace, walked)
        merged.append(_Merged(trace, new, again, session))
    return merged


def _trace_maker(project: Project, source: str) -> Callable[[str], Trace]:
    """Makes the request's new (unsaved) traces: ``Trace(...)`` sets every field through its
    descriptors, four times the cost of ``from_db`` with the defaults worked out once."""
    fields = Trace._meta.concrete_fields
    names = [field.attname for field in fields]
    defaults = {field.attname: field.get_default() for field in fields}
    defaults |= {"id": None, "project_id": project.pk, "source": source}
    at = names.index("trace_id")
    values = [defaults[name] for name in names]
    cache_project = Trace._meta.get_field("project").set_cached_value

    def make(trace_id: str) -> Trace:
        values[at] = trace_id
        trace = Trace.from_db(connection.alias, names, values)
        trace._state.adding = True
        cache_project(trace, project)
        return trace

    return make


# Whether anything evaluates or queues new traces of the project: asked in the ingest's first
# statement (two index lookups) instead of in two queries of their own after the commit.
# runs.queue.online_dispatch is called only then.
WATCHED_SQL = """
EXISTS (SELECT 1 FROM runs_onlinerule
        WHERE project_id = %(project)s AND active AND target = %(trace)s)
OR EXISTS (SELECT 1 FROM runs_annotationqueue
           WHERE project_id = %(project)s AND NOT archived AND trace_filter IS NOT NULL)
"""


def _traces_insert(project: Project, traces: list[Trace]) -> bool:
    """Insert the traces not stored yet, setting their primary keys (in the order sent); the
    others keep none. In the same statement: whether the project's new traces are watched
    (``WATCHED_SQL``).

    Rows go in trace id order: two requests inserting the same new traces wait for each other
    at the first one, never in a circle."""
    params = {
        "traces": orjson.dumps(_trace_document(traces)).decode(),
        "project": project.pk,
        "trace": RuleTarget.TRACE.value,
    }
    with prepared_cursor() as cursor:
        cursor.execute(_trace_insert_sql(), params)
        rows = cursor.fetchall()
    # An inserted trace's created_at is the one it was sent with: not read back.
    inserted = {trace_id: pk for _, pk, trace_id in rows if pk is not None}
    for trace in traces:
        if (pk := inserted.get(trace.trace_id)) is not None:
            trace.pk = pk
            trace._state.adding = False
    return rows[0][0]


def _trace_document(traces: list[Trace]) -> list[dict[str, Any]]:
    # Its fields hold plain values (text, numbers, aware datetimes): JSON as they are.
    fields = [(f.column, f.attname) for f in Trace._meta.concrete_fields if not f.primary_key]
    return [{column: getattr(trace, name) for column, name in fields} for trace in traces]


@cache
def _trace_insert_sql() -> str:
    # Ids are drawn in the request's order (a CTE calling nextval is not inlined: it runs
    # first, over the rows as sent), so the newest-first lists keep the order traces came in.
    columns, record = _trace_columns()
    table = Trace._meta.db_table
    return (
        f"WITH watched AS (SELECT {WATCHED_SQL} AS watched), "  # noqa: S608 (no values)
        f"arrived AS (SELECT nextval(pg_get_serial_sequence('{table}', 'id')) AS id, * "
        f"FROM jsonb_to_recordset(%(traces)s::jsonb) AS r({record})), "
        f"inserted AS (INSERT INTO {table} (id, {columns}) SELECT id, {columns} "
        "FROM arrived ORDER BY trace_id "
        "ON CONFLICT (project_id, trace_id) DO NOTHING RETURNING id, trace_id) "
        "SELECT watched, id, trace_id FROM watched LEFT JOIN inserted ON true"
    )


def _trace_columns() -> tuple[str, str]:
    # Built from the model, so a field added to Trace is written without touching this.
    quote = connection.ops.quote_name
    fields = [f for f in Trace._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(quote(f.column) for f in fields)
    record = ", ".join(f"{quote(f.column)} {f.db_type(connection)}" for f in fields)
    return columns, record


def _traces_upsert(traces: list[Trace]) -> None:
    """Insert the new traces and update the summaries of the others in one statement; sets the
    primary keys. ``bulk_create(update_conflicts=True)`` does the same at ten times the cost."""
    if not traces:
        return
    document = orjson.dumps(_trace_document(traces)).decode()
    with prepared_cursor() as cursor:
        cursor.execute(_trace_upsert_sql(), [document])
        stored = {trace_id: (pk, created) for pk, trace_id, created in cursor.fetchall()}
    for trace in traces:
        # A trace someone stored meanwhile without the lock keeps its arrival time, which
        # is its spans' partition key.
        trace.pk, trace.created_at = stored[trace.trace_id]


@cache
def _trace_upsert_sql() -> str:
    quote = connection.ops.quote_name
    columns, record = _trace_columns()
    updated = [Trace._meta.get_field(name).column for name in SUMMARY_FIELDS]
    sets = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in updated)
    table = quote(Trace._meta.db_table)
    return (
        f"INSERT INTO {table} ({columns}) SELECT {columns} "  # noqa: S608 (names, no values)
        f"FROM jsonb_to_recordset(%s::jsonb) AS r({record}) "
        f"ON CONFLICT (project_id, trace_id) DO UPDATE SET {sets} "
        "RETURNING id, trace_id, created_at"
    )


SPAN_COLUMNS = (
    "project_id", "trace_id", "span_id", "parent_id", "name", "kind", "start_time", "end_time",
    "status", "status_message", "attributes", "trace_time",
)  # fmt: skip


# Binary COPY: timestamps and numbers travel as PostgreSQL stores them, neither side formats or
# parses text (two fifths of the client's COPY time and a sixth of the server's, measured).
# jsonb's binary form is a version byte and the JSON text: the attributes go as those bytes
# (written by psycopg's bytea dumper, in C), not through a Python dumper per row.
SPAN_COPY = f"COPY runs_span ({', '.join(SPAN_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
SPAN_COPY_TYPES = (
    "int8", "int8", "text", "text", "text", "text", "timestamptz", "timestamptz", "text", "text",
    "bytea", "timestamptz",
)  # fmt: skip
JSONB_VERSION = b"\x01"


def _spans_add(project: Project, spans: list[tuple[Trace, list[SpanRow]]]) -> None:
    """Spans not stored yet, by COPY (a third of an INSERT's cost to PostgreSQL). A new trace's
    spans are written by the request that inserted it (another one inserting it waits for its
    commit), a stored trace's by the holder of its lock, who has read them: none can collide."""
    if not any(rows for _, rows in spans):
        return
    project_pk, max_bytes = project.pk, limits().attributes_bytes
    with connection.cursor() as cursor, cursor.cursor.copy(SPAN_COPY) as copy:
        copy.set_types(SPAN_COPY_TYPES)
        for trace, rows in spans:
            trace_pk, arrived = trace.pk, trace.created_at
            for span in rows:
                copy.write_row(
                    (
                        project_pk,
                        trace_pk,
                        span.span_id,
                        span.parent_id,
                        span.name,
                        span.kind,
                        span.start_time,
                        span.end_time,
                        span.status,
                        span.status_message,
                        JSONB_VERSION + attributes_json(span, max_bytes),
                        # The partition key: the trace's arrival, the same for all its spans.
                        arrived,
                    )
                )


def _spans_upsert(project: Project, spans: list[tuple[Trace, list[SpanRow]]]) -> None:
    """Stored spans sent again with changes, and those whose ``acc`` changed: one statement,
    the spans travelling as one JSON document that PostgreSQL unpacks into rows."""
    if not any(rows for _, rows in spans):
        return
    max_bytes = limits().attributes_bytes
    for _, rows in spans:
        for span in rows:
            if span.loc:  # sent in this request (the others are stored ones whose acc moved)
                attributes_json(span, max_bytes)
    document = [
        {
            "trace_id": trace.pk,
            "span_id": span.span_id,
            "parent_id": span.parent_id,
            "name": span.name,
            "kind": span.kind,
            "start_time": _isoformat(span.start_time),
            "end_time": _isoformat(span.end_time),
            "status": span.status,
            "status_message": span.status_message,
            "attributes": span.attributes,
            "trace_time": trace.created_at.isoformat(),
        }
        for trace, rows in spans
        for span in rows
    ]
    with prepared_cursor() as cursor:
        cursor.execute(SPAN_UPSERT, [project.pk, json_bytes(document).decode()])


def _isoformat(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


ROW_FIELDS = (
    "span_id", "parent_id", "name", "kind", "start_time", "end_time", "status", "status_message",
    "attributes",
)  # fmt: skip


def _lock_and_load(
    project: Project, trace_ids: list[str]
) -> dict[str, tuple[Trace, dict[str, SpanRow]]]:
    # Spans of one trace often arrive in concurrent requests (one batch per service). A
    # transaction-scoped lock per trace makes each recompute see the spans committed before it;
    # keys are taken in sorted order so two requests never wait on each other in a circle.
    keys = sorted({_lock_key(project.pk, trace_id) for trace_id in trace_ids})
    names = [field.attname for field in Trace._meta.concrete_fields]
    with prepared_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k", [keys])
        # Raw SQL: the ORM takes longer to compile this than PostgreSQL takes to answer it.
        cursor.execute(
            f"SELECT {', '.join(names)} FROM runs_trace "  # noqa: S608 (the model's columns)
            "WHERE project_id = %s AND trace_id = ANY(%s)",
            [project.pk, trace_ids],
        )
        traces = {row[0]: Trace.from_db(connection.alias, names, row) for row in cursor}
    if not traces:
        return {}
    spans: dict[int, dict[str, SpanRow]] = defaultdict(dict)
    # Naming the traces' times (the partition key) lets PostgreSQL read their partitions only.
    stored = Span.objects.filter(
        trace_id__in=list(traces), trace_time__in={t.created_at for t in traces.values()}
    )
    for trace_pk, *values in stored.order_by().values_list("trace_id", *ROW_FIELDS):
        row = SpanRow(traces[trace_pk].trace_id, *values)
        spans[trace_pk][row.span_id] = _loaded(row)
    return {trace.trace_id: (trace, spans[pk]) for pk, trace in traces.items()}


def _loaded(span: SpanRow) -> SpanRow:
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
    rows = span_rows(list(spans_flatten(spans)))
    return _ingest(project, rows, source)


def _ingest(project: Project, rows: list[SpanRow], source: str) -> list[Trace]:
    if not rows:
        return []
    with transaction.atomic():
        traces, watched = _store(project, rows, source)
    if watched:
        queue.online_dispatch(project.pk, [trace.pk for trace in traces])
    return traces


def otlp_ingest(*, project: Project, body: bytes, content_type: str) -> list[Trace]:
    """Store an OTLP/HTTP ``ExportTraceServiceRequest`` (protobuf or JSON encoding).

    GenAI and OpenInference attributes map into ``ag`` (docs/traces.md has the table); every
    other attribute is kept verbatim. Raises ``InvalidInput`` for a malformed body.
    """
    return _ingest(project, span_rows(otlp_spans(body, content_type)), "otlp")


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
    rows = span_rows([("span", root), *_child_spans(trace_id, root_id, children or [])])
    with transaction.atomic(savepoint=False):
        return _store(project, rows, source)[0][0]


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
    sessions_refresh(project.pk, (), added=[(trace.pk, trace.session_id) for trace in fresh])
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
