"""REST API: comparing runs (statistics and aligned rows) and the CSV / JSONL exports."""

from __future__ import annotations

import json

from django.http import Http404
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import renderers, serializers
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from runs import compare, exports, selectors

TAGS = ["runs"]
MAX_LIMIT = 500


class _ExportRenderer(renderers.BaseRenderer):
    """Lets ``?format=csv|jsonl`` through DRF's negotiation; exports stream their own bytes,
    so only error bodies are rendered here (as JSON text)."""

    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode()


class CSVRenderer(_ExportRenderer):
    media_type = "text/csv"
    format = "csv"


class JSONLRenderer(_ExportRenderer):
    media_type = "application/x-ndjson"
    format = "jsonl"


EXPORT_RENDERERS = [renderers.JSONRenderer, CSVRenderer, JSONLRenderer]
EXPORT_RESPONSES = {
    (200, "text/csv"): OpenApiTypes.STR,
    (200, "application/x-ndjson"): OpenApiTypes.STR,
    **ERROR_RESPONSES,
}
FORMAT = OpenApiParameter(
    "format", str, enum=["csv", "jsonl"], description="csv (default) or jsonl."
)
RUNS = OpenApiParameter(
    "runs", str, required=True, description="2 to 10 run ids of one testset: 12,13,14."
)
BASELINE = OpenApiParameter("baseline", int, description="One of the runs; the first by default.")
METRIC = OpenApiParameter(
    "metric", str, description="One shared metric (exact.success); all shared metrics by default."
)
FILTER = OpenApiParameter(
    "filter",
    str,
    enum=list(compare.FILTERS),
    description="Rows where a candidate regressed / improved / changed against the baseline.",
)
TABLE_FILTERS = [
    OpenApiParameter("sort", str, description="A column name; -name for descending."),
    OpenApiParameter("errors", bool, description="Only scenarios with an errored cell."),
    OpenApiParameter("failed", bool, description="Only scenarios judged success=false."),
    OpenApiParameter("column", str, description="A metric column for low/high."),
    OpenApiParameter("low", float),
    OpenApiParameter("high", float),
    OpenApiParameter("q", str, description="Text in the inputs or the outputs."),
]

COMPARISON_SHAPE = inline_serializer(
    "RunComparison",
    {
        "runs": serializers.JSONField(help_text="[{id, name, status, testset, baseline}]"),
        "baseline": serializers.IntegerField(),
        "alignment": serializers.CharField(),
        "metrics": serializers.JSONField(
            help_text="Per shared metric: each run's summary and each candidate's paired test."
        ),
        "count": serializers.IntegerField(help_text="Aligned rows matching the filter."),
        "offset": serializers.IntegerField(),
        "rows": serializers.JSONField(help_text="[{index, inputs, runs: [{run, values, ...}]}]"),
    },
)


def _comparison(request) -> compare.Comparison:
    params = request.query_params
    try:
        return compare.comparison_get(
            project=request.project,
            run_ids=compare.run_ids_parse(params.getlist("runs")),
            baseline=params.get("baseline"),
        )
    except InvalidInput as exc:
        if exc.status == 404:
            raise Http404(str(exc))
        raise


def _int(params, name: str, default: int, high: int | None = None) -> int:
    value = params.get(name, "")
    number = int(value) if value.isdecimal() else default
    return min(number, high) if high else number


def _run_json(run, baseline) -> dict:
    version = run.testset_version
    return {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "testset": {
            "id": version.testset_id,
            "slug": version.testset.slug,
            "version": version.version,
        },
        "baseline": run.pk == baseline.pk,
    }


@extend_schema(
    tags=TAGS,
    parameters=[
        RUNS,
        BASELINE,
        METRIC,
        FILTER,
        OpenApiParameter("offset", int),
        OpenApiParameter("limit", int, description="Rows per page, at most 500 (50)."),
    ],
    responses={200: COMPARISON_SHAPE, **ERROR_RESPONSES},
)
@api_view(["GET"])
def run_compare(request):
    """Compare 2 to 10 runs of one testset (any versions): rows aligned by testcase index,
    each shared metric summarised per run and tested against the baseline over the paired
    scenarios (paired bootstrap for numbers, McNemar for booleans; errors left out pairwise).
    See docs/compare.md for the methods."""
    comparison = _comparison(request)
    params = request.query_params
    report = compare.comparison_report(
        comparison,
        metric=params.get("metric", ""),
        show=params.get("filter", ""),
        offset=_int(params, "offset", 0),
        limit=_int(params, "limit", 50, MAX_LIMIT),
    )
    return Response(
        {
            "runs": [_run_json(run, comparison.baseline) for run in comparison.runs],
            "baseline": comparison.baseline.pk,
            "alignment": "testcase index",
            "metrics": report["stats"],
            "count": report["total"],
            "offset": report["offset"],
            "rows": report["rows"],
        }
    )


@extend_schema(
    tags=TAGS,
    parameters=[RUNS, BASELINE, METRIC, FILTER, FORMAT],
    responses=EXPORT_RESPONSES,
)
@api_view(["GET"])
@renderer_classes(EXPORT_RENDERERS)
def run_compare_export(request):
    """The aligned rows of a comparison (inputs, each run's outputs and values, deltas from
    the baseline), streamed as CSV or JSONL."""
    comparison = _comparison(request)
    return exports.comparison_export(
        comparison,
        fmt=_format(request),
        metric=request.query_params.get("metric", ""),
        show=request.query_params.get("filter", ""),
    )


@extend_schema(
    tags=TAGS,
    parameters=[OpenApiParameter("run_id", int, OpenApiParameter.PATH), FORMAT, *TABLE_FILTERS],
    responses=EXPORT_RESPONSES,
)
@api_view(["GET"])
@renderer_classes(EXPORT_RENDERERS)
def run_export(request, run_id):
    """A run's scenario table with the run page's filters and sort, streamed as CSV (errors
    as `error: <code>`) or JSONL (`{index, status, values, errors}` per line)."""
    run = selectors.run_get(project=request.project, run_id=run_id)
    if run is None:
        raise Http404
    query = selectors.TableQuery.from_params(request.query_params)
    return exports.run_export(run, query, fmt=_format(request))


def _format(request) -> str:
    chosen = request.accepted_renderer.format
    return chosen if chosen in exports.FORMATS else "csv"


urlpatterns = [
    path("runs/compare", run_compare, name="api-run-compare"),
    path("runs/compare/export", run_compare_export, name="api-run-compare-export"),
    path("runs/<str:run_id>/export", run_export, name="api-run-export"),
]
