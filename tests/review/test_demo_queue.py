"""The demo project shows the loop to a newcomer: a queue with reviews, gold labels, an item
waiting for an adjudicator, items waiting for the demo user, and reliability records."""

from __future__ import annotations

from evalsite.demo import DEMO_USER, demo_load
from evaluators.models import ReliabilityRecord
from runs import review
from runs.models import AnnotationQueue, ItemStatus


def test_it_loads_a_queue_with_gold_labels_and_a_reliability_record(db, celery_eager):
    project = demo_load()
    queue = AnnotationQueue.objects.get(project=project, slug="capital-answers")
    progress = review.queue_progress(queue)
    assert (progress["items"], progress["gold"], progress["adjudication"]) == (12, 9, 1)
    assert progress["open"] == 2
    assert queue.agreement["fields"]["correct"]["items"] == 10  # two wait for a second review
    demo = queue.reviewers.get(username=DEMO_USER)
    item = review.item_next(queue=queue, reviewer=demo)
    assert item is not None and item.status == ItemStatus.OPEN
    record = ReliabilityRecord.objects.get(
        revision__evaluator__slug="exact-answer", gold_evaluator=queue.evaluator
    )
    # Exact matching fails "Lima, of course." which people call correct; "nairobi" passes
    # (case-insensitive): one false negative among the nine gold items.
    assert record.items == 9
    assert record.figures["confusion"]["fn"] == 1
    assert record.figures["confusion"]["fp"] == 0


def test_it_loads_the_queue_once(db, celery_eager):
    demo_load()
    demo_load()
    assert AnnotationQueue.objects.filter(slug="capital-answers").count() == 1
