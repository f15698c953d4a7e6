"""A trace's span tree: parent links, ``acc`` metrics accumulated bottom-up, the trace summary."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.utils import timezone

from runs.models import Trace
from runs.traces.spans import EPOCH, ms_between, number_add


class TreeSpan(Protocol):
    """What the tree reads of a span: a stored ``Span`` or an incoming ``SpanRow``."""

    span_id: str
    parent_id: str
    name: str
    start_time: datetime | None
    end_time: datetime | None
    status: str
    attributes: dict[str, Any]


S = TypeVar("S", bound=TreeSpan)


def _start_key(span: TreeSpan) -> tuple:
    return (span.start_time is None, span.start_time or EPOCH, span.span_id)


def span_tree(spans: Iterable[S]) -> list[tuple[S, S | None]]:
    """Every span once, depth first, with its parent in the tree (None for a root).

    Roots come first by kind (real roots, then spans whose parent has not arrived), then by
    start time; children by start time. A span caught in a parent cycle becomes a root.
    """
    ordered = sorted(spans, key=_start_key)
    by_id = {span.span_id: span for span in ordered}
    children: dict[str, list[S]] = defaultdict(list)
    roots: list[S] = []
    for span in ordered:
        parent = by_id.get(span.parent_id) if span.parent_id else None
        if parent is None or parent is span:
            roots.append(span)
        else:
            children[parent.span_id].append(span)
    roots.sort(key=lambda span: span.parent_id != "")
    walked: list[tuple[S, S | None]] = []
    seen: set[str] = set()
    for root in [*roots, *ordered]:
        stack: list[tuple[S, S | None]] = [(root, None)]
        while stack:
            span, parent = stack.pop()
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            walked.append((span, parent))
            stack.extend((child, span) for child in reversed(children[span.span_id]))
    return walked


def acc_accumulate(walked: list[tuple[TreeSpan, TreeSpan | None]]) -> None:
    """Set ``acc`` on every span: tokens, costs (and any other additive group) summed over the
    span and its descendants; duration is the span's own wall time (its children run inside
    it), or the extent of its subtree when the span has no end of its own."""
    sums: dict[str, dict[str, dict[str, int | float]]] = {}
    extents: dict[str, tuple[datetime | None, datetime | None]] = {}
    for span, parent in reversed(walked):
        unit = span.attributes["ag"]["metrics"]["unit"]
        acc = sums.pop(span.span_id, {})
        _add(acc, unit)
        first, last = extents.pop(span.span_id, (None, None))
        first = _min(first, span.start_time)
        last = _max(last, span.end_time)
        duration = unit.get("duration")
        own = duration.get("total") if duration else None
        if own is not None:
            acc["duration"] = {"total": own}
        elif first is not None and last is not None:
            acc["duration"] = {"total": ms_between(last - first)}
        span.attributes["ag"]["metrics"]["acc"] = acc  # key order is jsonb's once stored
        if parent is not None:
            key = parent.span_id
            _add(sums.setdefault(key, {}), acc)
            before = extents.get(key, (None, None))
            extents[key] = (_min(before[0], first), _max(before[1], last))


def _add(into: dict, groups: dict) -> None:
    """Add every group but duration into ``into``, in place: its dicts are its own (copies),
    so a subtree's sums are built once instead of copied at every level."""
    for group, values in groups.items():
        if group == "duration":
            continue
        target = into.get(group)
        if target is None:
            into[group] = {key: number_add(0, value) for key, value in values.items()}
        else:
            for key, value in values.items():
                target[key] = number_add(target.get(key, 0), value)


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
    "session_id",
    "updated_at",
]


def trace_summarise(trace: Trace, walked: list[tuple[TreeSpan, TreeSpan | None]]) -> None:
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
    trace.session_id = next(filter(None, map(span_session, spans)), "")
    trace.updated_at = timezone.now()


def span_session(span: TreeSpan) -> str:
    meta = span.attributes["ag"].get("meta")
    session = meta.get("session_id") if isinstance(meta, dict) else None
    return session if isinstance(session, str) else ""


def _unit_sum(spans: list[TreeSpan], group: str) -> float | None:
    values = [s.attributes["ag"]["metrics"]["unit"].get(group, {}).get("total") for s in spans]
    present = [value for value in values if value is not None]
    return float(sum(present)) if present else None
