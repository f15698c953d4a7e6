"""REST API for human review: annotation queues and their items, reserving the next item,
reviews, adjudication, the agreement report, gold labels out (JSON, CSV, JSONL, a testset
version), and reliability records of evaluator revisions against the gold (docs/annotation.md).

Reviewing and adjudicating are open to every role at the door (viewers review); the services
check that the caller is a reviewer or adjudicator of the queue and answer 403 naming
`reviewer` / `adjudicator` otherwise. A request with an API key acts as the key's creator.
"""

from __future__ import annotations

import csv
import json

from django.http import Http404
from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evalsite.rest import CursorPagination
from evaluators import selectors as evaluator_selectors
from evaluators.models import EvaluatorRevision
from runs import exports, review, selectors, testsets
from runs.api.compare import EXPORT_RENDERERS
from runs.api.results import AnnotationSerializer
from runs.api.testsets import TestsetVersionSerializer
from runs.api.traces import TraceSummarySerializer
from runs.models import (
    Annotation,
    AnnotationQueue,
    ItemSource,
    ItemStatus,
    Origin,
    QueueItem,
    Review,
    ReviewStatus,
    Span,
)

QUEUE_TAGS = ["annotation queues"]
RELIABILITY_TAGS = ["reliability"]
MAX_FRESH_REVIEWS = 2_000  # ?fresh=true computes agreement in the request up to this many
MAX_ID = 2**63 - 1
GOLD_PAGE, GOLD_PAGE_MAX = 100, 1_000
AUTO_SHOWN = 50  # automatic verdicts shown beside an item

QUEUE_REF = OpenApiParameter(
    "queue_ref", str, OpenApiParameter.PATH, description="Queue id or slug."
)
ITEM_ID = OpenApiParameter("item_id", int, OpenApiParameter.PATH)
EVALUATOR_REF = OpenApiParameter(
    "evaluator_ref", str, OpenApiParameter.PATH, description="Evaluator id or slug."
)
REVIEW_ERRORS = {
    **ERROR_RESPONSES,
    403: OpenApiResponse(
        description="Your role does not allow this, or you are not a reviewer (adjudicator) "
        "of this queue: `error.fields.reviewer` (`adjudicator`) says so."
    ),
    409: OpenApiResponse(description="The item is settled, or has all its reviews already."),
    422: OpenApiResponse(description="The outputs break the form: `error.fields.outputs`."),
}

# --- serializers --------------------------------------------------------------------------------


class FormFieldSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(
        choices=["boolean", "categorical", "integer", "number", "string"]
    )
    description = serializers.CharField(required=False)
    required = serializers.BooleanField(required=False)
    min = serializers.FloatField(required=False, allow_null=True)
    max = serializers.FloatField(required=False, allow_null=True)
    choices = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)


class ReviewerProgressSerializer(serializers.Serializer):
    reviewer = serializers.CharField()
    submitted = serializers.IntegerField()
    skipped = serializers.IntegerField()
    reserved = serializers.IntegerField()


class QueueProgressSerializer(serializers.Serializer):
    items = serializers.IntegerField()
    open = serializers.IntegerField(help_text="Items still collecting reviews.")
    adjudication = serializers.IntegerField(help_text="Items waiting for an adjudicator.")
    gold = serializers.IntegerField(help_text="Settled items.")
    reviews = serializers.IntegerField(help_text="Reviews submitted.")
    reviews_needed = serializers.IntegerField(help_text="Items x reviewers per item.")
    percent = serializers.FloatField()
    reviewers = ReviewerProgressSerializer(many=True)


class QueueSerializer(serializers.ModelSerializer):
    evaluator = serializers.SerializerMethodField()
    revision = serializers.SerializerMethodField(help_text="The form's revision (pinned).")
    reviewers = serializers.SlugRelatedField(slug_field="username", many=True, read_only=True)
    adjudicators = serializers.SlugRelatedField(slug_field="username", many=True, read_only=True)
    form = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = AnnotationQueue
        fields = [
            "id",
            "slug",
            "name",
            "instructions",
            "evaluator",
            "revision",
            "reviewers_per_item",
            "blind",
            "min_agreement",
            "reservation_seconds",
            "reviewers",
            "adjudicators",
            "trace_filter",
            "sampling_rate",
            "archived",
            "form",
            "progress",
            "agreement_refreshed_at",
            "created_by",
            "created_at",
            "updated_at",
        ]

    def get_evaluator(self, queue) -> dict:
        return {"id": queue.evaluator_id, "slug": queue.evaluator.slug}

    def get_revision(self, queue) -> dict:
        return queue.revision.reference

    @extend_schema_field(FormFieldSerializer(many=True))
    def get_form(self, queue) -> list:
        return review.form_fields(queue)

    @extend_schema_field(QueueProgressSerializer)
    def get_progress(self, queue) -> dict:
        return review.queue_progress(queue)


class _QueueSettings(serializers.Serializer):
    """Settings a queue is made with and may change (each optional: the services' defaults
    apply at creation, the current values at a change). The services check the ranges."""

    name = serializers.CharField(max_length=200, required=False)
    instructions = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=20_000,
        help_text="Markdown, shown beside the form.",
    )
    reviewers_per_item = serializers.IntegerField(
        required=False, help_text="1 to 5 reviews an item (default 2)."
    )
    blind = serializers.BooleanField(
        required=False,
        help_text="Reviewers see neither the other reviews nor the automatic verdicts until "
        "they submit (default true).",
    )
    min_agreement = serializers.FloatField(
        required=False,
        help_text="0..1: items whose reviewers agree less go to an adjudicator (default 1.0: "
        "every disagreement).",
    )
    reservation_seconds = serializers.IntegerField(
        required=False, help_text="How long `next` holds an item for you (30 s to 7 days)."
    )
    reviewers = serializers.ListField(
        child=serializers.CharField(max_length=150),
        required=False,
        max_length=500,
        help_text="Usernames of project members; none listed: every member may review.",
    )
    adjudicators = serializers.ListField(
        child=serializers.CharField(max_length=150),
        required=False,
        max_length=500,
        help_text="Usernames of project members; none listed: the project's owners adjudicate.",
    )
    trace_filter = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="Online feed: new traces matching {name, attributes, since, until} join "
        "(null: no feed).",
    )
    sampling_rate = serializers.FloatField(
        required=False, help_text="Online feed: share of matches, 0..1 (default 1)."
    )


class QueueCreateSerializer(_QueueSettings):
    name = serializers.CharField(max_length=200)
    slug = serializers.CharField(
        max_length=100, required=False, allow_blank=True, help_text="Made from the name if empty."
    )
    evaluator = serializers.CharField(
        max_length=200, help_text="A human-feedback evaluator's id or slug: its form."
    )


class QueueUpdateSerializer(_QueueSettings):
    archived = serializers.BooleanField(required=False)


class GoldSerializer(AnnotationSerializer):
    origin = serializers.CharField(read_only=True, help_text="gold")
    channel = serializers.CharField(read_only=True, help_text="web or api")

    class Meta(AnnotationSerializer.Meta):
        fields = [*AnnotationSerializer.Meta.fields, "details"]


class QueueItemSerializer(serializers.ModelSerializer):
    status = serializers.CharField(read_only=True, help_text="open, adjudication or gold")
    trace_id = serializers.CharField(source="trace.trace_id", read_only=True)
    run = serializers.IntegerField(source="run_id", allow_null=True, read_only=True)
    scenario = serializers.IntegerField(
        source="scenario.index",
        allow_null=True,
        default=None,
        read_only=True,
        help_text="The scenario's index in the run.",
    )
    adjudicated_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    gold = GoldSerializer(read_only=True, allow_null=True, help_text="The settled label.")

    class Meta:
        model = QueueItem
        fields = [
            "id",
            "position",
            "status",
            "source",
            "trace_id",
            "run",
            "scenario",
            "agreement",
            "settled_by",
            "adjudicated_by",
            "gold",
            "created_at",
            "updated_at",
        ]


class ReviewSerializer(serializers.ModelSerializer):
    status = serializers.CharField(read_only=True, help_text="reserved, submitted or skipped")
    reviewer = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Review
        fields = [
            "id",
            "item",
            "reviewer",
            "status",
            "outputs",
            "reserved_until",
            "submitted_at",
            "updated_at",
        ]


class VerdictSerializer(serializers.Serializer):
    evaluator = serializers.CharField(help_text="The evaluator's slug.")
    revision = serializers.JSONField(help_text="{id, slug, version}")
    outputs = serializers.JSONField()
    origin = serializers.CharField()


class QueueItemDetailSerializer(QueueItemSerializer):
    """An item as a reviewer reads it. The view puts in the context what the caller may see
    (``visible``), their own review (``mine``) and the root span's data (``data``)."""

    queue = serializers.SerializerMethodField()
    inputs = serializers.SerializerMethodField()
    outputs = serializers.SerializerMethodField()
    trace = TraceSummarySerializer(read_only=True)
    form = serializers.SerializerMethodField()
    reserved_until = serializers.SerializerMethodField(
        help_text="Until when the item is held for you (null when you hold no reservation)."
    )
    others_visible = serializers.SerializerMethodField(
        help_text="False in a blind queue until you submit: `reviews` then holds yours only, "
        "and `auto` is empty."
    )
    reviews = serializers.SerializerMethodField()
    auto = serializers.SerializerMethodField(help_text="Automatic verdicts on the trace.")

    class Meta(QueueItemSerializer.Meta):
        fields = [
            *QueueItemSerializer.Meta.fields,
            "queue",
            "inputs",
            "outputs",
            "trace",
            "form",
            "reserved_until",
            "others_visible",
            "reviews",
            "auto",
        ]

    def get_queue(self, item) -> dict:
        return {"id": item.queue_id, "slug": item.queue.slug, "name": item.queue.name}

    @extend_schema_field(OpenApiTypes.ANY)
    def get_inputs(self, item):
        return self.context["data"].get("inputs")

    @extend_schema_field(OpenApiTypes.ANY)
    def get_outputs(self, item):
        return self.context["data"].get("outputs")

    @extend_schema_field(FormFieldSerializer(many=True))
    def get_form(self, item) -> list:
        return review.form_fields(item.queue)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_reserved_until(self, item):
        mine = self.context["mine"]
        if mine is None or mine.status != ReviewStatus.RESERVED:
            return None
        return serializers.DateTimeField().to_representation(mine.reserved_until)

    def get_others_visible(self, item) -> bool:
        return self.context["visible"]

    @extend_schema_field(ReviewSerializer(many=True))
    def get_reviews(self, item) -> list:
        if self.context["visible"]:
            reviews = item.reviews.exclude(status=ReviewStatus.RESERVED).select_related("reviewer")
        else:
            mine = self.context["mine"]
            reviews = [mine] if mine and mine.status != ReviewStatus.RESERVED else []
        return ReviewSerializer(reviews, many=True).data

    @extend_schema_field(VerdictSerializer(many=True))
    def get_auto(self, item) -> list:
        if not self.context["visible"]:
            return []
        verdicts = (
            Annotation.objects.filter(trace_id=item.trace_id, origin=Origin.AUTO)
            .select_related("revision")
            .order_by("evaluator_slug", "-created_at")[:AUTO_SHOWN]
        )
        return [
            {
                "evaluator": verdict.evaluator_slug,
                "revision": verdict.revision.reference if verdict.revision else None,
                "outputs": verdict.outputs,
                "origin": verdict.origin,
            }
            for verdict in verdicts
        ]


class ItemsAddSerializer(serializers.Serializer):
    run = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_ID, help_text="A run of this project."
    )
    selection = serializers.DictField(
        required=False,
        help_text="With `run`: which scenarios, `{select: all|failed|errors|metric_range|"
        "disagreement, step, metric, min, max, step_b, metric_b, n, seed}` (default all).",
    )
    scenarios = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2**31 - 1),
        required=False,
        max_length=review.ITEMS_PER_ADD,
        help_text="With `run`: scenario indexes.",
    )
    trace_ids = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        max_length=review.ITEMS_PER_ADD,
        help_text="Trace ids of this project (alone, without `run`).",
    )

    def validate(self, data):
        if "trace_ids" in data:
            extra = [name for name in ("run", "selection", "scenarios") if name in data]
            if extra:
                raise serializers.ValidationError(
                    {"trace_ids": [f"Send trace_ids alone, without {', '.join(extra)}."]}
                )
        elif "run" not in data:
            raise serializers.ValidationError(
                {"run": ["Send {run, selection}, {run, scenarios} or {trace_ids}."]}
            )
        elif "selection" in data and "scenarios" in data:
            raise serializers.ValidationError(
                {"scenarios": ["Send either selection or scenarios, not both."]}
            )
        return data


ADDED = inline_serializer("QueueItemsAdded", {"added": serializers.IntegerField()})


class ReviewSubmitSerializer(serializers.Serializer):
    outputs = serializers.JSONField(
        required=False, help_text="The form's answers: {field name: value}."
    )
    skip = serializers.BooleanField(
        required=False, default=False, help_text="Pass on the item: it goes to someone else."
    )

    def validate(self, data):
        if data["skip"] and "outputs" in data:
            raise serializers.ValidationError({"skip": ["Send outputs or skip, not both."]})
        if not data["skip"] and "outputs" not in data:
            raise serializers.ValidationError({"outputs": ["This field is required."]})
        return data


class AdjudicateSerializer(serializers.Serializer):
    outputs = serializers.JSONField(help_text="The final label: {field name: value}.")


AGREEMENT = inline_serializer(
    "QueueAgreement",
    {
        "agreement": serializers.JSONField(
            help_text="{reviewers, items, fields: {name: {level, items, reviews, "
            "percent_agreement, cohen_kappa, krippendorff_alpha (each {value, ci}), pairs}}}"
        ),
        "refreshed_at": serializers.DateTimeField(allow_null=True),
        "fresh": serializers.BooleanField(help_text="Computed for this request."),
    },
)
GOLD_PAGE_SHAPE = inline_serializer(
    "QueueGoldPage",
    {
        "columns": serializers.ListField(child=serializers.CharField()),
        "count": serializers.IntegerField(help_text="Settled items."),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": serializers.ListField(
            child=serializers.DictField(),
            help_text="{item, trace_id, run, scenario, testcase, settled_by, adjudicated_by, "
            "agreement, reviews, annotation, <form fields>}",
        ),
    },
)


class GoldTestsetSerializer(serializers.Serializer):
    testset = serializers.CharField(max_length=200, help_text="Testset id or slug.")
    prefix = serializers.CharField(
        max_length=40,
        required=False,
        allow_blank=True,
        default="gold_",
        help_text="The new columns are <prefix><field>.",
    )


class ReliabilityRecordSerializer(serializers.Serializer):
    gold_evaluator = serializers.CharField(source="gold_evaluator.slug")
    output_field = serializers.CharField(help_text="The revision's output.")
    gold_field = serializers.CharField(help_text="The gold label's field.")
    type = serializers.ChoiceField(choices=["binary", "numeric", "categorical"])
    items = serializers.IntegerField(help_text="Gold items the figures rest on.")
    figures = serializers.JSONField(
        help_text="binary: confusion, accuracy, precision, recall, specificity, f1, kappa; "
        "numeric: pearson, spearman, mae; categorical: labels, confusion, accuracy, kappa; "
        "each figure {value, ci}; and consistency across repeats."
    )
    computed_at = serializers.DateTimeField()


class RevisionReliabilitySerializer(serializers.Serializer):
    revision = serializers.JSONField(help_text="{id, slug, version}")
    records = ReliabilityRecordSerializer(many=True)


RELIABILITY = inline_serializer(
    "EvaluatorReliability",
    {
        "evaluator": serializers.JSONField(help_text="{id, slug}"),
        "revisions": RevisionReliabilitySerializer(many=True),
        "compare": serializers.ListField(
            child=serializers.DictField(),
            help_text="For each pairing measured in two revisions or more: {gold_evaluator, "
            "output_field, gold_field, type, revisions: [{revision, items, <headline figures>}]}"
            " (binary: kappa, f1; numeric: spearman, mae; categorical: kappa).",
        ),
    },
)
HEADLINES = {"binary": ("kappa", "f1"), "numeric": ("spearman", "mae"), "categorical": ("kappa",)}


class ReliabilityRefreshSerializer(serializers.Serializer):
    revision = serializers.CharField(
        max_length=200, required=False, help_text="Version number or slug; the head by default."
    )


class ItemPagination(CursorPagination):
    ordering = "position"


# --- lookups ------------------------------------------------------------------------------------


ITEM_RELATED = ("queue", "trace", "scenario", "adjudicated_by", "gold__revision", "gold__trace")


def _number(text: str, high: int = MAX_ID) -> int | None:
    """``text`` as a whole number up to ``high``, else None (a slug, or too large to store)."""
    return int(text) if text.isdecimal() and len(text) <= 19 and int(text) <= high else None


def _queues(request):
    return AnnotationQueue.objects.for_project(request.project).select_related(
        "evaluator", "revision", "project", "created_by"
    )


def _queue_or_404(request, ref: str) -> AnnotationQueue:
    """By slug, else by id (a slug wins over an id that looks the same)."""
    queue = _queues(request).filter(slug=ref).first()
    if queue is None and _number(ref) is not None:
        queue = _queues(request).filter(pk=_number(ref)).first()
    if queue is None:
        raise Http404
    return queue


def _item_or_404(queue: AnnotationQueue, item_id: int) -> QueueItem:
    item = (
        QueueItem.objects.filter(queue=queue, pk=item_id).select_related(*ITEM_RELATED).first()
        if item_id <= MAX_ID
        else None
    )
    if item is None:
        raise Http404
    return item


def _renamed(exc: InvalidInput) -> InvalidInput:
    """The online filter's errors name `filter`; here the field is `trace_filter`."""
    fields = {
        (f"trace_{name}" if name.split(".")[0] == "filter" else name): reasons
        for name, reasons in exc.fields.items()
    }
    return InvalidInput(fields, status=exc.status)


def _queue_body(request, queue: AnnotationQueue, code: int = 200) -> Response:
    return Response(QueueSerializer(_queues(request).get(pk=queue.pk)).data, status=code)


def _item_body(request, item: QueueItem) -> dict:
    user = request.user
    mine = Review.objects.filter(item=item, reviewer_id=getattr(user, "pk", None)).first()
    adjudicator = review.may_adjudicate(item.queue, user, request.role)
    context = {
        "visible": review.sees_others(item, user, adjudicator=adjudicator),
        "mine": mine,
        "data": _root_data(item),
    }
    return QueueItemDetailSerializer(item, context=context).data


def _root_data(item: QueueItem) -> dict:
    """The root span's `ag.data` ({inputs, outputs, ...}): what the reviewer judges."""
    spans = Span.objects.filter(trace_id=item.trace_id, trace_time=item.trace.created_at)
    root = item.trace.root_span_id
    attributes = (
        (spans.filter(span_id=root) if root else spans.filter(parent_id="").order_by("start_time"))
        .values_list("attributes", flat=True)
        .first()
    )
    data = ((attributes or {}).get("ag") or {}).get("data")
    return data if isinstance(data, dict) else {}


def _revision_or_400(evaluator, ref: str | None) -> EvaluatorRevision:
    if ref is None:
        if evaluator.head is None:
            raise InvalidInput({"revision": [f"{evaluator.slug} has no revision yet."]})
        return evaluator.head
    revisions = evaluator.revisions.all()
    found = revisions.filter(slug=ref).first()
    if found is None and _number(ref, 2**31 - 1) is not None:
        found = revisions.filter(version=_number(ref)).first()
    if found is None:
        raise InvalidInput({"revision": [f"{evaluator.slug} has no revision {ref!r}."]})
    return found


def _evaluator_or_404(request, ref: str):
    if ref.isdecimal() and _number(ref) is None:
        raise Http404
    evaluator = evaluator_selectors.evaluator_get(project=request.project, ref=ref)
    if evaluator is None:
        raise Http404
    return evaluator


def _flag(request, name: str) -> bool | None:
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise InvalidInput({name: ["Use true or false."]})


def _bounded_int(request, name: str, default: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    number = _number(raw, high)
    if number is None:
        raise InvalidInput({name: [f"A whole number from 0 to {high}."]})
    return number


# --- queues -------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    parameters=[
        OpenApiParameter("archived", bool, description="Archived queues (default: active ones).")
    ],
    responses={200: QueueSerializer(many=True), **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@extend_schema(
    methods=["POST"],
    request=QueueCreateSerializer,
    responses={201: QueueSerializer, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@api_view(["GET", "POST"])
def queues(request):
    """Annotation queues: items reviewed by people with a human-feedback evaluator's form,
    each by `reviewers_per_item` reviewers; disagreements go to an adjudicator and every
    settled item gets a gold label."""
    if request.method == "POST":
        body = QueueCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            queue = review.queue_create(
                project=request.project, author=request.user, **body.validated_data
            )
        except InvalidInput as exc:
            raise _renamed(exc)
        return _queue_body(request, queue, status.HTTP_201_CREATED)
    listed = (
        _queues(request)
        .filter(archived=bool(_flag(request, "archived")))
        .prefetch_related("reviewers", "adjudicators")
    )
    paginator = CursorPagination()
    page = paginator.paginate_queryset(listed, request)
    return paginator.get_paginated_response(QueueSerializer(page, many=True).data)


@extend_schema(
    methods=["GET"],
    parameters=[QUEUE_REF],
    responses={200: QueueSerializer, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@extend_schema(
    methods=["PATCH"],
    parameters=[QUEUE_REF],
    request=QueueUpdateSerializer,
    responses={200: QueueSerializer, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@api_view(["GET", "PATCH"])
def queue_detail(request, queue_ref):
    """A queue's settings, members, form and progress. PATCH changes settings and members
    (the form stays the one the queue was made with: reviews given were answers to it)."""
    queue = _queue_or_404(request, queue_ref)
    if request.method == "PATCH":
        body = QueueUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changes = dict(body.validated_data)
        if "trace_filter" not in changes:
            changes["trace_filter"] = "unchanged"
        try:
            review.queue_update(queue=queue, **changes)
        except InvalidInput as exc:
            raise _renamed(exc)
    return _queue_body(request, queue)


# --- items --------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    parameters=[
        QUEUE_REF,
        OpenApiParameter("status", str, enum=list(ItemStatus.values)),
    ],
    responses={200: QueueItemSerializer(many=True), **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@extend_schema(
    methods=["POST"],
    parameters=[QUEUE_REF],
    request=ItemsAddSerializer,
    responses={201: ADDED, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@api_view(["GET", "POST"])
def queue_items(request, queue_ref):
    """The queue's items in review order. POST adds items, one of three ways: a run's
    scenarios chosen by `selection`, a run's scenarios by index (`scenarios`), or traces by
    id (`trace_ids`). Items already in the queue are skipped; `added` counts the new ones."""
    queue = _queue_or_404(request, queue_ref)
    if request.method == "POST":
        body = ItemsAddSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response({"added": _items_add(request, queue, body.validated_data)}, status=201)
    items = QueueItem.objects.filter(queue=queue).select_related(*ITEM_RELATED)
    wanted = request.query_params.get("status")
    if wanted:
        if wanted not in ItemStatus.values:
            raise InvalidInput({"status": [f"One of {', '.join(ItemStatus.values)}."]})
        items = items.filter(status=wanted)
    paginator = ItemPagination()
    page = paginator.paginate_queryset(items, request)
    return paginator.get_paginated_response(QueueItemSerializer(page, many=True).data)


def _items_add(request, queue: AnnotationQueue, data: dict) -> int:
    if "trace_ids" in data:
        return review.items_add_traces(queue=queue, trace_ids=data["trace_ids"])
    run = selectors.run_get(project=request.project, run_id=data["run"])
    if run is None:
        raise InvalidInput({"run": [f"No run {data['run']} in this project."]})
    if "scenarios" in data:
        return review.items_add_scenarios(
            queue=queue, run=run, indexes=data["scenarios"], source=ItemSource.API
        )
    return review.items_add_from_run(queue=queue, run=run, selection=data.get("selection"))


@extend_schema(
    request=None,
    parameters=[QUEUE_REF],
    responses={
        200: QueueItemDetailSerializer,
        204: OpenApiResponse(description="Nothing left for you to review."),
        **REVIEW_ERRORS,
    },
    tags=QUEUE_TAGS,
)
@api_view(["POST"])
def queue_next(request, queue_ref):
    """Reserve your next item for the queue's reservation time and read it: the one you hold
    already, else the first open item you have not seen that still needs reviews. In a blind
    queue the other reviews and the automatic verdicts stay hidden until you submit."""
    queue = _queue_or_404(request, queue_ref)
    item = review.item_next(queue=queue, reviewer=request.user)
    if item is None:
        return Response(status=status.HTTP_204_NO_CONTENT)
    return Response(_item_body(request, _item_or_404(queue, item.pk)))


@extend_schema(
    parameters=[QUEUE_REF, ITEM_ID],
    responses={200: QueueItemDetailSerializer, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@api_view(["GET"])
def queue_item(request, queue_ref, item_id):
    """One item with its reviews (in a blind queue, only yours until you submit) and its gold
    label once settled."""
    queue = _queue_or_404(request, queue_ref)
    return Response(_item_body(request, _item_or_404(queue, item_id)))


@extend_schema(
    parameters=[QUEUE_REF, ITEM_ID],
    request=ReviewSubmitSerializer,
    responses={201: ReviewSerializer, **REVIEW_ERRORS},
    tags=QUEUE_TAGS,
)
@api_view(["POST"])
def queue_item_review(request, queue_ref, item_id):
    """Submit your review (`outputs`, checked against the form; submitting again changes it
    while the item is open) or pass on the item (`skip: true`). The item settles once it has
    all its reviews: unanimous (or agreeing at least `min_agreement`) gives the gold label,
    otherwise it waits for an adjudicator."""
    item = _item_or_404(_queue_or_404(request, queue_ref), item_id)
    body = ReviewSubmitSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    if body.validated_data["skip"]:
        given = review.review_skip(item=item, reviewer=request.user)
    else:
        given = review.review_submit(
            item=item, reviewer=request.user, outputs=body.validated_data["outputs"]
        )
    return Response(ReviewSerializer(given).data, status=status.HTTP_201_CREATED)


@extend_schema(
    parameters=[QUEUE_REF, ITEM_ID],
    request=AdjudicateSerializer,
    responses={200: GoldSerializer, **REVIEW_ERRORS},
    tags=QUEUE_TAGS,
)
@api_view(["POST"])
def queue_item_adjudicate(request, queue_ref, item_id):
    """Settle an item the reviewers disagreed on (or decide a settled one again: the gold
    label keeps its history). Listed adjudicators may; a queue that lists none lets the
    project's owners. Answers the gold label (`details.settled_by`, `details.reviews`)."""
    item = _item_or_404(_queue_or_404(request, queue_ref), item_id)
    body = AdjudicateSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    gold = review.item_adjudicate(
        item=item,
        adjudicator=request.user,
        outputs=body.validated_data["outputs"],
        role=request.role,
        channel="api",
    )
    gold = Annotation.objects.select_related("revision", "trace").get(pk=gold.pk)
    return Response(GoldSerializer(gold).data)


# --- agreement and gold ---------------------------------------------------------------------------


@extend_schema(
    parameters=[
        QUEUE_REF,
        OpenApiParameter(
            "fresh",
            bool,
            description=f"Compute it now (queues with at most {MAX_FRESH_REVIEWS} reviews; "
            "larger ones are refreshed in the background a moment after reviews land).",
        ),
    ],
    responses={200: AGREEMENT, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@api_view(["GET"])
def queue_agreement(request, queue_ref):
    """How far the reviewers agree, per label field: percent agreement, Cohen's kappa (two
    reviewers), Krippendorff's alpha, each with a 95 % interval, and the reviewer pairs. The
    stored report is refreshed in the background after reviews land."""
    queue = _queue_or_404(request, queue_ref)
    if not _flag(request, "fresh"):
        return Response(
            {
                "agreement": queue.agreement,
                "refreshed_at": queue.agreement_refreshed_at,
                "fresh": False,
            }
        )
    reviews = Review.objects.filter(queue=queue, status=ReviewStatus.SUBMITTED).count()
    if reviews > MAX_FRESH_REVIEWS:
        raise InvalidInput(
            {
                "fresh": [
                    f"{reviews} reviews: too many to compute in a request (at most "
                    f"{MAX_FRESH_REVIEWS}). The background refresh keeps the stored report; "
                    "read it without fresh."
                ]
            }
        )
    # Nothing to agree on before the first review (and the statistics want a reviewer).
    report = (
        review.queue_agreement(queue) if reviews else {"reviewers": [], "items": 0, "fields": {}}
    )
    return Response({"agreement": report, "refreshed_at": timezone.now(), "fresh": True})


@extend_schema(
    parameters=[
        QUEUE_REF,
        OpenApiParameter(
            "format", str, enum=["json", "csv", "jsonl"], description="json (default), csv, jsonl."
        ),
        OpenApiParameter("limit", int, description=f"json: rows a page (at most {GOLD_PAGE_MAX})."),
        OpenApiParameter("offset", int, description="json: the first row."),
    ],
    responses={
        (200, "application/json"): GOLD_PAGE_SHAPE,
        (200, "text/csv"): OpenApiTypes.STR,
        (200, "application/x-ndjson"): OpenApiTypes.STR,
        **ERROR_RESPONSES,
    },
    tags=QUEUE_TAGS,
)
@api_view(["GET"])
@renderer_classes(EXPORT_RENDERERS)
def queue_gold(request, queue_ref):
    """The gold labels: one row per settled item (where it came from, how it was settled, the
    label's fields). JSON is paginated by limit/offset; CSV and JSONL stream every row."""
    queue = _queue_or_404(request, queue_ref)
    fmt = request.accepted_renderer.format
    if fmt in exports.FORMATS:
        chunks = _gold_csv(queue) if fmt == "csv" else _gold_jsonl(queue)
        return exports.stream_response(chunks, fmt=fmt, filename=f"{queue.slug}-gold")
    limit = _bounded_int(request, "limit", GOLD_PAGE, GOLD_PAGE_MAX) or GOLD_PAGE
    offset = _bounded_int(request, "offset", 0, MAX_ID)
    count = QueueItem.objects.filter(
        queue=queue, status=ItemStatus.GOLD, gold__isnull=False
    ).count()
    url = request.build_absolute_uri()
    rows = list(review.gold_rows(queue, offset=offset, limit=limit))
    return Response(
        {
            "columns": review.gold_columns(queue),
            "count": count,
            "next": replace_query_param(url, "offset", offset + limit)
            if offset + limit < count
            else None,
            "previous": _previous(url, offset, limit),
            "results": rows,
        }
    )


def _previous(url: str, offset: int, limit: int) -> str | None:
    if offset <= 0:
        return None
    if offset - limit <= 0:
        return remove_query_param(url, "offset")
    return replace_query_param(url, "offset", offset - limit)


class _Line:
    def write(self, value: str) -> str:
        return value


def _gold_csv(queue: AnnotationQueue):
    writer = csv.writer(_Line())
    columns = review.gold_columns(queue)
    yield writer.writerow(columns)
    for row in review.gold_rows(queue):
        yield writer.writerow([exports.csv_cell(row.get(name)) for name in columns])


def _gold_jsonl(queue: AnnotationQueue):
    for row in review.gold_rows(queue):
        yield json.dumps(row, ensure_ascii=False, default=str) + "\n"


@extend_schema(
    parameters=[QUEUE_REF],
    request=GoldTestsetSerializer,
    responses={201: TestsetVersionSerializer, **ERROR_RESPONSES},
    tags=QUEUE_TAGS,
)
@api_view(["POST"])
def queue_gold_testset(request, queue_ref):
    """A new version of the testset whose rows gain `<prefix><field>` columns from the gold
    labels of items that came from runs over it (matched by testcase)."""
    queue = _queue_or_404(request, queue_ref)
    body = GoldTestsetSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    ref = body.validated_data["testset"]
    testset = testsets.testset_get(project=request.project, ref=ref)
    if testset is None:
        raise InvalidInput({"testset": [f"No testset {ref!r} in this project."]})
    version = review.gold_to_testset(
        queue=queue,
        testset=testset,
        prefix=body.validated_data["prefix"],
        author=request.user if getattr(request.user, "pk", None) else None,
    )
    return Response(TestsetVersionSerializer(version).data, status=status.HTTP_201_CREATED)


# --- reliability ----------------------------------------------------------------------------------


@extend_schema(
    parameters=[
        EVALUATOR_REF,
        OpenApiParameter("revision", str, description="One revision: its version or slug."),
    ],
    responses={200: RELIABILITY, **ERROR_RESPONSES},
    tags=RELIABILITY_TAGS,
)
@api_view(["GET"])
def reliability(request, evaluator_ref):
    """How far each revision of the evaluator (newest first) agrees with the gold labels of
    human review, per pairing of its output with a gold field; `compare` lines up the headline
    figures of pairings measured in two revisions or more."""
    evaluator = _evaluator_or_404(request, evaluator_ref)
    ref = request.query_params.get("revision")
    revisions = (
        [_revision_or_400(evaluator, ref)]
        if ref
        else list(evaluator.revisions.order_by("-version"))
    )
    records = review.records_for(revisions)
    return Response(
        {
            "evaluator": {"id": evaluator.pk, "slug": evaluator.slug},
            "revisions": [_revision_records(r, records.get(r.pk, [])) for r in revisions],
            "compare": _compare(revisions, records),
        }
    )


def _revision_records(revision: EvaluatorRevision, records: list) -> dict:
    return {
        "revision": revision.reference,
        "records": ReliabilityRecordSerializer(records, many=True).data,
    }


def _compare(revisions: list[EvaluatorRevision], records: dict[int, list]) -> list[dict]:
    pairings: dict[tuple, dict] = {}
    for revision in revisions:
        for record in records.get(revision.pk, []):
            key = (record.gold_evaluator.slug, record.output_field, record.gold_field)
            entry = pairings.setdefault(
                key,
                {
                    "gold_evaluator": key[0],
                    "output_field": key[1],
                    "gold_field": key[2],
                    "type": record.type,
                    "revisions": [],
                },
            )
            headline = {name: record.figures.get(name) for name in HEADLINES.get(record.type, ())}
            entry["revisions"].append(
                {"revision": revision.reference, "items": record.items, **headline}
            )
    return [entry for entry in pairings.values() if len(entry["revisions"]) >= 2]


@extend_schema(
    parameters=[EVALUATOR_REF],
    request=ReliabilityRefreshSerializer,
    responses={200: RevisionReliabilitySerializer, **ERROR_RESPONSES},
    tags=RELIABILITY_TAGS,
)
@api_view(["POST"])
def reliability_refresh(request, evaluator_ref):
    """Recompute a revision's records (the head by default) against every gold evaluator of
    the project, now, and answer them. Records also refresh by themselves when gold labels
    change or a run's verdicts land; this request refuses revisions with more than
    5,000 verdicts on gold-labelled traces."""
    evaluator = _evaluator_or_404(request, evaluator_ref)
    body = ReliabilityRefreshSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    revision = _revision_or_400(evaluator, body.validated_data.get("revision"))
    verdicts = review.gold_verdicts(revision).count()
    if verdicts > review.INLINE_VERDICTS:
        raise InvalidInput(
            {
                "revision": [
                    f"{revision.slug} has {verdicts} verdicts on gold-labelled traces: too many "
                    f"to compute in a request (at most {review.INLINE_VERDICTS}). Its records "
                    "refresh in the background when gold labels change or runs finish."
                ]
            }
        )
    records = review.reliability_refresh(revision=revision)
    return Response(_revision_records(revision, records))


urlpatterns = [
    path("annotation-queues", queues, name="api-queues"),
    path("annotation-queues/<str:queue_ref>", queue_detail, name="api-queue"),
    path("annotation-queues/<str:queue_ref>/items", queue_items, name="api-queue-items"),
    path("annotation-queues/<str:queue_ref>/next", queue_next, name="api-queue-next"),
    path(
        "annotation-queues/<str:queue_ref>/items/<int:item_id>",
        queue_item,
        name="api-queue-item",
    ),
    path(
        "annotation-queues/<str:queue_ref>/items/<int:item_id>/review",
        queue_item_review,
        name="api-queue-item-review",
    ),
    path(
        "annotation-queues/<str:queue_ref>/items/<int:item_id>/adjudicate",
        queue_item_adjudicate,
        name="api-queue-item-adjudicate",
    ),
    path(
        "annotation-queues/<str:queue_ref>/agreement",
        queue_agreement,
        name="api-queue-agreement",
    ),
    path("annotation-queues/<str:queue_ref>/gold", queue_gold, name="api-queue-gold"),
    path(
        "annotation-queues/<str:queue_ref>/gold/testset",
        queue_gold_testset,
        name="api-queue-gold-testset",
    ),
    path("evaluators/<str:evaluator_ref>/reliability", reliability, name="api-reliability"),
    path(
        "evaluators/<str:evaluator_ref>/reliability/refresh",
        reliability_refresh,
        name="api-reliability-refresh",
    ),
]
