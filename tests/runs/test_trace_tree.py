"""The span tree's ``acc`` and the trace summary, checked against their definitions on random
trees: ``acc`` is the sum of ``unit`` over the span's subtree (duration: the span's own, else
its subtree's extent), and the summary reads the spans as a whole. Ingestion runs the tree code
for every span it stores, so it is written for speed; these tests hold it to what it means."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from runs.models import Trace
from runs.traces.spans import SpanRow, ms_between
from runs.traces.tree import acc_accumulate, span_tree, trace_summarise

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def random_trace(rng: random.Random) -> list[SpanRow]:
    spans: list[SpanRow] = []
    for index in range(rng.randint(1, 25)):
        parent = rng.choice(spans).span_id if spans and rng.random() < 0.9 else ""
        if rng.random() < 0.05:
            parent = "not-arrived"  # an orphan: its parent is in another request
        start = T0 + timedelta(milliseconds=rng.randint(0, 5000))
        end = start + timedelta(milliseconds=rng.randint(0, 3000)) if rng.random() < 0.8 else None
        unit: dict = {}
        if end is not None and rng.random() < 0.9:
            unit["duration"] = {"total": ms_between(end - start)}
        if rng.random() < 0.6:
            unit["tokens"] = {"prompt": rng.randint(0, 500), "completion": rng.randint(0, 90)}
            unit["tokens"]["total"] = unit["tokens"]["prompt"] + unit["tokens"]["completion"]
        if rng.random() < 0.5:
            unit["costs"] = {"total": rng.choice([0.00004, 0.1, 0.2, 1.5, 3])}
        meta = {"session_id": f"s{index}"} if rng.random() < 0.2 else {}
        attributes = {"ag": {"data": {}, "metrics": {"unit": unit, "acc": {}}, "meta": meta}}
        spans.append(
            SpanRow(
                trace_id="t1",
                span_id=f"span{index:02d}",
                parent_id=parent,
                name=f"step {index}",
                kind="task",
                start_time=start,
                end_time=end,
                status="error" if rng.random() < 0.1 else "ok",
                status_message="",
                attributes=attributes,
            )
        )
    return spans


def subtree(span_id: str, walked) -> list[SpanRow]:
    children = [span for span, parent in walked if parent is not None and parent.span_id == span_id]
    own = next(span for span, _ in walked if span.span_id == span_id)
    return [own, *(s for child in children for s in subtree(child.span_id, walked))]


def unit_of(span: SpanRow) -> dict:
    return span.attributes["ag"]["metrics"]["unit"]


@pytest.mark.parametrize("seed", range(40))
def test_acc_is_the_sum_of_unit_over_each_subtree(seed):
    rng = random.Random(seed)
    walked = span_tree(random_trace(rng))
    acc_accumulate(walked)

    for span, _ in walked:
        below = subtree(span.span_id, walked)
        acc = span.attributes["ag"]["metrics"]["acc"]
        for group in ("tokens", "costs"):
            present = [unit_of(s)[group] for s in below if group in unit_of(s)]
            keys = {key for values in present for key in values}
            expected = {key: sum(values.get(key, 0) for values in present) for key in keys}
            assert acc.get(group, {}).keys() == expected.keys()
            for key, total in expected.items():
                assert acc[group][key] == pytest.approx(total, abs=1e-9)
        if "duration" in unit_of(span):
            assert acc["duration"] == unit_of(span)["duration"]
        else:
            starts = [s.start_time for s in below if s.start_time]
            ends = [s.end_time for s in below if s.end_time]
            if ends:
                assert acc["duration"] == {"total": ms_between(max(ends) - min(starts))}
            else:
                assert "duration" not in acc


@pytest.mark.parametrize("seed", range(40))
def test_the_summary_reads_every_span_of_the_trace(seed):
    rng = random.Random(seed)
    spans = random_trace(rng)
    walked = span_tree(spans)
    acc_accumulate(walked)
    trace = Trace(trace_id="t1")
    trace_summarise(trace, walked)

    root = walked[0][0]
    assert (trace.name, trace.root_span_id) == (root.name, root.span_id)
    assert trace.start_time == min(s.start_time for s in spans)
    assert trace.end_time == max((s.end_time for s in spans if s.end_time), default=None)
    assert trace.status == ("error" if any(s.status == "error" for s in spans) else "ok")
    assert trace.span_count == len(spans)
    for field, group in (("tokens", "tokens"), ("cost", "costs")):
        totals = [unit_of(s)[group]["total"] for s, _ in walked if group in unit_of(s)]
        assert getattr(trace, field) == (float(sum(totals)) if totals else None)
    sessions = [s.attributes["ag"]["meta"].get("session_id") for s, _ in walked]
    assert trace.session_id == next(filter(None, sessions), "")
    assert trace.duration_ms == root.attributes["ag"]["metrics"]["acc"].get("duration", {}).get(
        "total"
    )
