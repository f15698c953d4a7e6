"""REST API for the schema backfill."""

from __future__ import annotations

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evaluators.selectors import revision_get
from runs import metrics
from runs.metrics import backfill

TAGS = ["metrics"]
REF = OpenApiParameter("ref", str, OpenApiParameter.PATH, description="Revision id or slug.")

Candidates = inline_serializer(
    "BackfillCandidate",
    many=True,
    fields={
        "revision": serializers.JSONField(),
        "evaluator": serializers.JSONField(),
        "kind": serializers.CharField(),
        "annotations": serializers.IntegerField(),
        "runs": serializers.IntegerField(),
        "schema_inferred_at": serializers.DateTimeField(allow_null=True),
    },
)
Inferred = inline_serializer(
    "InferredSchema",
    {
        "schema": serializers.JSONField(),
        "total": serializers.IntegerField(),
        "fields": serializers.JSONField(),
        "current": serializers.JSONField(allow_null=True),
        "progress": serializers.JSONField(),
        "disagreeing": serializers.JSONField(allow_null=True),
    },
)


class ApplySerializer(serializers.Serializer):
    schema = serializers.JSONField(
        help_text="A JSON Schema with type object: the revision's outputs schema."
    )


@extend_schema(tags=TAGS, responses={200: Candidates, **ERROR_RESPONSES})
@api_view(["GET"])
def candidates(request):
    """Revisions without an outputs schema, with how many annotations and runs use each."""
    return Response(
        [
            {
                "revision": r.reference,
                "evaluator": {"id": r.evaluator_id, "slug": r.evaluator.slug},
                "kind": r.kind,
                "annotations": r.annotation_count,
                "runs": r.run_count,
                "schema_inferred_at": r.schema_inferred_at,
            }
            for r in backfill.backfill_candidates(project=request.project)
        ]
    )


def _revision(request, ref):
    revision = revision_get(project=request.project, ref=ref)
    if revision is None:
        raise Http404
    return revision


@extend_schema(
    methods=["GET"], tags=TAGS, parameters=[REF], responses={200: Inferred, **ERROR_RESPONSES}
)
@extend_schema(
    methods=["POST"],
    tags=TAGS,
    parameters=[REF],
    request=ApplySerializer,
    responses={200: Inferred, **ERROR_RESPONSES},
)
@api_view(["GET", "POST"])
def revision_schema(request, ref):
    """GET: the schema inferred from every stored output (types, examples, agreement).
    POST: apply a schema (recorded as inferred, who and when); affected runs are refreshed by
    Celery. Applying the same schema twice changes nothing."""
    revision = _revision(request, ref)
    if request.method == "POST":
        body = ApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        revision = backfill.schema_backfill_apply(
            revision=revision, schema=body.validated_data["schema"], author=request.user
        )
    inferred = metrics.schema_infer(revision_id=revision.pk)
    current = revision.outputs_schema
    return Response(
        {
            **inferred,
            "current": current,
            "progress": backfill.backfill_progress(revision),
            "disagreeing": backfill.disagreeing_outputs(revision=revision) if current else None,
        }
    )


urlpatterns = [
    path("schemas/backfill", candidates, name="api-schema-candidates"),
    path("revisions/<str:ref>/schema", revision_schema, name="api-revision-schema"),
]
