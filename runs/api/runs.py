"""REST API for applications, runs (engine-driven and SDK-style), their scenarios, results,
metrics, and annotations."""

from __future__ import annotations

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evalsite.rest import CursorPagination
from evaluators import selectors as evaluator_selectors
from runs import annotations as annotation_services
from runs import engine, selectors
from runs.applications import application_create
from runs.models import Annotation, Application, Result, Run, RunMetrics, Testset

TAGS = ["runs"]

# --- serializers --------------------------------------------------------------------------------


class ApplicationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Application
        fields = ["id", "slug", "name", "description", "kind", "config", "created_at"]


class ApplicationCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(required=False, allow_blank=True, default="")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(choices=Application.Kind.choices)
    config = serializers.JSONField(required=False, default=dict)


class StepSerializer(serializers.Serializer):
    key = serializers.CharField()
    type = serializers.CharField()
    references = serializers.JSONField()


class RunSerializer(serializers.ModelSerializer):
    steps = StepSerializer(many=True, read_only=True)
    testset = serializers.SerializerMethodField()
    application = serializers.SerializerMethodField()
    progress = serializers.FloatField(read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "description",
            "status",
            "is_online",
            "closed",
            "testset",
            "application",
            "repeats",
            "steps",
            "mappings",
            "scenario_count",
            "total_cells",
            "done_cells",
            "error_cells",
            "progress",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "metrics_refreshed_at",
        ]

    def get_testset(self, run) -> dict | None:
        version = run.testset_version
        if version is None:
            return None
        return {"id": version.testset_id, "slug": version.testset.slug, "version": version.version}

    def get_application(self, run) -> dict | None:
        app = run.application
        return {"id": app.pk, "slug": app.slug, "kind": app.kind} if app else None


class RunCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    testset = serializers.CharField(required=False, help_text="Testset id or slug.")
    testset_version = serializers.IntegerField(
        required=False, help_text="Defaults to the newest version."
    )
    application = serializers.CharField(required=False, help_text="Application id or slug.")
    evaluators = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        default=list,
        help_text="Evaluator ids or slugs (their newest revision) or revision slugs (my-eval-v2).",
    )
    repeats = serializers.IntegerField(required=False, default=1, min_value=1, max_value=20)
    start = serializers.BooleanField(required=False, default=True, help_text="Queue it at once.")


class RefListSerializer(serializers.Serializer):
    evaluators = serializers.ListField(child=serializers.CharField(), min_length=1)


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


# --- helpers ------------------------------------------------------------------------------------


def _whole(request, name: str, default: int) -> int:
    raw = request.query_params.get(name, "")
    if raw == "":
        return default
    if not raw.isdigit():
        raise InvalidInput({name: ["must be a whole number (0 or more)"]})
    return int(raw)


def _run_or_404(request, run_id) -> Run:
    run = selectors.run_get(project=request.project, run_id=run_id)
    if run is None:
        raise Http404
    return run


def _revisions(project, refs: list[str]) -> list:
    revisions = []
    for i, ref in enumerate(refs):
        evaluator = evaluator_selectors.evaluator_get(project=project, ref=ref)
        revision = (
            evaluator.head
            if evaluator
            else evaluator_selectors.revision_get(project=project, ref=ref)
        )
        if revision is None:
            raise InvalidInput(
                {f"evaluators.{i}": [f"No evaluator or revision {ref!r} in this project."]}
            )
        revisions.append(revision)
    return revisions


def _testset_version(project, ref, version):
    if not ref:
        return None
    lookup = {"pk": int(ref)} if str(ref).isdigit() else {"slug": ref}
    testset = Testset.objects.for_project(project).filter(**lookup).select_related("head").first()
    if testset is None:
        raise InvalidInput({"testset": [f"No testset {ref!r} in this project."]})
    if version is None:
        return testset.head
    found = testset.versions.filter(version=version).first()
    if found is None:
        raise InvalidInput(
            {"testset_version": [f"Testset {testset.slug} has no version {version}."]}
        )
    return found


def _application(project, ref):
    if not ref:
        return None
    lookup = {"pk": int(ref)} if str(ref).isdigit() else {"slug": ref}
    app = Application.objects.for_project(project).filter(**lookup).first()
    if app is None:
        raise InvalidInput({"application": [f"No application {ref!r} in this project."]})
    return app


RUN_ID = OpenApiParameter("run_id", int, OpenApiParameter.PATH)

# --- applications ---------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"], responses={200: ApplicationSerializer(many=True), **ERROR_RESPONSES}, tags=TAGS
)
@extend_schema(
    methods=["POST"],
    request=ApplicationCreateSerializer,
    responses={201: ApplicationSerializer, **ERROR_RESPONSES},
    tags=TAGS,
)
@api_view(["GET", "POST"])
def applications(request):
    """Applications: `column` (outputs in a testset column), `logged` (your code logs them),
    `http` (evalsite POSTs `{"inputs": ...}` to your endpoint)."""
    if request.method == "POST":
        body = ApplicationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        app = application_create(project=request.project, **body.validated_data)
        return Response(ApplicationSerializer(app).data, status=status.HTTP_201_CREATED)
    return Response(
        ApplicationSerializer(Application.objects.for_project(request.project), many=True).data
    )


# --- runs -----------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    responses={200: RunSerializer(many=True), **ERROR_RESPONSES},
    tags=TAGS,
    parameters=[OpenApiParameter("status", str), OpenApiParameter("search", str)],
)
@extend_schema(
    methods=["POST"],
    request=RunCreateSerializer,
    responses={201: RunSerializer, **ERROR_RESPONSES},
    tags=TAGS,
)
@api_view(["GET", "POST"])
def runs(request):
    """Runs. POST with a testset, an application and evaluators queues a run on the engine; with
    a `logged` application (or none) it opens an SDK-style run whose cells you log yourself."""
    if request.method == "GET":
        queryset = selectors.run_list(
            project=request.project,
            status=request.query_params.get("status", ""),
            search=request.query_params.get("search", ""),
        ).prefetch_related("steps")
        paginator = CursorPagination()
        page = paginator.paginate_queryset(queryset, request)
        return paginator.get_paginated_response(RunSerializer(page, many=True).data)
    body = RunCreateSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    project = request.project
    version = _testset_version(project, data.get("testset"), data.get("testset_version"))
    application = _application(project, data.get("application"))
    revisions = _revisions(project, data["evaluators"])
    common = {
        "project": project,
        "name": data["name"],
        "testset_version": version,
        "application": application,
        "revisions": revisions,
        "author": request.user,
        "description": data["description"],
    }
    if application is None or application.kind == Application.Kind.LOGGED:
        run = engine.run_create_logged(**common)
    else:
        create = engine.run_submit if data["start"] else engine.run_create
        run = create(**common, repeats=data["repeats"])
    return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


@extend_schema(responses={200: RunSerializer, **ERROR_RESPONSES}, tags=TAGS, parameters=[RUN_ID])
@api_view(["GET"])
def run_detail(request, run_id):
    return Response(RunSerializer(_run_or_404(request, run_id)).data)


def _action(service):
    @extend_schema(
        request=None,
        responses={200: RunSerializer, **ERROR_RESPONSES},
        tags=TAGS,
        parameters=[RUN_ID],
    )
    @api_view(["POST"])
    def view(request, run_id):
        run = _run_or_404(request, run_id)
        service(run=run)
        return Response(RunSerializer(_run_or_404(request, run_id)).data)

    view.__doc__ = service.__doc__
    return view


run_start = _action(engine.run_start)
run_cancel = _action(engine.run_cancel)
run_retry = _action(engine.run_retry_failed)
run_close = _action(engine.run_close)


@extend_schema(
    request=RefListSerializer,
    responses={200: RunSerializer, **ERROR_RESPONSES},
    tags=TAGS,
    parameters=[RUN_ID],
)
@api_view(["POST"])
def run_evaluators_add(request, run_id):
    """Add evaluators to a finished run: only their cells are computed; outputs are reused."""
    run = _run_or_404(request, run_id)
    body = RefListSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    engine.run_add_evaluators(
        run=run, revisions=_revisions(request.project, body.validated_data["evaluators"])
    )
    return Response(RunSerializer(_run_or_404(request, run_id)).data)


# --- scenarios and results ------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    tags=TAGS,
    parameters=[RUN_ID, OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
    responses={
        200: inline_serializer(
            "ScenarioRows",
            {
                "count": serializers.IntegerField(),
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
    errors, never values). POST: add scenarios to an SDK-style run."""
    run = _run_or_404(request, run_id)
    if request.method == "POST":
        body = ScenariosAddSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        added = engine.scenarios_add(run=run, rows=body.validated_data["scenarios"])
        return Response({"indexes": [s.index for s in added]}, status=status.HTTP_201_CREATED)
    limit = min(_whole(request, "limit", 50), 500) or 50
    offset = _whole(request, "offset", 0)
    scenarios = list(run.scenarios.order_by("index")[offset : offset + limit])
    rows = selectors.scenario_rows(run, scenarios)
    return Response(
        {
            "count": run.scenario_count,
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
    run = _run_or_404(request, run_id)
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


# --- metrics ------------------------------------------------------------------------------------

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
    run = _run_or_404(request, run_id)
    row = RunMetrics.objects.filter(run=run, scenario=None, bucket_start=None).first()
    body = {"run": row.data if row else {}, "refreshed_at": row.refreshed_at if row else None}
    if request.query_params.get("scenario", "").isdigit():
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
    run = _run_or_404(request, run_id)
    engine.run_metrics_refresh_request(run=run)
    row = RunMetrics.objects.filter(run=run, scenario=None, bucket_start=None).first()
    body = {"run": row.data if row else {}, "refreshed_at": row.refreshed_at if row else None}
    return Response(body, status=status.HTTP_202_ACCEPTED)


# --- annotations --------------------------------------------------------------------------------


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
    if params.get("run", "").isdigit():
        queryset = queryset.filter(results__run_id=int(params["run"])).distinct()
    paginator = CursorPagination()
    page = paginator.paginate_queryset(queryset, request)
    return paginator.get_paginated_response(AnnotationSerializer(page, many=True).data)


urlpatterns = [
    path("applications", applications, name="api-applications"),
    path("runs", runs, name="api-runs"),
    path("runs/<str:run_id>", run_detail, name="api-run"),
    path("runs/<str:run_id>/start", run_start, name="api-run-start"),
    path("runs/<str:run_id>/cancel", run_cancel, name="api-run-cancel"),
    path("runs/<str:run_id>/retry", run_retry, name="api-run-retry"),
    path("runs/<str:run_id>/close", run_close, name="api-run-close"),
    path("runs/<str:run_id>/evaluators", run_evaluators_add, name="api-run-evaluators"),
    path("runs/<str:run_id>/scenarios", run_scenarios, name="api-run-scenarios"),
    path("runs/<str:run_id>/results", run_results, name="api-run-results"),
    path("runs/<str:run_id>/metrics", run_metrics, name="api-run-metrics"),
    path("runs/<str:run_id>/metrics/refresh", run_metrics_refresh, name="api-run-metrics-refresh"),
    path("annotations", annotations, name="api-annotations"),
]
