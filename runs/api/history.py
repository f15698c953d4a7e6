"""REST API: a testset's test-case history (docs/history.md)."""

from __future__ import annotations

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from runs import history, testsets


class HistoryRunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    tags = serializers.DictField(child=serializers.CharField())
    version = serializers.IntegerField(help_text="The testset version the run used.")
    baseline = serializers.BooleanField()
    candidate = serializers.BooleanField()


class HistoryCaseSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="Testcase index (cases align by index).")
    inputs = serializers.CharField(help_text="A short preview of the test case.")
    evaluator = serializers.CharField(help_text="The evaluator's slug.")
    flips = serializers.IntegerField(help_text="Consecutive verdicts that differ.")
    flip_rate = serializers.FloatField(
        allow_null=True, help_text="flips / (verdicts - 1); null with fewer than 2 verdicts."
    )
    verdicts = serializers.ListField(
        child=serializers.ChoiceField(choices=history.VERDICTS),
        help_text="One per run, aligned with `runs`.",
    )

    def get_fields(self):
        # "class" is a Python keyword: the field is added under its wire name.
        fields = super().get_fields()
        fields["class"] = serializers.ChoiceField(choices=history.CLASSES)
        return fields


class HistorySerializer(serializers.Serializer):
    testset = inline_serializer(
        "HistoryTestset", {"id": serializers.IntegerField(), "slug": serializers.CharField()}
    )
    runs = HistoryRunSerializer(many=True, help_text="Oldest first; the candidate is the last.")
    evaluators = inline_serializer(
        "HistoryEvaluator",
        {"slug": serializers.CharField(), "metric": serializers.CharField()},
        many=True,
    )
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="Rows per class, before the class filter."
    )
    count = serializers.IntegerField(help_text="Rows (case x evaluator) of the chosen classes.")
    offset = serializers.IntegerField()
    limit = serializers.IntegerField()
    cases = HistoryCaseSerializer(many=True)


PARAMETERS = [
    OpenApiParameter("ref", str, OpenApiParameter.PATH, description="Testset id or slug."),
    OpenApiParameter(
        "evaluator",
        str,
        many=True,
        description="Evaluator slug or id (repeatable); all by default.",
    ),
    OpenApiParameter(
        "runs", int, description=f"How many runs, {history.MIN_RUNS} to {history.MAX_RUNS} (20)."
    ),
    OpenApiParameter(
        "tag", str, many=True, description="Only runs with this tag, `name:value` (repeatable)."
    ),
    OpenApiParameter(
        "baseline",
        int,
        description="A run of this testset; the run before the candidate by default.",
    ),
    OpenApiParameter("candidate", int, description="A run of this testset; the newest by default."),
    OpenApiParameter(
        "class", str, many=True, enum=list(history.CLASSES), description="Only these classes."
    ),
    OpenApiParameter("offset", int, description="Rows to skip (0)."),
    OpenApiParameter("limit", int, description=f"Rows, at most {history.MAX_LIMIT} (200)."),
]


@extend_schema(
    tags=["testsets"], parameters=PARAMETERS, responses={200: HistorySerializer, **ERROR_RESPONSES}
)
@api_view(["GET"])
def testset_history(request, ref):
    """Each test case's verdict (the evaluator's boolean `success`) in the last runs of the
    testset, and its class: regressed, flaky, fixed, stable_fail, stable_pass or unknown.
    A CI gate passes `baseline` and `candidate` and lists the regressed and flaky cases."""
    testset = testsets.testset_get(project=request.project, ref=ref)
    if testset is None:
        raise Http404
    query = history.HistoryQuery.from_params(request.query_params, testset=testset)
    found = history.testcase_history(testset=testset, **query.arguments())
    return Response(history_json(found))


def history_json(found: history.History) -> dict:
    baseline, candidate = found.baseline, found.candidate
    return {
        "testset": {"id": found.testset.pk, "slug": found.testset.slug},
        "runs": [
            {
                "id": run.pk,
                "name": run.name,
                "created_at": run.created_at,
                "tags": run.tags,
                "version": run.testset_version.version,
                "baseline": baseline is not None and run.pk == baseline.pk,
                "candidate": candidate is not None and run.pk == candidate.pk,
            }
            for run in found.runs
        ],
        "evaluators": [{"slug": e.slug, "metric": e.metric} for e in found.evaluators],
        "counts": found.counts,
        "count": found.count,
        "offset": found.offset,
        "limit": found.limit,
        "cases": [
            {
                "index": case.index,
                "inputs": case.inputs,
                "evaluator": case.evaluator,
                "class": case.klass,
                "flips": case.flips,
                "flip_rate": case.flip_rate,
                "verdicts": case.verdicts,
            }
            for case in found.cases
        ],
    }


urlpatterns = [path("testsets/<str:ref>/history", testset_history, name="api-testset-history")]
