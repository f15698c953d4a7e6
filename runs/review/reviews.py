"""Reviewing: handing each reviewer the next item under a reservation, reviews submitted or
skipped, items settled into gold labels (unanimous, by majority, or by an adjudicator), what a
reviewer may see, progress, and the queue's agreement report."""

from __future__ import annotations

import statistics
from collections import Counter
from datetime import timedelta
from itertools import combinations
from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from evalsite.errors import InvalidInput
from runs import queue as work
from runs.annotations import annotation_create, annotation_update, outputs_validate
from runs.models import (
    Annotation,
    AnnotationQueue,
    Channel,
    ItemStatus,
    Origin,
    QueueItem,
    Review,
    ReviewStatus,
    SettledBy,
)
from runs.review import agreement
from runs.review.queues import form_fields, label_fields

CANDIDATES = 20  # items tried per claim (each may have been filled by a neighbour meanwhile)


class Conflict(InvalidInput):
    def __init__(self, message: str, field: str = "non_field_errors"):
        super().__init__({field: [message]}, status=409)


# --- who may do what ----------------------------------------------------------------------------


def may_review(queue: AnnotationQueue, user) -> bool:
    """Listed reviewers; a queue that lists none is open to every member of the project."""
    if not getattr(user, "pk", None):
        return False
    listed = queue.reviewers.all()
    return listed.filter(pk=user.pk).exists() if listed.exists() else True


def may_adjudicate(queue: AnnotationQueue, user, role: str | None = None) -> bool:
    """Listed adjudicators; a queue that lists none lets the project's owners adjudicate."""
    if not getattr(user, "pk", None):
        return False
    listed = queue.adjudicators.all()
    return listed.filter(pk=user.pk).exists() if listed.exists() else role == "owner"


def sees_others(item: QueueItem, user, *, adjudicator: bool = False) -> bool:
    """Blind queues hide the other reviews and the automatic verdicts from a reviewer until
    they have submitted their own (adjudicators see everything: that is their job)."""
    if not item.queue.blind or adjudicator:
        return True
    return Review.objects.filter(
        item=item, reviewer_id=getattr(user, "pk", None), status=ReviewStatus.SUBMITTED
    ).exists()


def _check_reviewer(queue: AnnotationQueue, user) -> None:
    if not may_review(queue, user):
        raise InvalidInput(
            {"reviewer": [f"{getattr(user, 'username', user)} is not a reviewer of this queue."]},
            status=403,
        )


# --- assignment -------------------------------------------------------------------------------


def _live(now) -> Q:
    """Reviews that hold a place on an item: submitted, or reserved and not expired."""
    return Q(reviews__status=ReviewStatus.SUBMITTED) | Q(
        reviews__status=ReviewStatus.RESERVED, reviews__reserved_until__gt=now
    )


def item_next(*, queue: AnnotationQueue, reviewer) -> QueueItem | None:
    """The reviewer's next item, reserved for them for the queue's reservation time: the one
    they hold already, else the first open item they have not seen that still needs reviews.
    Two reviewers (or two hosts) claiming at once lock the item row in turn and count again, so
    an item never gets more reviews than it needs."""
    _check_reviewer(queue, reviewer)
    now = timezone.now()
    until = now + timedelta(seconds=queue.reservation_seconds)
    with transaction.atomic():
        held = (
            Review.objects.select_for_update()
            .filter(queue=queue, reviewer=reviewer, status=ReviewStatus.RESERVED)
            .select_related("item")
            .order_by("item__position")
        )
        for review in held:
            if _room(review.item, now, but=review) and review.item.status == ItemStatus.OPEN:
                review.reserved_until, review.updated_at = until, now
                review.save(update_fields=["reserved_until", "updated_at"])
                return review.item
            review.delete()  # the others filled it while this reservation lapsed
    candidates = (
        QueueItem.objects.filter(queue=queue, status=ItemStatus.OPEN)
        .exclude(reviews__reviewer=reviewer)
        .annotate(taken=Count("reviews", filter=_live(now)))
        .filter(taken__lt=queue.reviewers_per_item)
        .order_by("position")
        .values_list("pk", flat=True)
    )
    for pk in candidates[:CANDIDATES]:
        with transaction.atomic():
            item = (
                # Wait for a neighbour's claim (a short transaction) rather than skip the item:
                # skipping would tell this reviewer "nothing left" while the item still has room.
                QueueItem.objects.select_for_update(of=("self",))
                .filter(pk=pk, status=ItemStatus.OPEN)
                .select_related("queue")
                .first()
            )
            if item is None or not _room(item, now):
                continue
            Review.objects.update_or_create(
                item=item,
                reviewer=reviewer,
                defaults={
                    "project_id": item.project_id,
                    "queue": queue,
                    "status": ReviewStatus.RESERVED,
                    "reserved_until": until,
                    "updated_at": now,
                },
            )
            return item
    return None


def _room(item: QueueItem, now, but: Review | None = None) -> bool:
    holding = item.reviews.filter(
        Q(status=ReviewStatus.SUBMITTED) | Q(status=ReviewStatus.RESERVED, reserved_until__gt=now)
    )
    if but is not None:
        holding = holding.exclude(pk=but.pk)
    return holding.count() < item.queue.reviewers_per_item


def reservation_release(*, queue: AnnotationQueue, reviewer) -> int:
    """Give back the reviewer's reservations (leaving the review page)."""
    deleted, _ = Review.objects.filter(
        queue=queue, reviewer=reviewer, status=ReviewStatus.RESERVED
    ).delete()
    return deleted


# --- reviews ----------------------------------------------------------------------------------


def review_submit(*, item: QueueItem, reviewer, outputs: Any) -> Review:
    """Record the reviewer's answer (checked against the queue's form). Submitting again
    before the item is settled changes the answer; the item settles once it has all its
    reviews."""
    queue = item.queue
    _check_reviewer(queue, reviewer)
    value = outputs_validate(outputs, queue.revision)
    now = timezone.now()
    with transaction.atomic():
        item = QueueItem.objects.select_for_update().select_related("queue").get(pk=item.pk)
        if item.status != ItemStatus.OPEN:
            raise Conflict(f"This item is already {item.get_status_display().lower()}.")
        review = Review.objects.filter(item=item, reviewer=reviewer).first()
        if (review is None or review.status != ReviewStatus.SUBMITTED) and item.reviews.filter(
            status=ReviewStatus.SUBMITTED
        ).exclude(reviewer=reviewer).count() >= queue.reviewers_per_item:
            raise Conflict(
                f"This item has its {queue.reviewers_per_item} reviews already "
                "(your reservation had lapsed)."
            )
        review = review or Review(
            project_id=item.project_id, queue=queue, item=item, reviewer=reviewer
        )
        review.status, review.outputs = ReviewStatus.SUBMITTED, value
        review.reserved_until, review.submitted_at, review.updated_at = None, now, now
        review.save()
        _settle_if_complete(item)
        work.queue_agreement_refresh(queue.pk)
    return review


def review_skip(*, item: QueueItem, reviewer) -> Review:
    """The reviewer passes on this item: it goes to someone else, and not to them again."""
    _check_reviewer(item.queue, reviewer)
    with transaction.atomic():
        review = Review.objects.select_for_update().filter(item=item, reviewer=reviewer).first()
        if review is not None and review.status == ReviewStatus.SUBMITTED:
            raise Conflict("You have reviewed this item; change your answer instead of skipping.")
        review = review or Review(
            project_id=item.project_id, queue=item.queue, item=item, reviewer=reviewer
        )
        review.status, review.reserved_until, review.updated_at = (
            ReviewStatus.SKIPPED,
            None,
            timezone.now(),
        )
        review.save()
    return review


# --- settling ---------------------------------------------------------------------------------


def pair_agreement(values: list[Any]) -> float | None:
    """Share of reviewer pairs that gave the same value, among the reviewers who answered the
    field (two blanks of an optional field are not an agreement); None below two answers."""
    pairs = list(combinations([value for value in values if value is not None], 2))
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def item_agreement(queue: AnnotationQueue, answers: list[dict]) -> float | None:
    """Mean over the label fields of the share of agreeing pairs."""
    shares = [
        pair_agreement([answer.get(field["name"]) for answer in answers])
        for field in label_fields(queue)
    ]
    shares = [share for share in shares if share is not None]
    return sum(shares) / len(shares) if shares else None


def _majority(field: dict, values: list[Any]) -> tuple[bool, Any]:
    """(settled, value): the mode of choices and yes/no answers (a tie does not settle), the
    median of numbers (the lower median for integers)."""
    present = [value for value in values if value is not None]
    if not present:
        return True, None
    if field["type"] in ("integer", "number"):
        middle = (
            statistics.median_low(present)
            if field["type"] == "integer"
            else statistics.median(present)
        )
        return True, middle
    ranked = Counter(present).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return False, None
    return True, ranked[0][0]


def majority(field: dict, values: list[Any]) -> Any:
    """The answer most reviewers gave a label field (None on a tie, or for free text): what
    settles an item by majority, and what the adjudication form starts from."""
    if field["type"] == "string":
        return None
    settled, value = _majority(field, values)
    return value if settled else None


def _gold_values(queue: AnnotationQueue, answers: list[dict]) -> dict | None:
    """The settled answer, or None when a label field has no majority."""
    gold: dict[str, Any] = {}
    for field in form_fields(queue):
        values = [answer.get(field["name"]) for answer in answers]
        if field["type"] in ("string",):
            text = next((value for value in values if value), None)
            settled, value = True, text
        else:
            settled, value = _majority(field, values)
        if not settled:
            return None
        if value is not None:
            gold[field["name"]] = value
    return gold


def _settle_if_complete(item: QueueItem) -> None:
    queue = item.queue
    reviews = list(
        item.reviews.filter(status=ReviewStatus.SUBMITTED).order_by("submitted_at", "pk")
    )
    if len(reviews) < queue.reviewers_per_item:
        return
    answers = [review.outputs for review in reviews]
    item.agreement = item_agreement(queue, answers)
    unanimous = item.agreement is None or item.agreement == 1.0
    gold = _gold_values(queue, answers)
    if unanimous or (gold is not None and item.agreement >= queue.min_agreement):
        by = SettledBy.UNANIMOUS if unanimous else SettledBy.MAJORITY
        _gold_write(item, gold or answers[0], by, reviews, author=None, channel=Channel.WEB)
        return
    item.status, item.updated_at = ItemStatus.ADJUDICATION, timezone.now()
    item.save(update_fields=["agreement", "status", "updated_at"])


def _gold_write(item, outputs, by, reviews, *, author, channel) -> Annotation:
    details = {
        "queue": {"id": item.queue_id, "slug": item.queue.slug},
        "item": item.pk,
        "reviews": [review.pk for review in reviews],
        "settled_by": by,
    }
    if item.gold_id:
        gold = annotation_update(annotation=item.gold, outputs=outputs, author=author)
        Annotation.objects.filter(pk=gold.pk).update(origin=Origin.GOLD, details=details)
    else:
        gold = annotation_create(
            project=item.queue.project,
            evaluator=item.queue.evaluator_id,
            revision=item.queue.revision_id,
            outputs=outputs,
            trace=item.trace,
            origin=Origin.GOLD,
            channel=channel,
            author=author,
        )
        Annotation.objects.filter(pk=gold.pk).update(details=details)
    item.gold_id, item.settled_by, item.status = gold.pk, by, ItemStatus.GOLD
    item.adjudicated_by = author if by == SettledBy.ADJUDICATOR else None
    item.updated_at = timezone.now()
    item.save(
        update_fields=["agreement", "gold", "settled_by", "status", "adjudicated_by", "updated_at"]
    )
    work.reliability_refresh(item.project_id, [item.trace_id])
    return gold


def item_adjudicate(
    *,
    item: QueueItem,
    adjudicator,
    outputs: Any,
    role: str | None = None,
    channel: str = Channel.WEB,
) -> Annotation:
    """The adjudicator's final label for an item the reviewers disagreed on (or a new decision
    on a settled one: the gold label keeps its history)."""
    queue = item.queue
    if not may_adjudicate(queue, adjudicator, role):
        raise InvalidInput(
            {"adjudicator": [f"{adjudicator.username} may not adjudicate this queue."]}, status=403
        )
    value = outputs_validate(outputs, queue.revision)
    with transaction.atomic():
        item = (
            QueueItem.objects.select_for_update(of=("self",))
            .select_related("queue", "gold")
            .get(pk=item.pk)
        )
        if item.status == ItemStatus.OPEN:
            raise Conflict("This item is still collecting reviews.")
        reviews = list(item.reviews.filter(status=ReviewStatus.SUBMITTED))
        gold = _gold_write(
            item, value, SettledBy.ADJUDICATOR, reviews, author=adjudicator, channel=channel
        )
    work.queue_agreement_refresh(queue.pk)
    return gold


# --- progress and agreement ---------------------------------------------------------------------


def queue_progress(queue: AnnotationQueue) -> dict[str, Any]:
    """Items by status, reviews given against reviews needed, and each reviewer's count."""
    by_status = dict(
        queue.items.order_by().values("status").annotate(n=Count("pk")).values_list("status", "n")
    )
    total = sum(by_status.values())
    now = timezone.now()
    per_reviewer = (
        Review.objects.filter(queue=queue)
        .values("reviewer__username")
        .annotate(
            submitted=Count("pk", filter=Q(status=ReviewStatus.SUBMITTED)),
            skipped=Count("pk", filter=Q(status=ReviewStatus.SKIPPED)),
            reserved=Count("pk", filter=Q(status=ReviewStatus.RESERVED, reserved_until__gt=now)),
        )
        .order_by("reviewer__username")
    )
    submitted = sum(row["submitted"] for row in per_reviewer)
    needed = total * queue.reviewers_per_item
    return {
        "items": total,
        "open": by_status.get(ItemStatus.OPEN, 0),
        "adjudication": by_status.get(ItemStatus.ADJUDICATION, 0),
        "gold": by_status.get(ItemStatus.GOLD, 0),
        "reviews": submitted,
        "reviews_needed": needed,
        "percent": round(100 * min(submitted, needed) / needed, 1) if needed else 0.0,
        "reviewers": [
            {
                "reviewer": row["reviewer__username"],
                "submitted": row["submitted"],
                "skipped": row["skipped"],
                "reserved": row["reserved"],
            }
            for row in per_reviewer
        ],
    }


def _order(field: dict) -> list | None:
    return list(field.get("choices") or []) or None


def queue_agreement(queue: AnnotationQueue) -> dict[str, Any]:
    """Per label field: percent agreement, Cohen's kappa (two reviewers), Krippendorff's alpha
    at the field's level of measurement, with 95 % intervals, and the reviewer x reviewer
    table; over the submitted reviews of every item."""
    rows = list(
        Review.objects.filter(queue=queue, status=ReviewStatus.SUBMITTED)
        .order_by("reviewer__username", "item_id")
        .values_list("reviewer__username", "item_id", "outputs")
    )
    reviewers = sorted({name for name, _, _ in rows})
    items = sorted({item for _, item, _ in rows})
    column = {item: i for i, item in enumerate(items)}
    row_of = {name: i for i, name in enumerate(reviewers)}
    fields = {}
    for field in label_fields(queue):
        matrix: list[list[Any]] = [[None] * len(items) for _ in reviewers]
        for name, item, outputs in rows:
            matrix[row_of[name]][column[item]] = (outputs or {}).get(field["name"])
        level = agreement.level_for(field["type"])
        fields[field["name"]] = agreement.agreement_report(
            matrix, reviewers, level, order=_order(field) if level == "ordinal" else None
        )
    return {"reviewers": reviewers, "items": len(items), "fields": fields}


def queue_agreement_refresh(*, queue: AnnotationQueue) -> AnnotationQueue:
    queue.agreement = queue_agreement(queue)
    queue.agreement_refreshed_at = timezone.now()
    AnnotationQueue.objects.filter(pk=queue.pk).update(
        agreement=queue.agreement, agreement_refreshed_at=queue.agreement_refreshed_at
    )
    return queue


def queue_agreement_refresh_by_id(*, queue_id: int) -> None:
    queue = AnnotationQueue.objects.filter(pk=queue_id).select_related("revision").first()
    if queue is not None:  # deleted meanwhile: nothing to do
        queue_agreement_refresh(queue=queue)
