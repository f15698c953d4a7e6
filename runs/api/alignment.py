"""REST API for judge alignments: plan (``dry_run``) or start one, read it, accept or discard
its candidate (docs/annotation.md)."""

from __future__ import annotations

from django.db.models import Q
from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import BUSY_RESPONSES, ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evalsite.rest import CursorPagination
from evaluators import selectors as evaluator_selectors
from runs import review
from runs.models import AlignmentStatus, AnnotationQueue, JudgeAlignment

TAGS = ["alignments"]
ALIGNMENT_ID = OpenApiParameter("alignment_id", int, OpenApiParameter.PATH)
CONFLICT = {409: OpenApiResponse(description="The alignment is not in a state that allows it.")}

# --- serializers --------------------------------------------------------------------------------


class ReferenceSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    slug = serializers.CharField()
    version = serializers.IntegerField(required=False)


class PlanSerializer(serializers.Serializer):
    base = ReferenceSerializer()
    queue = ReferenceSerializer()
    gold_field = serializers.CharField()
    output_field = serializers.CharField(help_text="The base's output compared with the gold.")
    type = serializers.CharField(help_text="The record's type: binary, numeric or categorical.")
    shots = serializers.IntegerField()
    seed = serializers.IntegerField()
    heldout_fraction = serializers.FloatField()
    train = serializers.ListField(
        child=serializers.IntegerField(), help_text="Queue item ids examples may come from."
    )
    heldout = serializers.ListField(
        child=serializers.IntegerField(), help_text="Queue item ids both revisions judge."
    )
    wrong = serializers.IntegerField(help_text="Train items the base got wrong.")
    examples = serializers.ListField(
        child=serializers.JSONField(),
        help_text="{item, trace_id, cell, gold, predicted, inputs, outputs, expected, note}",
    )
    estimate = serializers.JSONField(
        help_text="{calls, heldout, sample, tokens: {base_prompt, candidate_prompt, completion, "
        "total}, cost_usd (null without a price), connection, model, price, notes}"
    )


class AlignmentSerializer(serializers.ModelSerializer):
    evaluator = serializers.SerializerMethodField()
    base = serializers.SerializerMethodField()
    candidate = serializers.SerializerMethodField()
    queue = serializers.SerializerMethodField()
    run = serializers.IntegerField(source="run_id", allow_null=True, read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    records = serializers.JSONField(
        help_text="When done: {base, candidate (each a reliability record), type, figures, items "
        "(held-out items both judged), heldout, unjudged, difference: {figure: {value, ci}}}."
    )

    class Meta:
        model = JudgeAlignment
        fields = [
            "id",
            "status",
            "evaluator",
            "base",
            "candidate",
            "queue",
            "gold_field",
            "output_field",
            "shots",
            "seed",
            "train",
            "heldout",
            "examples",
            "estimate",
            "max_cost_usd",
            "run",
            "records",
            "error",
            "created_by",
            "created_at",
            "decided_at",
        ]

    def get_evaluator(self, alignment) -> dict[str, int | str]:
        return {"id": alignment.base.evaluator_id, "slug": alignment.base.evaluator.slug}

    def get_base(self, alignment) -> dict[str, int | str]:
        return alignment.base.reference

    def get_candidate(self, alignment) -> dict[str, int | str] | None:
        return alignment.candidate.reference if alignment.candidate else None

    def get_queue(self, alignment) -> dict[str, int | str]:
        return {"id": alignment.queue_id, "slug": alignment.queue.slug}


class AlignmentCreateSerializer(serializers.Serializer):
    revision = serializers.CharField(help_text="The base: an llm_judge revision's id or slug.")
    queue = serializers.CharField(help_text="The annotation queue's id or slug.")
    gold_field = serializers.CharField(
        required=False, allow_null=True, default=None, help_text="Default: the first paired."
    )
    output_field = serializers.CharField(required=False, allow_null=True, default=None)
    shots = serializers.IntegerField(required=False, default=4)
    heldout_fraction = serializers.FloatField(required=False, default=0.5)
    seed = serializers.IntegerField(required=False, default=0)
    max_cost_usd = serializers.FloatField(required=False, allow_null=True, default=None)
    max_calls = serializers.IntegerField(required=False, allow_null=True, default=None)
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Answer the plan and estimate; create nothing."
    )


# --- helpers ------------------------------------------------------------------------------------


def _alignments(request):
    return JudgeAlignment.objects.for_project(request.project).select_related(
        "base__evaluator", "candidate", "queue", "created_by"
    )


def _alignment_or_404(request, alignment_id) -> JudgeAlignment:
    alignment = _alignments(request).filter(pk=alignment_id).first()
    if alignment is None:
        raise Http404
    return alignment


def _base(project, ref: str):
    revision = evaluator_selectors.revision_get(project=project, ref=ref)
    if revision is None:
        raise InvalidInput({"revision": [f"No evaluator revision {ref!r} in this project."]})
    return revision


def _queue(project, ref: str) -> AnnotationQueue:
    found = AnnotationQueue.objects.for_project(project).select_related("evaluator", "revision")
    match = Q(slug=ref)
    if ref.isdecimal():
        match |= Q(pk=int(ref))
    queue = found.filter(match).first()
    if queue is None:
        raise InvalidInput({"queue": [f"No annotation queue {ref!r} in this project."]})
    return queue


def _body(request, alignment_id, code=status.HTTP_200_OK) -> Response:
    return Response(AlignmentSerializer(_alignment_or_404(request, alignment_id)).data, status=code)


# --- views --------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    responses={200: AlignmentSerializer(many=True), **ERROR_RESPONSES},
    parameters=[
        OpenApiParameter("status", str, enum=list(AlignmentStatus.values)),
        OpenApiParameter("evaluator", str, description="The evaluator's id or slug."),
    ],
    tags=TAGS,
)
@extend_schema(
    methods=["POST"],
    request=AlignmentCreateSerializer,
    responses={
        200: OpenApiResponse(PlanSerializer, description="dry_run: the plan, nothing created."),
        201: AlignmentSerializer,
        **ERROR_RESPONSES,
        **BUSY_RESPONSES,
    },
    tags=TAGS,
)
@api_view(["GET", "POST"])
def alignments(request):
    """Align an LLM judge revision from a queue's gold labels it got wrong: a candidate revision
    (not the head) with those cases as few-shot examples, and a run of both revisions on
    held-out gold items. The model calls are estimated first; `max_cost_usd`, `max_calls` and
    the site's EVALSITE_ALIGNMENT_MAX_CALLS refuse (400, naming the field) an estimate above
    them, and nothing is created. `dry_run` answers the plan and the estimate only."""
    if request.method == "POST":
        body = AlignmentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        dry_run, max_cost_usd, max_calls = (
            data.pop("dry_run"),
            data.pop("max_cost_usd"),
            data.pop("max_calls"),
        )
        data["base"] = _base(request.project, data.pop("revision"))
        data["queue"] = _queue(request.project, data["queue"])
        if dry_run:
            return Response(PlanSerializer(review.alignment_plan(**data).summary()).data)
        alignment = review.alignment_create(
            **data, max_cost_usd=max_cost_usd, max_calls=max_calls, author=request.user
        )
        return _body(request, alignment.pk, status.HTTP_201_CREATED)
    queryset = _alignments(request)
    if request.query_params.get("status"):
        queryset = queryset.filter(status=request.query_params["status"])
    if request.query_params.get("evaluator"):
        ref = request.query_params["evaluator"]
        match = Q(base__evaluator__slug=ref)
        if ref.isdecimal():
            match |= Q(base__evaluator_id=int(ref))
        queryset = queryset.filter(match)
    paginator = CursorPagination()
    page = paginator.paginate_queryset(queryset, request)
    return paginator.get_paginated_response(AlignmentSerializer(page, many=True).data)


@extend_schema(
    responses={200: AlignmentSerializer, **ERROR_RESPONSES}, parameters=[ALIGNMENT_ID], tags=TAGS
)
@api_view(["GET"])
def alignment_detail(request, alignment_id):
    """One alignment: `records` holds both held-out records once its run has finished."""
    review.alignment_refresh(alignment=_alignment_or_404(request, alignment_id))
    return _body(request, alignment_id)


@extend_schema(
    request=None,
    responses={200: AlignmentSerializer, **ERROR_RESPONSES, **CONFLICT},
    parameters=[ALIGNMENT_ID],
    tags=TAGS,
)
@api_view(["POST"])
def alignment_accept(request, alignment_id):
    """Make the candidate the evaluator's head (only once the comparison is done)."""
    review.alignment_accept(alignment=_alignment_or_404(request, alignment_id), author=request.user)
    return _body(request, alignment_id)


@extend_schema(
    request=None,
    responses={200: AlignmentSerializer, **ERROR_RESPONSES, **CONFLICT},
    parameters=[ALIGNMENT_ID],
    tags=TAGS,
)
@api_view(["POST"])
def alignment_discard(request, alignment_id):
    """Leave the head as it is (a comparison still running is cancelled)."""
    review.alignment_discard(
        alignment=_alignment_or_404(request, alignment_id), author=request.user
    )
    return _body(request, alignment_id)


urlpatterns = [
    path("alignments", alignments, name="api-alignments"),
    path("alignments/<int:alignment_id>", alignment_detail, name="api-alignment"),
    path("alignments/<int:alignment_id>/accept", alignment_accept, name="api-alignment-accept"),
    path("alignments/<int:alignment_id>/discard", alignment_discard, name="api-alignment-discard"),
]
