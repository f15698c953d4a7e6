"""A trace's span tree: parent links, ``acc`` metrics accumulated bottom-up, the trace summary."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from runs.models import Span, Trace
from runs.traces.spans import EPOCH, ms_between, number_add


def _start_key(span: Span) -> tuple:
    return (span.start_time is None, span.start_time or EPOCH, span.span_id)


def span_tree(spans: Iterable[Span]) -> list[tuple[Span, Span | None]]:
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


def acc_accumulate(walked: list[tuple[Span, Span | None]]) -> None:
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
            acc["duration"] = {"total": ms_between(last - first)}
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
            target[key] = number_add(target.get(key, 0), value)
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
    "session_id",
    "updated_at",
]


def trace_summarise(trace: Trace, walked: list[tuple[Span, Span | None]]) -> None:
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


def span_session(span: Span) -> str:
    meta = span.attributes["ag"].get("meta")
    session = meta.get("session_id") if isinstance(meta, dict) else None
    return session if isinstance(session, str) else ""


def _unit_sum(spans: list[Span], group: str) -> float | None:
    values = [s.attributes["ag"]["metrics"]["unit"].get(group, {}).get("total") for s in spans]
    present = [value for value in values if value is not None]
    return float(sum(present)) if present else None
