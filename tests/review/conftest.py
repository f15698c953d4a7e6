"""Fixtures the review tests share: a human-feedback evaluator, three chat traces, and a
blind queue over them that wants two reviews an item (bob the editor and carol the viewer
review, alice the owner adjudicates)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from evaluators.services import evaluator_create
from runs import review
from runs.traces import trace_ingest

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)

# A yes/no label (what reliability pairs with an evaluator's `success`), an optional choice,
# and free text (never part of agreement).
FIELDS = [
    {"name": "correct", "type": "boolean"},
    {
        "name": "tone",
        "type": "categorical",
        "choices": ["friendly", "neutral", "rude"],
        "required": False,
    },
    {"name": "comment", "type": "string", "required": False},
]
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Germany?", "Munich"),
    ("What is the capital of Italy?", "Rome"),
]


def chat_span(trace_id: str, *, question: str, answer: str, name: str = "chat", start=T0) -> dict:
    """The root span of a one-span trace, as the native ingestion takes it."""
    return {
        "trace_id": trace_id,
        "span_id": "root",
        "name": name,
        "kind": "workflow",
        "start_time": start.isoformat(),
        "end_time": (start + timedelta(seconds=1)).isoformat(),
        "attributes": {"ag": {"data": {"inputs": {"question": question}, "outputs": answer}}},
    }


@pytest.fixture
def human_evaluator(project):
    return evaluator_create(
        project=project, kind="human", name="Answer review", parameters={"fields": FIELDS}
    )


@pytest.fixture
def traces(project):
    """Three chat traces (trace ids 0000...01 to ...03), in that order."""
    spans = [
        chat_span(f"{n + 1:032x}", question=q, answer=a, start=T0 + timedelta(minutes=n))
        for n, (q, a) in enumerate(QUESTIONS)
    ]
    return trace_ingest(project=project, spans=spans)


@pytest.fixture
def queue(project, owner, editor, viewer, human_evaluator, traces):
    queue = review.queue_create(
        project=project,
        name="Chat answers",
        evaluator=human_evaluator,
        reviewers_per_item=2,
        blind=True,
        reviewers=[editor.username, viewer.username],
        adjudicators=[owner.username],
        instructions="Is the answer correct?",
        author=owner,
    )
    review.items_add_traces(queue=queue, trace_ids=[trace.trace_id for trace in traces])
    return queue
