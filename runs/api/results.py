"""REST API for what a run holds: its scenarios (the table), results logged by SDK-style
clients, metrics, and annotations."""

from __future__ import annotations

import math

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evalsite.rest import CursorPagination
from runs import annotations as annotation_services
from runs import engine, selectors
from runs.api.compare import TABLE_FILTERS
from runs.api.runs import RUN_ID, TAGS, run_or_404, whole_param
from runs.models import Annotation, Result, RunMetrics


class ScenarioInSerializer(serializers.Serializer):
    inputs = serializers.DictField()


class ScenariosAddSerializer(serializers.Serializer):
    scenarios = ScenarioInSerializer(many=True)


class ResultInSerializer(serializers.Serializer):
    scenario = serializers.IntegerField(help_text="The scenario's index in the run.")
    step_key = serializers.CharField()
    repeat_idx = serializers.IntegerField(required=False, default=0, min_value=0)
    trace_id = serializers.CharField(required=False, help_text="A trace sent to /api/v1/traces.")
    outputs = serializers.JSONField(
        required=False, help_text="Invocation outputs, or evaluator outputs."
    )
    error = serializers.JSONField(
        required=False, help_text="{code, message, ...} when the cell failed."
    )
    duration_ms = serializers.FloatField(required=False)


class ResultsLogSerializer(serializers.Serializer):
    results = ResultInSerializer(many=True)


class ResultSerializer(serializers.ModelSerializer):
    scenario = serializers.IntegerField(source="scenario.index", read_only=True)
    trace_id = serializers.CharField(
        source="trace.trace_id", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = Result
        fields = [
            "id",
            "scenario",
            "step_key",
            "repeat_idx",
            "status",
            "trace_id",
            "annotation",
            "error",
            "duration_ms",
        ]


class AnnotationSerializer(serializers.ModelSerializer):
    evaluator = serializers.SerializerMethodField()
    revision = serializers.SerializerMethodField()
    trace_id = serializers.CharField(
        source="trace.trace_id", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = Annotation
        fields = [
            "id",
            "evaluator",
            "revision",
            "trace_id",
            "span_id",
            "outputs",
            "origin",
            "channel",
            "history",
            "created_at",
            "updated_at",
        ]

    def get_evaluator(self, annotation) -> dict:
        return {"id": annotation.evaluator_id, "slug": annotation.evaluator_slug}

    def get_revision(self, annotation) -> dict | None:
        revision = annotation.revision
        return revision.reference if revision else None


class AnnotationCreateSerializer(serializers.Serializer):
    evaluator = serializers.CharField(
        help_text="Evaluator id or slug; an unknown slug registers a feedback evaluator."
    )
    revision = serializers.CharField(
        required=False, allow_blank=True, help_text="Revision id, slug or version."
    )
    outputs = serializers.JSONField()
    trace_id = serializers.CharField(required=False, allow_blank=True, default="")
    span_id = serializers.CharField(required=False, allow_blank=True, default="")
    origin = serializers.ChoiceField(choices=["auto", "human", "custom"], default="custom")
    channel = serializers.ChoiceField(choices=["web", "api", "sdk"], default="api")


METRICS_SHAPE = inline_serializer(
    "RunMetricsResponse",
    {
        "run": serializers.JSONField(help_text="step_key -> metric key -> statistics"),
        "refreshed_at": serializers.DateTimeField(allow_null=True),
        "scenario": serializers.JSONField(required=False),
        "buckets": serializers.JSONField(required=False),
    },
)


@extend_schema(
    methods=["GET"],
    tags=TAGS,
    parameters=[
        RUN_ID,
        OpenApiParameter("limit", int, description="Rows a page (50; at most 500)."),
        OpenApiParameter(
            "cursor", str, description="Where a page starts: take it from `next` or `previous`."
        ),
        OpenApiParameter(
            "offset", int, description="Rows to skip instead of a cursor (cost grows with it)."
        ),
        *TABLE_FILTERS,
    ],
    responses={
        200: inline_serializer(
            "ScenarioRows",
            {
                "count": serializers.IntegerField(help_text="Scenarios the filters keep."),
                "next": serializers.URLField(
                    allow_null=True, help_text="The next page (a cursor link), or null."
                ),
                "previous": serializers.URLField(
                    allow_null=True, help_text="The page before, or null."
                ),
                "columns": serializers.JSONField(),
                "rows": serializers.JSONField(),
            },
        ),
        **ERROR_RESPONSES,
    },
)
@extend_schema(
    methods=["POST"],
    tags=TAGS,
    parameters=[RUN_ID],
    request=ScenariosAddSerializer,
    responses={
        201: inline_serializer(
            "ScenariosAdded", {"indexes": serializers.ListField(child=serializers.IntegerField())}
        ),
        **ERROR_RESPONSES,
    },
)
@api_view(["GET", "POST"])
def run_scenarios(request, run_id):
    """GET: the scenario table, each row's values read through the run's mappings (errors as
    errors, never values), sorted and filtered as on the run page, a page at a time: follow
    `next` (a cursor: each page costs its own rows). POST: add scenarios to an SDK-style run."""
    run = run_or_404(request, run_id)
    if request.method == "POST":
        body = ScenariosAddSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        added = engine.scenarios_add(run=run, rows=body.validated_data["scenarios"])
        return Response({"indexes": [s.index for s in added]}, status=status.HTTP_201_CREATED)
    limit = min(whole_param(request, "limit", 50), 500) or 50
    offset = whole_param(request, "offset", 0)
    params = request.query_params
    _numbers_check(params)
    cursor = selectors.Cursor.decode(params["cursor"]) if params.get("cursor") else None
    page = selectors.table_page(
        run, selectors.TableQuery.from_params(params), cursor=cursor, offset=offset, limit=limit
    )
    rows = selectors.scenario_rows(run, page.scenarios)
    return Response(
        {
            "count": page.total,
            "next": _page_url(request, page.next, limit),
            "previous": _page_url(request, page.previous, limit),
            "columns": run.mappings,
            "rows": [
                {
                    "index": r["scenario"].index,
                    "status": r["scenario"].status,
                    "values": r["values"],
                    "errors": r["errors"],
                }
                for r in rows
            ],
        }
    )


def _numbers_check(params) -> None:
    """A range bound the table would pass over is the caller's mistake: name it."""
    for name in ("low", "high"):
        try:
            ok = params.get(name, "") == "" or math.isfinite(float(params[name]))
        except ValueError:
            ok = False
        if not ok:
            raise InvalidInput({name: ["must be a number"]})


def _page_url(request, cursor: selectors.Cursor | None, limit: int) -> str | None:
    """The link to the page at ``cursor``: the request's own with the cursor in place of any
    offset; back to the first page without one."""
    if cursor is None:
        return None
    params = request.query_params.copy()
    params.pop("offset", None)
    params.pop("cursor", None)
    if not (cursor.before and cursor.rank <= limit):
        params["cursor"] = cursor.encode()
    query = params.urlencode()
    return request.build_absolute_uri(request.path + (f"?{query}" if query else ""))


@extend_schema(
    methods=["GET"],
    tags=TAGS,
    parameters=[RUN_ID, OpenApiParameter("step_key", str), OpenApiParameter("status", str)],
    responses={200: ResultSerializer(many=True), **ERROR_RESPONSES},
)
@extend_schema(
    methods=["POST"],
    tags=TAGS,
    parameters=[RUN_ID],
    request=ResultsLogSerializer,
    responses={201: ResultSerializer(many=True), **ERROR_RESPONSES},
)
@api_view(["GET", "POST"])
def run_results(request, run_id):
    """GET: the run's cells. POST: log cells of an SDK-style run (an upsert per cell)."""
    run = run_or_404(request, run_id)
    if request.method == "POST":
        body = ResultsLogSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        logged = engine.results_log(
            run=run, entries=body.validated_data["results"], author=request.user
        )
        ids = [r.pk for r in logged]
        results = (
            Result.objects.filter(run=run, pk__in=ids).select_related("scenario", "trace")
            if all(ids)
            else []
        )
        return Response(ResultSerializer(results, many=True).data, status=status.HTTP_201_CREATED)
    results = Result.objects.filter(run=run).select_related("scenario", "trace")
    for name in ("step_key", "status"):
        if request.query_params.get(name):
            results = results.filter(**{name: request.query_params[name]})
    paginator = CursorPagination()
    page = paginator.paginate_queryset(results, request)
    return paginator.get_paginated_response(ResultSerializer(page, many=True).data)


@extend_schema(
    tags=TAGS,
    parameters=[
        RUN_ID,
        OpenApiParameter("scenario", int, description="A scenario index: its own statistics."),
        OpenApiParameter("buckets", bool, description="Online runs: the time series."),
    ],
    responses={200: METRICS_SHAPE, **ERROR_RESPONSES},
)
@api_view(["GET"])
def run_metrics(request, run_id):
    """Run-wide statistics (kept current by a refresh a few seconds after cells land, and exact
    once the run ends), per scenario, or per time bucket."""
    run = run_or_404(request, run_id)
    row = RunMetrics.objects.filter(run=run, scenario=None, bucket_start=None).first()
    body = {"run": row.data if row else {}, "refreshed_at": row.refreshed_at if row else None}
    if request.query_params.get("scenario", "").isdecimal():
        scenario = run.scenarios.filter(index=int(request.query_params["scenario"])).first()
        if scenario is None:
            raise Http404
        per = RunMetrics.objects.filter(run=run, scenario=scenario).first()
        body["scenario"] = per.data if per else {}
    if request.query_params.get("buckets") in ("1", "true"):
        body["buckets"] = [
            {"start": m.bucket_start, "data": m.data}
            for m in RunMetrics.objects.filter(run=run, bucket_start__isnull=False).order_by(
                "bucket_start"
            )
        ]
    return Response(body)


@extend_schema(
    request=None, tags=TAGS, parameters=[RUN_ID], responses={202: METRICS_SHAPE, **ERROR_RESPONSES}
)
@api_view(["POST"])
def run_metrics_refresh(request, run_id):
    """Queue a recomputation of the run's statistics (idempotent; safe to call concurrently).
    The answer holds the statistics stored now; GET the metrics again in a few seconds."""
    run = run_or_404(request, run_id)
    engine.run_metrics_refresh_request(run=run)
    row = RunMetrics.objects.filter(run=run, scenario=None, bucket_start=None).first()
    body = {"run": row.data if row else {}, "refreshed_at": row.refreshed_at if row else None}
    return Response(body, status=status.HTTP_202_ACCEPTED)


@extend_schema(
    methods=["GET"],
    tags=["annotations"],
    responses={200: AnnotationSerializer(many=True), **ERROR_RESPONSES},
    parameters=[
        OpenApiParameter("trace_id", str),
        OpenApiParameter("evaluator", str, description="id or slug"),
        OpenApiParameter("run", int),
    ],
)
@extend_schema(
    methods=["POST"],
    tags=["annotations"],
    request=AnnotationCreateSerializer,
    responses={201: AnnotationSerializer, 422: ERROR_RESPONSES[400], **ERROR_RESPONSES},
)
@api_view(["GET", "POST"])
def annotations(request):
    """Annotations of traces. POST checks `outputs` against the evaluator revision's outputs
    schema (422 naming the field); lookups accept the evaluator's id or slug alike."""
    if request.method == "POST":
        body = AnnotationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        annotation = annotation_services.annotation_create(
            project=request.project, author=request.user, **body.validated_data
        )
        return Response(AnnotationSerializer(annotation).data, status=status.HTTP_201_CREATED)
    queryset = Annotation.objects.for_project(request.project).select_related("trace", "revision")
    params = request.query_params
    if params.get("trace_id"):
        queryset = queryset.filter(trace__trace_id=params["trace_id"])
    if params.get("evaluator"):
        queryset = queryset.for_evaluator(params["evaluator"])
    if params.get("run", "").isdecimal():
        queryset = queryset.filter(results__run_id=int(params["run"])).distinct()
    paginator = CursorPagination()
    page = paginator.paginate_queryset(queryset, request)
    return paginator.get_paginated_response(AnnotationSerializer(page, many=True).data)


urlpatterns = [
    path("runs/<str:run_id>/scenarios", run_scenarios, name="api-run-scenarios"),
    path("runs/<str:run_id>/results", run_results, name="api-run-results"),
    path("runs/<str:run_id>/metrics", run_metrics, name="api-run-metrics"),
    path("runs/<str:run_id>/metrics/refresh", run_metrics_refresh, name="api-run-metrics-refresh"),
    path("annotations", annotations, name="api-annotations"),
]
