"""Reviewers working at the same moment (threads with their own database connections, as on
several hosts) never give an item more reviews than it needs, nor review one item twice."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from evalsite.models import Role
from evalsite.services import membership_set, user_get_or_create
from runs import review
from runs.models import ItemStatus, Review, ReviewStatus
from runs.traces import trace_ingest
from tests.review.conftest import T0, chat_span

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ITEMS = 24
PER_ITEM = 2


def _work(queue, reviewer, errors: list) -> None:
    try:
        while (item := review.item_next(queue=queue, reviewer=reviewer)) is not None:
            review.review_submit(item=item, reviewer=reviewer, outputs={"correct": True})
    except Exception as exc:  # surfaced by the test, not lost in the thread
        errors.append(exc)
    finally:
        connection.close()


def test_it_gives_every_item_exactly_its_reviews_when_six_reviewers_claim_at_once(
    project, human_evaluator, celery_eager
):
    spans = [
        chat_span(f"{n + 1:032x}", question=f"q{n}", answer="a", start=T0 + timedelta(seconds=n))
        for n in range(ITEMS)
    ]
    traces = trace_ingest(project=project, spans=spans)
    people = []
    for n in range(6):
        person = user_get_or_create(username=f"reviewer{n}", password="pw-reviewer-123")
        membership_set(project=project, user=person, role=Role.VIEWER)
        people.append(person)
    queue = review.queue_create(
        project=project,
        name="Rush",
        evaluator=human_evaluator,
        reviewers_per_item=PER_ITEM,
        reviewers=[person.username for person in people],
    )
    review.items_add_traces(queue=queue, trace_ids=[trace.trace_id for trace in traces])

    errors: list = []
    threads = [threading.Thread(target=_work, args=(queue, person, errors)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    submitted = Review.objects.filter(queue=queue, status=ReviewStatus.SUBMITTED)
    assert submitted.count() == ITEMS * PER_ITEM
    per_item = Counter(submitted.values_list("item_id", flat=True))
    assert set(per_item.values()) == {PER_ITEM}
    pairs = Counter(submitted.values_list("item_id", "reviewer_id"))
    assert set(pairs.values()) == {1}
    assert queue.items.filter(status=ItemStatus.GOLD).count() == ITEMS
    assert not Review.objects.filter(queue=queue, status=ReviewStatus.RESERVED).exists()
