"""Traces in and out.

In: native spans (flat, or nested trace dicts), OTLP/HTTP (protobuf and JSON) and one-call
invocation records. Out: the trace dict evaluators receive (DOMAIN.md, "The trace that
evaluators receive"). docs/traces.md is the user-facing description of all of it.

Spans are upserted on (trace, span_id), so re-sending changes nothing and a trace may arrive in
pieces, in any order. After each ingest the touched traces are re-read whole: ``acc`` metrics
and the trace summary are recomputed over every span stored so far.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import secrets
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from evalsite.errors import InvalidInput
from evalsite.models import Project
from runs.models import Span, Trace

# --- limits -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    spans: int
    attributes_bytes: int
    body_bytes: int


def limits() -> Limits:
    """The documented ingestion limits; settings may lower or raise them (docs/traces.md)."""
    body = getattr(settings, "EVALSITE_TRACE_MAX_BODY_BYTES", settings.EVALSITE_MAX_BODY_BYTES)
    return Limits(
        spans=getattr(settings, "EVALSITE_TRACE_MAX_SPANS", 10_000),
        attributes_bytes=getattr(settings, "EVALSITE_TRACE_MAX_ATTRIBUTES_BYTES", 1024 * 1024),
        # Django refuses bodies above DATA_UPLOAD_MAX_MEMORY_SIZE on its own; stay under it.
        body_bytes=min(body, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or body),
    )


class TooLarge(InvalidInput):
    """A documented size limit was exceeded; the API answers 413 with the reason."""


# --- validation -------------------------------------------------------------------------------


def _number(value: Any) -> int | float:
    # Not pydantic's float: it would turn token counts into 10.0 and accept true as 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Number = Annotated[int | float, PlainValidator(_number)]
Id = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]


class MetricsIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    unit: dict[str, dict[str, Number]] = Field(default_factory=dict)
    # Whatever a sender puts in acc is ignored: it is recomputed from the stored tree.
    acc: Any = None


class AgIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    data: dict[str, Any] = Field(default_factory=dict)
    metrics: MetricsIn = Field(default_factory=MetricsIn)
    meta: dict[str, Any] = Field(default_factory=dict)


class AttributesIn(BaseModel):
    """``ag`` plus any other attributes, kept verbatim."""

    model_config = ConfigDict(extra="allow")

    ag: AgIn = Field(default_factory=AgIn)

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_ag_keys(cls, value: Any) -> Any:
        # OpenTelemetry attributes are flat ("ag.data.inputs"); they join the nested "ag".
        if not isinstance(value, dict) or not any(key.startswith("ag.") for key in value):
            return value
        value = dict(value)
        ag = value["ag"] = _copy_dicts(value.get("ag") or {})
        for key in [key for key in value if key.startswith("ag.")]:
            _set_path(ag, key[3:].split("."), _maybe_json(key, value.pop(key)))
        return value


class SpanIn(BaseModel):
    """One span in the native shape (docs/traces.md)."""

    model_config = ConfigDict(extra="ignore")

    trace_id: Id
    span_id: Id
    parent_id: Id | None = None
    name: Annotated[str, StringConstraints(min_length=1, max_length=300)]
    kind: Annotated[str, StringConstraints(min_length=1, max_length=32, to_lower=True)] = "task"
    start_time: datetime
    end_time: datetime | None = None
    status: Literal["ok", "error"] = "ok"
    status_message: str | None = None
    attributes: AttributesIn = Field(default_factory=AttributesIn)

    @field_validator("parent_id", mode="before")
    @classmethod
    def _empty_parent_is_none(cls, value: Any) -> Any:
        return value or None

    @field_validator("status", mode="before")
    @classmethod
    def _status_words(cls, value: Any) -> Any:
        # OpenTelemetry spells them UNSET / OK / ERROR (or STATUS_CODE_ERROR); unset is ok.
        if value is None:
            return "ok"
        if isinstance(value, str):
            word = value.lower().removeprefix("status_code_")
            return "ok" if word in ("", "unset") else word
        return value

    @field_validator("start_time", "end_time")
    @classmethod
    def _aware(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        start = info.data.get("start_time")
        if info.field_name == "end_time" and value and start and value < start:
            raise ValueError("is before start_time")
        return value


def _first_error(exc: ValidationError, loc: str) -> InvalidInput:
    """The first problem, named by its path: ``spans[3].start_time: invalid datetime``."""
    error = exc.errors()[0]
    path = ".".join(str(part) for part in error["loc"])
    if error["type"].startswith(("datetime", "date_")):
        message = "invalid datetime"
    elif error["type"] == "missing":
        message = "required"
    else:
        message = error["msg"].removeprefix("Value error, ")
    return InvalidInput({".".join(part for part in (loc, path) if part): [message]})


def _validate(loc: str, raw: Any) -> SpanIn:
    if not isinstance(raw, dict):
        raise InvalidInput({loc: ["must be an object (a span)"]})
    try:
        return SpanIn.model_validate(raw)
    except ValidationError as exc:
        raise _first_error(exc, loc)


def _flatten(items: Iterable[Any], prefix: str = "spans") -> Iterator[tuple[str, Any]]:
    """(location, flat span) for each span: flat spans pass through, trace dicts
    (``{"trace_id", "spans": {root_id: {..., "children": {...}}}}``) and spans with nested
    ``children`` are unnested."""
    for index, item in enumerate(items):
        loc = f"{prefix}[{index}]"
        if isinstance(item, dict) and isinstance(item.get("spans"), dict | list):
            for key, root in _pairs(item["spans"], f"{loc}.spans"):
                yield from _unnest(item.get("trace_id"), None, root, *key)
        elif isinstance(item, dict) and item.get("children"):
            yield from _unnest(item.get("trace_id"), None, item, loc, item.get("span_id"))
        else:
            yield loc, item


def _unnest(
    trace_id: Any, parent_id: str | None, node: Any, loc: str, key: Any
) -> Iterator[tuple[str, Any]]:
    """A span and its descendants, each given the trace id and the parent it is nested in."""
    if not isinstance(node, dict):
        yield loc, node
        return
    span = {k: v for k, v in node.items() if k != "children"}
    span["trace_id"] = trace_id
    span.setdefault("span_id", key)
    if parent_id is not None:
        span["parent_id"] = parent_id
    yield loc, span
    for child_key, child in _pairs(node.get("children") or {}, f"{loc}.children"):
        yield from _unnest(trace_id, span["span_id"], child, *child_key)


def _pairs(nodes: Any, loc: str) -> Iterator[tuple[tuple[str, Any], Any]]:
    """((location, key), node) for spans keyed by id (the contract) or listed."""
    if isinstance(nodes, dict):
        for key, node in nodes.items():
            yield (f"{loc}.{key}", key), node
    elif isinstance(nodes, list):
        for index, node in enumerate(nodes):
            yield (f"{loc}[{index}]", None), node
    else:
        raise InvalidInput({loc: ["must be an object keyed by span id"]})


# --- normalising one span -----------------------------------------------------------------------

TOKEN_ATTRIBUTES = {
    "prompt": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "llm.token_count.prompt",
    ),
    "completion": (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    ),
    "total": ("gen_ai.usage.total_tokens", "llm.token_count.total"),
}
COST_ATTRIBUTES = {
    "prompt": ("gen_ai.usage.input_cost", "llm.cost.prompt"),
    "completion": ("gen_ai.usage.output_cost", "llm.cost.completion"),
    "total": ("gen_ai.usage.cost", "llm.cost.total"),
}
MODEL_ATTRIBUTES = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name")
SYSTEM_ATTRIBUTES = ("gen_ai.provider.name", "gen_ai.system", "llm.provider")
# Payloads moved into ag.data are not kept twice.
DATA_ATTRIBUTES = {
    "inputs": ("input.value", "input.mime_type"),
    "outputs": ("output.value", "output.mime_type"),
}


def _row(project: Project, span: SpanIn) -> Span:
    """An unsaved Span with ``ag`` normalised and ``unit`` metrics filled in from the span."""
    attributes = _attributes(span)
    return Span(
        project=project,
        span_id=span.span_id,
        parent_id=span.parent_id or "",
        name=span.name,
        kind=span.kind,
        start_time=span.start_time,
        end_time=span.end_time,
        status=span.status,
        status_message=span.status_message or "",
        attributes=attributes,
    )


def _attributes(span: SpanIn) -> dict[str, Any]:
    ag, other = span.attributes.ag, dict(span.attributes.__pydantic_extra__ or {})
    data, meta = dict(ag.data), dict(ag.meta)
    for field, (value_key, mime_key) in DATA_ATTRIBUTES.items():
        if value_key in other:
            value, mime = other.pop(value_key), other.pop(mime_key, "")
            data.setdefault(field, _decode_text(value, mime))
    if "model" not in meta and (model := _first(other, MODEL_ATTRIBUTES)) is not None:
        meta["model"] = model
    if "system" not in meta and (system := _first(other, SYSTEM_ATTRIBUTES)) is not None:
        meta["system"] = system
    unit = {group: dict(values) for group, values in ag.metrics.unit.items()}
    if "total" not in unit.get("duration", {}) and span.end_time is not None:
        unit.setdefault("duration", {})["total"] = _ms(span.end_time - span.start_time)
    for group, names in (("tokens", TOKEN_ATTRIBUTES), ("costs", COST_ATTRIBUTES)):
        values = unit.get(group) or _semconv_numbers(other, names)
        if values:
            unit[group] = _with_total(values)
    metrics = {**(ag.metrics.__pydantic_extra__ or {}), "unit": unit, "acc": {}}
    extra_ag = ag.__pydantic_extra__ or {}
    result = {"ag": {"data": data, "metrics": metrics, "meta": meta, **extra_ag}, **other}
    _check_attributes(result)
    return result


def _check_attributes(attributes: dict) -> None:
    try:
        text = json.dumps(attributes, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput({"attributes": [f"not storable as JSON ({exc})"]})
    if len(text) > limits().attributes_bytes:
        raise TooLarge(
            {"attributes": [f"{len(text)} bytes of JSON; the limit is {limits().attributes_bytes}"]}
        )
    if "\\u0000" in text:
        raise InvalidInput({"attributes": ["contains a NUL character (\\u0000)"]})


def _semconv_numbers(attributes: dict, names: dict[str, tuple[str, ...]]) -> dict:
    found = {}
    for field, keys in names.items():
        value = _first(attributes, keys)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[field] = value
    return found


def _with_total(values: dict) -> dict:
    if "total" not in values and ("prompt" in values or "completion" in values):
        values = {**values, "total": _add(values.get("prompt", 0), values.get("completion", 0))}
    return values


def _first(attributes: dict, keys: tuple[str, ...]) -> Any:
    return next((attributes[key] for key in keys if key in attributes), None)


def _decode_text(value: Any, mime: Any) -> Any:
    if isinstance(value, str) and "json" in str(mime):
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value


def _maybe_json(key: str, value: Any) -> Any:
    # SDKs serialise structured ag.data values into strings; nothing else is guessed at.
    if key.startswith("ag.data.") and isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value


def _copy_dicts(value: dict) -> dict:
    return {k: _copy_dicts(v) if isinstance(v, dict) else v for k, v in value.items()}


def _set_path(target: dict, parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        nested = target.get(part)
        if not isinstance(nested, dict):
            nested = target[part] = {}
        target = nested
    target[parts[-1]] = value


def _ms(delta: timedelta) -> float:
    return round(delta.total_seconds() * 1000, 3)


def _add(a: int | float, b: int | float) -> int | float:
    total = a + b
    return round(total, 12) if isinstance(total, float) else total


# --- the tree ---------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _start_key(span: Span) -> tuple:
    return (span.start_time is None, span.start_time or _EPOCH, span.span_id)


def _tree(spans: Iterable[Span]) -> list[tuple[Span, Span | None]]:
    """Every span once, depth first, with its parent in the tree (None for a root).

    Roots come first by kind (real roots, then spans whose parent has not arrived), then by
    start time; children by start time. A span caught in a parent cycle becomes a root.
    """
    ordered = sorted(spans, key=_start_key)
    by_id = {span.span_id: span for span in ordered}
    children: dict[str, list[Span]] = defaultdict(list)
    roots: list[Span] = []
    for span in ordered:
        parent = by_id.get(span.parent_id) if span.parent_id else None
        if parent is None or parent is span:
            roots.append(span)
        else:
            children[parent.span_id].append(span)
    roots.sort(key=lambda span: span.parent_id != "")
    walked: list[tuple[Span, Span | None]] = []
    seen: set[str] = set()
    for root in [*roots, *ordered]:
        stack: list[tuple[Span, Span | None]] = [(root, None)]
        while stack:
            span, parent = stack.pop()
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            walked.append((span, parent))
            stack.extend((child, span) for child in reversed(children[span.span_id]))
    return walked


def _accumulate(walked: list[tuple[Span, Span | None]]) -> None:
    """Set ``acc`` on every span: tokens, costs (and any other additive group) summed over the
    span and its descendants; duration is the span's own wall time (its children run inside
    it), or the extent of its subtree when the span has no end of its own."""
    sums: dict[str, dict[str, dict[str, int | float]]] = defaultdict(dict)
    extents: dict[str, tuple[datetime | None, datetime | None]] = {}
    for span, parent in reversed(walked):
        metrics = span.attributes["ag"]["metrics"]
        acc = _merge(sums.pop(span.span_id, {}), metrics["unit"])
        first, last = extents.pop(span.span_id, (None, None))
        first = _min(first, span.start_time)
        last = _max(last, span.end_time)
        own = metrics["unit"].get("duration", {}).get("total")
        if own is not None:
            acc["duration"] = {"total": own}
        elif first is not None and last is not None:
            acc["duration"] = {"total": _ms(last - first)}
        metrics["acc"] = _ordered(acc)
        if parent is not None:
            key = parent.span_id
            sums[key] = _merge(sums[key], acc)
            before = extents.get(key, (None, None))
            extents[key] = (_min(before[0], first), _max(before[1], last))


def _merge(into: dict, groups: dict) -> dict:
    merged = {group: dict(values) for group, values in into.items()}
    for group, values in groups.items():
        if group == "duration":
            continue
        target = merged.setdefault(group, {})
        for key, value in values.items():
            target[key] = _add(target.get(key, 0), value)
    return merged


def _ordered(acc: dict) -> dict:
    order = {"duration": 0, "tokens": 1, "costs": 2}
    return dict(sorted(acc.items(), key=lambda item: order.get(item[0], 3)))


def _min(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else max(a, b)


SUMMARY_FIELDS = [
    "name",
    "root_span_id",
    "start_time",
    "end_time",
    "duration_ms",
    "status",
    "tokens",
    "cost",
    "span_count",
    "updated_at",
]


def _summarise(trace: Trace, walked: list[tuple[Span, Span | None]]) -> None:
    spans = [span for span, _ in walked]
    root = spans[0]
    acc = root.attributes["ag"]["metrics"]["acc"]
    trace.name = root.name
    trace.root_span_id = root.span_id
    trace.start_time = min((s.start_time for s in spans if s.start_time), default=None)
    trace.end_time = max((s.end_time for s in spans if s.end_time), default=None)
    trace.duration_ms = acc.get("duration", {}).get("total")
    trace.status = "error" if any(s.status == "error" for s in spans) else "ok"
    trace.tokens = _unit_sum(spans, "tokens")
    trace.cost = _unit_sum(spans, "costs")
    trace.span_count = len(spans)
    trace.updated_at = timezone.now()


def _unit_sum(spans: list[Span], group: str) -> float | None:
    values = [s.attributes["ag"]["metrics"]["unit"].get(group, {}).get("total") for s in spans]
    present = [value for value in values if value is not None]
    return float(sum(present)) if present else None


# --- storing ----------------------------------------------------------------------------------


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
    traces, writes = [], []
    for trace_id, new_spans in incoming.items():
        trace, old_spans = stored.get(trace_id) or (None, {})
        trace = trace or Trace(project=project, trace_id=trace_id, source=source)
        trace.spans_received = len(new_spans)
        before = {sid: span.attributes["ag"]["metrics"]["acc"] for sid, span in old_spans.items()}
        merged = {**old_spans, **new_spans}
        walked = _tree(merged.values())
        _accumulate(walked)
        _summarise(trace, walked)
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
    Span.objects.bulk_create(
        [span for _, trace_spans in writes for span in trace_spans],
        update_conflicts=True,
        unique_fields=["trace", "span_id"],
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


def _rows(project: Project, located: list[tuple[str, Any]]) -> list[tuple[str, Span]]:
    """Validate and normalise every span before anything is written: (trace id, row) pairs."""
    if len(located) > limits().spans:
        raise TooLarge(
            {"spans": [f"{len(located)} spans in one request; the limit is {limits().spans}"]}
        )
    rows = []
    for loc, raw in located:
        span = _validate(loc, raw)
        try:
            rows.append((span.trace_id, _row(project, span)))
        except InvalidInput as exc:
            raise type(exc)({f"{loc}.{name}": reasons for name, reasons in exc.fields.items()})
    return rows


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
    rows = _rows(project, list(_flatten(spans)))
    with transaction.atomic():
        traces = _store(project, rows, source) if rows else []
    from runs.online import online_queue  # here: runs.online imports this module

    online_queue(project=project, traces=traces)
    return traces


# --- OTLP -------------------------------------------------------------------------------------

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

OTEL_SPAN_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
GEN_AI_OPERATIONS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
}


@dataclass
class OtelSpan:
    """One span read from OTLP, protobuf or JSON, before mapping to the native shape."""

    loc: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    span_kind: int
    start_ns: int
    end_ns: int
    status_code: int
    status_message: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    resource: dict[str, Any]
    scope: str


def otlp_ingest(*, project: Project, body: bytes, content_type: str) -> list[Trace]:
    """Store an OTLP/HTTP ``ExportTraceServiceRequest`` (protobuf or JSON encoding).

    GenAI and OpenInference attributes map into ``ag`` (docs/traces.md has the table); every
    other attribute is kept verbatim. Raises ``InvalidInput`` for a malformed body.
    """
    if content_type == PROTOBUF:
        otel_spans = list(_otlp_protobuf(body))
    elif content_type == JSON:
        otel_spans = list(_otlp_json(body))
    else:
        raise InvalidInput({"content_type": [f"{content_type!r} is not {PROTOBUF} or {JSON}"]})
    rows = _rows(project, [(span.loc, _native(span)) for span in otel_spans])
    with transaction.atomic():
        traces = _store(project, rows, "otlp") if rows else []
    from runs.online import online_queue  # here: runs.online imports this module

    online_queue(project=project, traces=traces)
    return traces


def _native(span: OtelSpan) -> dict[str, Any]:
    attributes = dict(span.attributes)
    otel: dict[str, Any] = {"span_kind": OTEL_SPAN_KINDS.get(span.span_kind, "unspecified")}
    if span.scope:
        otel["scope"] = span.scope
    if span.resource:
        otel["resource"] = span.resource
    if span.events:
        otel["events"] = span.events
    meta = {"otel": otel}
    if isinstance(service := span.resource.get("service.name"), str):
        meta["service"] = service
    ag = attributes.get("ag")
    ag = attributes["ag"] = dict(ag) if isinstance(ag, dict) else {}
    given = ag.get("meta")
    ag["meta"] = {**meta, **given} if isinstance(given, dict) else meta
    message = span.status_message
    if span.status_code == 2 and not message:
        message = _exception_message(span.events)
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_id": span.parent_id or None,
        "name": (span.name or "unnamed")[:300],
        "kind": _otel_kind(span.attributes),
        "start_time": _from_nanos(span.start_ns) if span.start_ns else None,
        "end_time": _from_nanos(span.end_ns) if span.end_ns else None,
        "status": "error" if span.status_code == 2 else "ok",
        "status_message": message,
        "attributes": attributes,
    }


def _otel_kind(attributes: dict[str, Any]) -> str:
    for key in ("ag.type.node", "openinference.span.kind", "traceloop.span.kind"):
        if isinstance(value := attributes.get(key), str) and value:
            return value.lower()[:32]
    operation = attributes.get("gen_ai.operation.name")
    if isinstance(operation, str) and operation:
        return GEN_AI_OPERATIONS.get(operation, "llm")
    if any(key in attributes for key in SYSTEM_ATTRIBUTES):
        return "llm"
    return "task"


def _exception_message(events: list[dict[str, Any]]) -> str:
    for event in reversed(events):
        if event.get("name") == "exception":
            attrs = event.get("attributes") or {}
            kind, text = attrs.get("exception.type", ""), attrs.get("exception.message", "")
            return f"{kind}: {text}" if kind and text else str(kind or text)
    return ""


def _from_nanos(nanos: int) -> datetime:
    return _EPOCH + timedelta(microseconds=nanos // 1000)


def _otlp_protobuf(body: bytes) -> Iterator[OtelSpan]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise InvalidInput({"body": [f"not an OTLP ExportTraceServiceRequest ({exc})"]})
    for r, resource_spans in enumerate(request.resource_spans):
        resource = _proto_attributes(resource_spans.resource.attributes)
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            scope = scope_spans.scope.name
            for i, span in enumerate(scope_spans.spans):
                loc = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                yield OtelSpan(
                    loc=loc,
                    trace_id=_proto_id(span.trace_id, 16, f"{loc}.traceId"),
                    span_id=_proto_id(span.span_id, 8, f"{loc}.spanId"),
                    parent_id=span.parent_span_id.hex(),
                    name=span.name,
                    span_kind=span.kind,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    status_code=span.status.code,
                    status_message=span.status.message,
                    attributes=_proto_attributes(span.attributes),
                    events=[
                        {
                            "name": event.name,
                            "time": _iso(_from_nanos(event.time_unix_nano)),
                            "attributes": _proto_attributes(event.attributes),
                        }
                        for event in span.events
                    ],
                    resource=resource,
                    scope=scope,
                )


def _proto_id(raw: bytes, size: int, loc: str) -> str:
    if len(raw) != size or not any(raw):
        raise InvalidInput({loc: [f"must be {size} bytes, not all zero"]})
    return raw.hex()


def _proto_attributes(pairs) -> dict[str, Any]:
    return {pair.key: _proto_value(pair.value) for pair in pairs}


def _proto_value(value) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_proto_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _proto_attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return _finite(getattr(value, which))


def _finite(value: Any) -> Any:
    # JSON (and PostgreSQL's jsonb) has no NaN or infinities; keep them readable as text.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _otlp_json(body: bytes) -> Iterator[OtelSpan]:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput({"body": [f"not JSON ({exc})"]})
    if not isinstance(document, dict):
        raise InvalidInput({"body": ["must be an ExportTraceServiceRequest object"]})
    for r, resource_spans in enumerate(_list(document, "resourceSpans", "")):
        resource_loc = f"resourceSpans[{r}]"
        resource = _json_attributes(
            _get(_get(resource_spans, "resource") or {}, "attributes"), f"{resource_loc}.resource"
        )
        for s, scope_spans in enumerate(_list(resource_spans, "scopeSpans", resource_loc)):
            scope_loc = f"{resource_loc}.scopeSpans[{s}]"
            scope = _get(_get(scope_spans, "scope") or {}, "name") or ""
            for i, span in enumerate(_list(scope_spans, "spans", scope_loc)):
                yield _json_span(span, f"{scope_loc}.spans[{i}]", resource, str(scope))


def _json_span(span: Any, loc: str, resource: dict, scope: str) -> OtelSpan:
    if not isinstance(span, dict):
        raise InvalidInput({loc: ["must be a Span object"]})
    status = _get(span, "status") or {}
    return OtelSpan(
        loc=loc,
        trace_id=_json_id(_get(span, "traceId"), 16, f"{loc}.traceId"),
        span_id=_json_id(_get(span, "spanId"), 8, f"{loc}.spanId"),
        parent_id=_json_id(_get(span, "parentSpanId"), 8, f"{loc}.parentSpanId", optional=True),
        name=str(_get(span, "name") or ""),
        span_kind=_json_enum(_get(span, "kind"), "SPAN_KIND_", OTEL_SPAN_KINDS, f"{loc}.kind"),
        start_ns=_json_int(_get(span, "startTimeUnixNano"), f"{loc}.startTimeUnixNano"),
        end_ns=_json_int(_get(span, "endTimeUnixNano"), f"{loc}.endTimeUnixNano"),
        status_code=_json_enum(
            _get(status, "code"), "STATUS_CODE_", {1: "ok", 2: "error"}, f"{loc}.status.code"
        ),
        status_message=str(_get(status, "message") or ""),
        attributes=_json_attributes(_get(span, "attributes"), f"{loc}.attributes"),
        events=[
            {
                "name": _get(event, "name") or "",
                "time": _iso(_from_nanos(_json_int(_get(event, "timeUnixNano"), f"{loc}.events"))),
                "attributes": _json_attributes(_get(event, "attributes"), f"{loc}.events"),
            }
            for event in _list(span, "events", loc)
        ],
        resource=resource,
        scope=scope,
    )


def _get(obj: Any, camel: str) -> Any:
    """A field by its lowerCamelCase name (the OTLP/JSON spelling) or its proto name."""
    if not isinstance(obj, dict):
        return None
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake)


def _list(obj: Any, camel: str, loc: str) -> list:
    value = _get(obj, camel)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput({f"{loc}.{camel}" if loc else camel: ["must be a list"]})
    return value


def _json_id(value: Any, size: int, loc: str, optional: bool = False) -> str:
    # The OTLP/JSON spec says hex; generic protobuf JSON encoders send base64. Take both.
    if not value and optional:
        return ""
    if isinstance(value, str):
        if len(value) == size * 2:
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                raw = b""
        else:
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
        if len(raw) == size and any(raw):
            return raw.hex()
    raise InvalidInput({loc: [f"must be {size * 2} hex digits (or base64 of {size} bytes)"]})


def _json_int(value: Any, loc: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise InvalidInput({loc: ["must be an integer (unix nanoseconds, as a string or number)"]})


def _json_enum(value: Any, prefix: str, names: dict[int, str], loc: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.upper().removeprefix(prefix).lower()
        for number, name in names.items():
            if name == word:
                return number
        if word in ("unset", "unspecified"):
            return 0
    raise InvalidInput({loc: [f"unknown value {value!r}"]})


def _json_attributes(pairs: Any, loc: str) -> dict[str, Any]:
    if pairs is None:
        return {}
    if not isinstance(pairs, list):
        raise InvalidInput({loc: ["must be a list of {key, value}"]})
    result = {}
    for index, pair in enumerate(pairs):
        if not isinstance(pair, dict) or not isinstance(pair.get("key"), str):
            raise InvalidInput({f"{loc}[{index}]": ["must be {key, value}"]})
        result[pair["key"]] = _json_value(pair.get("value"), f"{loc}[{index}].value")
    return result


def _json_value(value: Any, loc: str) -> Any:
    if not isinstance(value, dict) or not value:
        return None
    for camel in ("stringValue", "boolValue", "intValue", "doubleValue"):
        raw = _get(value, camel)
        if raw is None:
            continue
        if camel == "intValue":
            return _json_signed(raw, loc)
        if camel == "doubleValue":
            return _json_double(raw, loc)
        return raw
    if (array := _get(value, "arrayValue")) is not None:
        items = _get(array, "values") or []
        return [_json_value(item, f"{loc}.arrayValue[{i}]") for i, item in enumerate(items)]
    if (kvlist := _get(value, "kvlistValue")) is not None:
        return _json_attributes(_get(kvlist, "values") or [], f"{loc}.kvlistValue")
    if (raw := _get(value, "bytesValue")) is not None:
        return raw
    return None


def _json_signed(raw: Any, loc: str) -> int:
    try:
        if isinstance(raw, bool):
            raise ValueError
        return int(raw)
    except (TypeError, ValueError):
        raise InvalidInput({loc: [f"intValue {raw!r} is not an integer"]})


def _json_double(raw: Any, loc: str) -> Any:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return _finite(float(raw))
    if isinstance(raw, str) and raw in ("NaN", "Infinity", "-Infinity"):
        return raw
    try:
        return _finite(float(raw))
    except (TypeError, ValueError):
        raise InvalidInput({loc: [f"doubleValue {raw!r} is not a number"]})


# --- reading ----------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    value = value.astimezone(UTC)
    spec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
    return value.isoformat(timespec=spec).replace("+00:00", "Z")


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
    for span in Span.objects.filter(trace_id__in=[t.pk for t in traces]).order_by():
        spans_of[span.trace_id].append(span)
    return {t.pk: {"trace_id": t.trace_id, "spans": _nested(spans_of[t.pk])} for t in traces}


def _nested(spans: list[Span]) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {}
    roots: dict[str, Any] = {}
    for span, parent in _tree(spans):
        node = nodes[span.span_id] = {
            "span_id": span.span_id,
            "parent_id": span.parent_id or None,
            "name": span.name,
            "kind": span.kind,
            "start_time": _iso(span.start_time),
            "end_time": _iso(span.end_time),
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
        spans = Span.objects.filter(trace_id=OuterRef("pk")).filter(_attribute_q(path, value))
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


# --- recording invocations ------------------------------------------------------------------


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
    rows = _rows(project, [("span", root), *_child_spans(trace_id, root_id, children or [])])
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
