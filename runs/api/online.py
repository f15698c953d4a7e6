"""REST API for online evaluation rules: create, read, change, pause, resume, backfill, delete.

A rule's evaluations live in its live run: `GET /api/v1/runs/{run}/scenarios` for the rows and
`GET /api/v1/runs/{run}/metrics?buckets=true` for the time series (docs/online.md).
"""

from __future__ import annotations

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evalsite.rest import CursorPagination
from evaluators import selectors as evaluator_selectors
from runs import online
from runs.models import OnlineRule, RuleTarget

TAGS = ["online"]
RULE_ID = OpenApiParameter("rule_id", int, OpenApiParameter.PATH)

# --- serializers --------------------------------------------------------------------------------


class RuleFilterSerializer(serializers.Serializer):
    name = serializers.CharField(
        required=False, allow_blank=True, help_text="The root span's name, exactly."
    )
    attributes = serializers.DictField(
        required=False,
        help_text='Dotted path -> value, e.g. {"ag.meta.env": "prod"}; any span may hold it.',
    )
    since = serializers.DateTimeField(required=False, allow_null=True)
    until = serializers.DateTimeField(required=False, allow_null=True)


class BackfillProgressSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    total = serializers.IntegerField(
        help_text="Matching, sampled traces in the window (session rules: idle sessions)."
    )
    queued = serializers.IntegerField(help_text="Of them, not evaluated when it started.")
    evaluated = serializers.IntegerField()
    percent = serializers.FloatField()
    finished = serializers.BooleanField()
    started_at = serializers.CharField()


class OnlineRuleSerializer(serializers.ModelSerializer):
    slug = serializers.SerializerMethodField()
    evaluator = serializers.SerializerMethodField()
    revision = serializers.SerializerMethodField()
    filter = RuleFilterSerializer()
    run = serializers.IntegerField(source="run_id", allow_null=True, read_only=True)
    evaluated = serializers.SerializerMethodField()
    errors = serializers.SerializerMethodField()
    backfill = serializers.SerializerMethodField()

    class Meta:
        model = OnlineRule
        fields = [
            "id",
            "name",
            "slug",
            "evaluator",
            "revision",
            "filter",
            "sampling_rate",
            "bucket_seconds",
            "target",
            "idle_seconds",
            "active",
            "paused_reason",
            "run",
            "evaluated",
            "errors",
            "backfill",
            "created_at",
        ]

    def get_slug(self, rule) -> str:
        return online.rule_slug(rule)

    def get_evaluator(self, rule) -> dict:
        return {"id": rule.revision.evaluator_id, "slug": rule.revision.evaluator.slug}

    def get_revision(self, rule) -> dict:
        return rule.revision.reference

    def get_evaluated(self, rule) -> int:
        return rule.run.scenario_count if rule.run else 0

    def get_errors(self, rule) -> int:
        return rule.run.error_cells if rule.run else 0

    @extend_schema_field(BackfillProgressSerializer(allow_null=True))
    def get_backfill(self, rule) -> dict | None:
        progress = online.online_backfill_progress(rule=rule)
        return BackfillProgressSerializer(progress).data if progress else None


class OnlineRuleCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    evaluator = serializers.CharField(
        help_text="Evaluator id or slug (its newest revision), or a revision slug (my-eval-v2)."
    )
    filter = serializers.JSONField(
        required=False, default=dict, help_text="{name, attributes, since, until}"
    )
    sampling_rate = serializers.FloatField(required=False, default=1.0)
    bucket_seconds = serializers.IntegerField(required=False, default=3600)
    active = serializers.BooleanField(required=False, default=True)
    target = serializers.ChoiceField(
        choices=RuleTarget.choices,
        required=False,
        default=RuleTarget.TRACE,
        help_text="trace: each matching trace; session: each matching session once it is idle.",
    )
    idle_seconds = serializers.IntegerField(
        required=False,
        default=online.IDLE_DEFAULT_SECONDS,
        help_text="Session rules: judge a session once nothing of it arrived this long "
        "(10 s to 7 days).",
    )


class OnlineRuleUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    filter = serializers.JSONField(required=False, help_text="{name, attributes, since, until}")
    sampling_rate = serializers.FloatField(required=False)
    bucket_seconds = serializers.IntegerField(required=False)
    idle_seconds = serializers.IntegerField(required=False, help_text="Session rules.")


class PauseSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class BackfillSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField(required=False, allow_null=True, default=None)


# --- helpers ------------------------------------------------------------------------------------


def _rules(request):
    return OnlineRule.objects.for_project(request.project).select_related(
        "run", "revision__evaluator", "project"
    )


def _rule_or_404(request, rule_id) -> OnlineRule:
    rule = _rules(request).filter(pk=rule_id).first() if str(rule_id).isdecimal() else None
    if rule is None:
        raise Http404
    return rule


def _revision(project, ref: str):
    revision = evaluator_selectors.revision_resolve(project=project, ref=ref)
    if revision is None:
        raise InvalidInput({"evaluator": [f"No evaluator or revision {ref!r} in this project."]})
    return revision


def _rule_body(request, rule_id) -> Response:
    return Response(OnlineRuleSerializer(_rule_or_404(request, rule_id)).data)


# --- views --------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    responses={200: OnlineRuleSerializer(many=True), **ERROR_RESPONSES},
    parameters=[OpenApiParameter("active", bool)],
    tags=TAGS,
)
@extend_schema(
    methods=["POST"],
    request=OnlineRuleCreateSerializer,
    responses={201: OnlineRuleSerializer, **ERROR_RESPONSES},
    tags=TAGS,
)
@api_view(["GET", "POST"])
def rules(request):
    """Online rules: an evaluator + a trace filter + a sampling rate (by trace id). New matching
    traces are evaluated shortly after they arrive; human and feedback evaluators are refused.
    With `target: "session"`, each matching session (sampled by session id) is judged once it has
    been idle for `idle_seconds`, and again after it resumes; its evaluator must judge sessions
    (else 400 on `revision`)."""
    if request.method == "POST":
        body = OnlineRuleCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        rule = online.online_rule_create(
            project=request.project,
            name=data["name"],
            revision=_revision(request.project, data["evaluator"]),
            filter=data["filter"],
            sampling_rate=data["sampling_rate"],
            bucket_seconds=data["bucket_seconds"],
            active=data["active"],
            target=data["target"],
            idle_seconds=data["idle_seconds"],
            author=request.user,
        )
        return Response(
            OnlineRuleSerializer(_rule_or_404(request, rule.pk)).data,
            status=status.HTTP_201_CREATED,
        )
    queryset = _rules(request)
    if request.query_params.get("active") in ("true", "1", "false", "0"):
        queryset = queryset.filter(active=request.query_params["active"] in ("true", "1"))
    paginator = CursorPagination()
    page = paginator.paginate_queryset(queryset, request)
    return paginator.get_paginated_response(OnlineRuleSerializer(page, many=True).data)


@extend_schema(
    methods=["GET"],
    responses={200: OnlineRuleSerializer, **ERROR_RESPONSES},
    parameters=[RULE_ID],
    tags=TAGS,
)
@extend_schema(
    methods=["PATCH"],
    request=OnlineRuleUpdateSerializer,
    responses={200: OnlineRuleSerializer, **ERROR_RESPONSES},
    parameters=[RULE_ID],
    tags=TAGS,
)
@extend_schema(
    methods=["DELETE"],
    responses={204: None, **ERROR_RESPONSES},
    parameters=[RULE_ID],
    tags=TAGS,
)
@api_view(["GET", "PATCH", "DELETE"])
def rule_detail(request, rule_id):
    """One rule. PATCH changes what it matches from now on (the evaluator and the target are
    fixed: make a new rule for another one). DELETE keeps its live run, closed, with its
    metrics."""
    rule = _rule_or_404(request, rule_id)
    if request.method == "DELETE":
        online.online_rule_delete(rule=rule)
        return Response(status=status.HTTP_204_NO_CONTENT)
    if request.method == "PATCH":
        body = OnlineRuleUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        online.online_rule_update(rule=rule, **body.validated_data)
    return _rule_body(request, rule_id)


@extend_schema(
    request=PauseSerializer,
    responses={200: OnlineRuleSerializer, **ERROR_RESPONSES},
    parameters=[RULE_ID],
    tags=TAGS,
)
@api_view(["POST"])
def rule_pause(request, rule_id):
    """Stop evaluating (work already queued finds the rule paused and does nothing)."""
    body = PauseSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    online.online_rule_pause(rule=_rule_or_404(request, rule_id), **body.validated_data)
    return _rule_body(request, rule_id)


@extend_schema(
    request=None,
    responses={200: OnlineRuleSerializer, **ERROR_RESPONSES},
    parameters=[RULE_ID],
    tags=TAGS,
)
@api_view(["POST"])
def rule_resume(request, rule_id):
    """Evaluate new traces again; backfill the paused period if it matters."""
    online.online_rule_resume(rule=_rule_or_404(request, rule_id))
    return _rule_body(request, rule_id)


@extend_schema(
    request=BackfillSerializer,
    responses={202: BackfillProgressSerializer, **ERROR_RESPONSES},
    parameters=[RULE_ID],
    tags=TAGS,
)
@api_view(["POST"])
def rule_backfill(request, rule_id):
    """Evaluate the matching, sampled traces that started in [since, until) (until defaults to
    now) and are not evaluated yet, in background chunks. Repeating it is safe. The answer,
    and the rule's `backfill` field afterwards, show the progress."""
    body = BackfillSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    progress = online.online_backfill(rule=_rule_or_404(request, rule_id), **body.validated_data)
    return Response(BackfillProgressSerializer(progress).data, status=status.HTTP_202_ACCEPTED)


urlpatterns = [
    path("online-rules", rules, name="api-online-rules"),
    path("online-rules/<str:rule_id>", rule_detail, name="api-online-rule"),
    path("online-rules/<str:rule_id>/pause", rule_pause, name="api-online-rule-pause"),
    path("online-rules/<str:rule_id>/resume", rule_resume, name="api-online-rule-resume"),
    path("online-rules/<str:rule_id>/backfill", rule_backfill, name="api-online-rule-backfill"),
]
