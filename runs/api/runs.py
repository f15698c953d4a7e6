"""REST API for applications and runs (engine-driven and SDK-style): create, list, act on them;
runs/api/results.py serves what a run holds."""

from __future__ import annotations

from decimal import Decimal

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import BUSY_RESPONSES, ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evalsite.rest import CursorPagination
from evaluators import selectors as evaluator_selectors
from runs import engine, selectors
from runs.applications import application_create
from runs.models import Application, Run, Testset

TAGS = ["runs"]

# --- serializers --------------------------------------------------------------------------------


SEALED_HEADERS = (
    "Header values are secrets: stored encrypted and never returned; reads show each name "
    'with "••••••".'
)


class ApplicationSerializer(serializers.ModelSerializer):
    config = serializers.JSONField(source="config_shown", read_only=True, help_text=SEALED_HEADERS)

    class Meta:
        model = Application
        fields = ["id", "slug", "name", "description", "kind", "config", "created_at"]


class ApplicationCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(required=False, allow_blank=True, default="")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(choices=Application.Kind.choices)
    config = serializers.JSONField(
        required=False,
        default=dict,
        help_text='http: {"url", "headers", "timeout_s", "retries", "concurrency", '
        '"outputs_path", "trace_path"}. ' + SEALED_HEADERS,
    )


class StepSerializer(serializers.Serializer):
    key = serializers.CharField()
    type = serializers.CharField()
    references = serializers.JSONField()


TAGS_HELP = (
    'Free-form labels, name -> text: {"branch": "main", "commit": "9f1c2e7", "pr": "482"}; '
    "at most 20, names of letters, digits, _ . - /."
)


class RunSerializer(serializers.ModelSerializer):
    steps = StepSerializer(many=True, read_only=True)
    tags = serializers.DictField(child=serializers.CharField(), read_only=True, help_text=TAGS_HELP)
    max_cost_usd = serializers.DecimalField(
        max_digits=12, decimal_places=4, coerce_to_string=False, read_only=True, allow_null=True
    )
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
            "tags",
            "max_cost_usd",
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
    tags = serializers.JSONField(required=False, default=dict, help_text=TAGS_HELP)
    max_cost_usd = serializers.DecimalField(
        max_digits=12,
        decimal_places=4,
        min_value=Decimal("0"),
        required=False,
        allow_null=True,
        default=None,
        help_text="The run's spend cap (USD): a run projected over it (or over the project's "
        "cap per run) is refused before anything starts.",
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Only estimate: answer the projected cells, calls, tokens and cost with the "
        "caps beside them, and create nothing.",
    )


class RunUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    tags = serializers.JSONField(required=False, help_text="Replaces the run's tags. " + TAGS_HELP)


ESTIMATE_STEP_FIELDS = {
    "key": serializers.CharField(),
    "type": serializers.CharField(),
    "cells": serializers.IntegerField(),
    "calls": serializers.IntegerField(),
    "tokens": serializers.JSONField(allow_null=True, help_text="{prompt, completion, total}"),
    "cost_usd": serializers.FloatField(allow_null=True),
    "notes": serializers.ListField(child=serializers.CharField()),
    "judge": serializers.JSONField(
        required=False,
        help_text="LLM judges: connection, model, price, prompt_tokens_per_call, "
        "completion_tokens_per_call, completion_source, max_cost_usd.",
    ),
}
ESTIMATE = inline_serializer(
    "RunEstimate",
    {
        "scenarios": serializers.IntegerField(),
        "repeats": serializers.IntegerField(),
        "cells": serializers.IntegerField(),
        "steps": inline_serializer("RunEstimateStep", ESTIMATE_STEP_FIELDS, many=True),
        "application_calls": serializers.IntegerField(),
        "judge_calls": serializers.IntegerField(),
        "tokens": serializers.JSONField(help_text="{prompt, completion, total}"),
        "cost_usd": serializers.FloatField(
            allow_null=True, help_text="Null when a judge's model has no price."
        ),
        "caps": serializers.JSONField(help_text="{run, project, judges: {step: cap}} in USD."),
        "cap_usd": serializers.FloatField(allow_null=True, help_text="The binding cap."),
        "over_cap": serializers.BooleanField(),
        "sample_rows": serializers.IntegerField(),
        "sample_indexes": serializers.ListField(
            child=serializers.IntegerField(), help_text="The rows whose prompts were rendered."
        ),
        "notes": serializers.ListField(child=serializers.CharField()),
    },
)
DRY_RUN = inline_serializer(
    "RunDryRun", {"dry_run": serializers.BooleanField(), "estimate": ESTIMATE}
)


class RefListSerializer(serializers.Serializer):
    evaluators = serializers.ListField(child=serializers.CharField(), min_length=1)


# --- helpers ------------------------------------------------------------------------------------


def whole_param(request, name: str, default: int) -> int:
    raw = request.query_params.get(name, "")
    if raw == "":
        return default
    if not raw.isdecimal() or len(raw) > 9:
        raise InvalidInput({name: ["must be a whole number (0 or more, at most 9 digits)"]})
    return int(raw)


def run_or_404(request, run_id) -> Run:
    run = selectors.run_get(project=request.project, run_id=run_id)
    if run is None:
        raise Http404
    return run


def revisions_from_refs(project, refs: list[str]) -> list:
    """The revisions a request's ``evaluators`` list names; a 400 on the first unknown one."""
    revisions = []
    for i, ref in enumerate(refs):
        revision = evaluator_selectors.revision_resolve(project=project, ref=ref)
        if revision is None:
            raise InvalidInput(
                {f"evaluators.{i}": [f"No evaluator or revision {ref!r} in this project."]}
            )
        revisions.append(revision)
    return revisions


def _testset_version(project, ref, version):
    if not ref:
        return None
    lookup = {"pk": int(ref)} if str(ref).isdecimal() else {"slug": ref}
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
    lookup = {"pk": int(ref)} if str(ref).isdecimal() else {"slug": ref}
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
    parameters=[
        OpenApiParameter("status", str),
        OpenApiParameter("search", str, description="Text in the name or description."),
        OpenApiParameter(
            "tag",
            str,
            many=True,
            description="name:value, repeatable; every one must match (tag=branch:main).",
        ),
        OpenApiParameter("testset", str, description="A testset's id or slug."),
    ],
)
@extend_schema(
    methods=["POST"],
    request=RunCreateSerializer,
    responses={
        201: RunSerializer,
        200: OpenApiResponse(DRY_RUN, description="dry_run: the estimate; nothing created."),
        **ERROR_RESPONSES,
        **BUSY_RESPONSES,
    },
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
            tags=engine.tag_filters_parse(request.query_params.getlist("tag")),
            testset=request.query_params.get("testset", ""),
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
    revisions = revisions_from_refs(project, data["evaluators"])
    logged = application is None or application.kind == Application.Kind.LOGGED
    engine.tags_validate(data["tags"])  # a dry run refuses what the real one would
    if logged and data["max_cost_usd"] is not None:
        raise InvalidInput(
            {
                "max_cost_usd": [
                    "A logged run calls nothing on evalsite's side: there is no spend to cap."
                ]
            }
        )
    if data["dry_run"]:
        if logged:
            raise InvalidInput(
                {"dry_run": ["A logged run calls nothing on evalsite's side: nothing to estimate."]}
            )
        estimate = engine.run_estimate(
            project=project,
            testset_version=version,
            application=application,
            revisions=revisions,
            repeats=data["repeats"],
            max_cost_usd=data["max_cost_usd"],
        )
        return Response({"dry_run": True, "estimate": estimate})
    common = {
        "project": project,
        "name": data["name"],
        "testset_version": version,
        "application": application,
        "revisions": revisions,
        "author": request.user,
        "description": data["description"],
        "tags": data["tags"],
    }
    if logged:
        run = engine.run_create_logged(**common)
    else:
        create = engine.run_submit if data["start"] else engine.run_create
        run = create(**common, repeats=data["repeats"], max_cost_usd=data["max_cost_usd"])
    return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


@extend_schema(
    methods=["GET"],
    responses={200: RunSerializer, **ERROR_RESPONSES},
    tags=TAGS,
    parameters=[RUN_ID],
)
@extend_schema(
    methods=["PATCH"],
    request=RunUpdateSerializer,
    responses={200: RunSerializer, **ERROR_RESPONSES},
    tags=TAGS,
    parameters=[RUN_ID],
)
@api_view(["GET", "PATCH"])
def run_detail(request, run_id):
    """A run. PATCH changes its name, description or tags (finished runs too: a pull request's
    number is often known only later)."""
    run = run_or_404(request, run_id)
    if request.method == "PATCH":
        body = RunUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        engine.run_update(run=run, **body.validated_data)
        run = run_or_404(request, run_id)
    return Response(RunSerializer(run).data)


def _action(service):
    @extend_schema(
        request=None,
        responses={200: RunSerializer, **ERROR_RESPONSES},
        tags=TAGS,
        parameters=[RUN_ID],
    )
    @api_view(["POST"])
    def view(request, run_id):
        run = run_or_404(request, run_id)
        service(run=run)
        return Response(RunSerializer(run_or_404(request, run_id)).data)

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
    run = run_or_404(request, run_id)
    body = RefListSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    engine.run_add_evaluators(
        run=run, revisions=revisions_from_refs(request.project, body.validated_data["evaluators"])
    )
    return Response(RunSerializer(run_or_404(request, run_id)).data)


# --- scenarios and results ------------------------------------------------------------------------


# --- metrics ------------------------------------------------------------------------------------


# --- annotations --------------------------------------------------------------------------------


urlpatterns = [
    path("applications", applications, name="api-applications"),
    path("runs", runs, name="api-runs"),
    path("runs/<str:run_id>", run_detail, name="api-run"),
    path("runs/<str:run_id>/start", run_start, name="api-run-start"),
    path("runs/<str:run_id>/cancel", run_cancel, name="api-run-cancel"),
    path("runs/<str:run_id>/retry", run_retry, name="api-run-retry"),
    path("runs/<str:run_id>/close", run_close, name="api-run-close"),
    path("runs/<str:run_id>/evaluators", run_evaluators_add, name="api-run-evaluators"),
]
