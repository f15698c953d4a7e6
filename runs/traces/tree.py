"""A trace's span tree: parent links, ``acc`` metrics accumulated bottom-up, the trace summary."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.utils import timezone

from runs.models import Trace
from runs.traces.spans import EPOCH, ms_between


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
    _walk(roots, children, walked, seen)
    if len(walked) < len(ordered):  # a cycle: its first span by start time is its root
        _walk(ordered, children, walked, seen)
    return walked


def _walk(
    roots: list[S], children: dict[str, list[S]], walked: list[tuple[S, S | None]], seen: set[str]
) -> None:
    for root in roots:
        if root.span_id in seen:
            continue
        stack: list[tuple[S, S | None]] = [(root, None)]
        while stack:
            span, parent = stack.pop()
            span_id = span.span_id
            if span_id in seen:
                continue
            seen.add(span_id)
            walked.append((span, parent))
            kids = children.get(span_id)
            if kids:
                stack.extend([(child, span) for child in reversed(kids)])


def acc_accumulate(walked: list[tuple[TreeSpan, TreeSpan | None]]) -> None:
    """Set ``acc`` on every span: tokens, costs (and any other additive group) summed over the
    span and its descendants; duration is the span's own wall time (its children run inside
    it), or the extent of its subtree when the span has no end of its own.

    Ingestion calls this for every trace it stores: the loop is written out (no helper calls
    per span) because it runs for every span that arrives. A sum with one term (a leaf's own
    ``unit``, a parent's first child) is a copy made in C; only further terms are added."""
    sums: dict[str, dict[str, dict[str, int | float]]] = {}
    extents: dict[str, tuple[datetime | None, datetime | None]] = {}
    for span, parent in reversed(walked):
        metrics = span.attributes["ag"]["metrics"]
        unit = metrics["unit"]
        span_id = span.span_id
        first, last = span.start_time, span.end_time
        acc = sums.pop(span_id, None)
        if acc is None:  # a leaf
            acc = {group: dict(values) for group, values in unit.items() if group != "duration"}
        else:
            if unit:
                _add(acc, unit)
            low, high = extents.pop(span_id)
            if low is not None and (first is None or low < first):
                first = low
            if high is not None and (last is None or high > last):
                last = high
        duration = unit.get("duration")
        own = duration.get("total") if duration else None
        if own is not None:
            acc["duration"] = {"total": own}
        elif first is not None and last is not None:
            acc["duration"] = {"total": ms_between(last - first)}
        metrics["acc"] = acc  # key order is jsonb's once stored
        if parent is not None:
            key = parent.span_id
            into = sums.get(key)
            if into is None:
                sums[key] = {g: dict(values) for g, values in acc.items() if g != "duration"}
                extents[key] = (first, last)
                continue
            _add(into, acc)
            low, high = extents[key]
            if first is not None and (low is None or first < low):
                low = first
            if last is not None and (high is None or last > high):
                high = last
            extents[key] = (low, high)


def _add(into: dict, groups: dict) -> None:
    """Add every group but duration into ``into``, in place: its dicts are its own (copies),
    so a subtree's sums are built once instead of copied at every level. The sums are
    ``number_add``'s, written out; a group ``into`` lacks is copied whole."""
    for group, values in groups.items():
        if group == "duration":
            continue
        target = into.get(group)
        if target is None:
            into[group] = dict(values)
            continue
        for key, value in values.items():
            total = target.get(key, 0) + value
            target[key] = round(total, 12) if type(total) is float else total


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
    """The trace's summary from its walked spans, in one pass over them."""
    root = walked[0][0]
    start = end = None
    error = False
    tokens: list[int | float] = []
    costs: list[int | float] = []
    session = ""
    for span, _ in walked:
        if (value := span.start_time) and (start is None or value < start):
            start = value
        if (value := span.end_time) and (end is None or value > end):
            end = value
        if span.status == "error":
            error = True
        unit = span.attributes["ag"]["metrics"]["unit"]
        if (group := unit.get("tokens")) and (total := group.get("total")) is not None:
            tokens.append(total)
        if (group := unit.get("costs")) and (total := group.get("total")) is not None:
            costs.append(total)
        if not session:
            session = span_session(span)
    acc = root.attributes["ag"]["metrics"]["acc"]
    trace.name = root.name
    trace.root_span_id = root.span_id
    trace.start_time = start
    trace.end_time = end
    trace.duration_ms = acc.get("duration", {}).get("total")
    trace.status = "error" if error else "ok"
    trace.tokens = float(sum(tokens)) if tokens else None
    trace.cost = float(sum(costs)) if costs else None
    trace.span_count = len(walked)
    trace.session_id = session
    trace.updated_at = timezone.now()


def span_session(span: TreeSpan) -> str:
    meta = span.attributes["ag"].get("meta")
    session = meta.get("session_id") if isinstance(meta, dict) else None
    return session[:200] if isinstance(session, str) else ""  # the trace's column holds 200
