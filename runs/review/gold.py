"""Gold labels out: as rows (for CSV/JSONL exports and the API), and into a testset as
ground-truth columns of a new version."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import transaction

from evalsite.errors import InvalidInput
from runs import testsets
from runs.models import AnnotationQueue, ItemStatus, QueueItem, Testcase, Testset
from runs.review.queues import form_fields


def gold_rows(
    queue: AnnotationQueue, offset: int = 0, limit: int | None = None
) -> Iterator[dict[str, Any]]:
    """One row per settled item: where it came from, how it was settled, and the label; a
    page of them from ``offset`` (the database skips the rest)."""
    items = (
        QueueItem.objects.filter(queue=queue, status=ItemStatus.GOLD, gold__isnull=False)
        .select_related("gold", "trace", "scenario", "adjudicated_by")
        .order_by("position")
    )[offset : None if limit is None else offset + limit]
    names = [field["name"] for field in form_fields(queue)]
    for item in items.iterator(chunk_size=500):
        outputs = item.gold.outputs or {}
        yield {
            "item": item.pk,
            "trace_id": item.trace.trace_id,
            "run": item.run_id,
            "scenario": item.scenario.index if item.scenario else None,
            "testcase": item.scenario.testcase_id if item.scenario else None,
            "settled_by": item.settled_by,
            "adjudicated_by": item.adjudicated_by.username if item.adjudicated_by else None,
            "agreement": item.agreement,
            "reviews": len(item.gold.details.get("reviews") or []),
            "annotation": item.gold_id,
            **{name: outputs.get(name) for name in names},
        }


def gold_columns(queue: AnnotationQueue) -> list[str]:
    fixed = ["item", "trace_id", "run", "scenario", "testcase", "settled_by", "adjudicated_by"]
    return [*fixed, "agreement", "reviews", "annotation", *(f["name"] for f in form_fields(queue))]


@transaction.atomic
def gold_to_testset(
    *, queue: AnnotationQueue, testset: Testset, prefix: str = "gold_", author=None
) -> Any:
    """A new version of ``testset`` whose rows gain ``<prefix><field>`` columns from the gold
    labels of the queue's items that came from runs over that testset (matched by testcase:
    its row in any earlier version, carried by position)."""
    if testset.project_id != queue.project_id:
        raise InvalidInput({"testset": ["No such testset in this project."]})
    head = testset.head
    rows_about = [row for row in gold_rows(queue) if row["testcase"] is not None]
    index_of = dict(
        Testcase.objects.filter(
            pk__in=[row["testcase"] for row in rows_about], version__testset=testset
        ).values_list("pk", "index")
    )
    by_index = {index_of[row["testcase"]]: row for row in rows_about if row["testcase"] in index_of}
    if not by_index:
        raise InvalidInput(
            {"testset": [f"No gold label of {queue.slug} is about a row of {testset.slug}."]}
        )
    names = [field["name"] for field in form_fields(queue)]
    rows = [
        {
            **testcase.data,
            **{f"{prefix}{n}": by_index.get(testcase.index, {}).get(n) for n in names},
        }
        for testcase in head.testcases.order_by("index")
    ]
    return testsets.testset_revise(
        testset=testset,
        rows=rows,
        message=f"Gold labels from queue {queue.slug} ({len(by_index)} rows)",
        author=author,
    )
