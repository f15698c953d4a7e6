"""REST API for replaying production: production traces (or sessions) into a testset, and two
runs over it, production's outputs and a new application version, to compare (docs/replay.md).
"""

from __future__ import annotations

from django.urls import path, reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from runs import online, testsets
from runs.api.runs import RunSerializer, revisions_from_refs
from runs.models import Application

TAGS = ["replay"]


class ReplayFiltersSerializer(serializers.Serializer):
    search = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="Traces: in the name, or a trace id. Sessions: in the session id.",
    )
    status = serializers.CharField(
        required=False, allow_blank=True, help_text="`ok`, or `error` (any span failed)."
    )
    since = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="Traces: started at or after this. Sessions: last active at or after this.",
    )
    until = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="Traces: started before this. Sessions: last active before this.",
    )
    min_turns = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=1_000_000,
        help_text="Sessions only: at least this many traces (turns).",
    )
    name = serializers.CharField(
        required=False, allow_blank=True, help_text="Traces only: the root span's name, exactly."
    )
    source = serializers.CharField(
        required=False, allow_blank=True, help_text="Traces only: `api` or `otlp`."
    )
    attributes = serializers.DictField(
        required=False,
        help_text='Traces only: dotted path -> value that any span has, e.g. {"ag.meta.env": '
        '"prod"}.',
    )


class ReplayCreateSerializer(serializers.Serializer):
    source = serializers.CharField(
        required=False,
        default="traces",
        help_text="`traces`, or `sessions` (each session's first production turn).",
    )
    filters = ReplayFiltersSerializer(
        required=False,
        default=dict,
        help_text="Which traces or sessions. Only production traces (sent through the API or "
        "OTLP) are replayed; runs' own traces never are.",
    )
    limit = serializers.IntegerField(
        required=False,
        default=online.REPLAY_DEFAULT_LIMIT,
        help_text=f"The newest this many matches become rows (1 to {online.REPLAY_MAX_LIMIT:,}); "
        "refused, saying how many fit, when their rows exceed the testset size limit.",
    )
    name = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=200, help_text="A new testset."
    )
    testset = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="Instead of a new testset: an existing one's id or slug, whose rows the "
        "replay replaces in a new version.",
    )
    application = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="The candidate: an application's id or slug (http, usually).",
    )
    evaluators = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        default=list,
        help_text="Evaluator ids or slugs (their newest revision) or revision slugs; both runs "
        "use them.",
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Only count the matches and show the first rows; create nothing.",
    )


REPLAY_RESPONSE = inline_serializer(
    "Replay",
    {
        "replay": serializers.CharField(help_text="The runs' `replay` tag."),
        "source": serializers.CharField(),
        "rows": serializers.IntegerField(),
        "testset": inline_serializer(
            "ReplayTestset",
            {
                "id": serializers.IntegerField(),
                "slug": serializers.CharField(),
                "name": serializers.CharField(),
                "version": serializers.IntegerField(),
                "columns": serializers.ListField(child=serializers.CharField()),
            },
        ),
        "runs": inline_serializer(
            "ReplayRuns", {"production": RunSerializer(), "candidate": RunSerializer()}
        ),
        "compare_url": serializers.URLField(help_text="The comparison page."),
        "compare_api_url": serializers.URLField(help_text="The comparison in the API."),
    },
)
DRY_RUN = inline_serializer(
    "ReplayDryRun",
    {
        "dry_run": serializers.BooleanField(),
        "source": serializers.CharField(),
        "matched": serializers.IntegerField(
            help_text=f"Matches, counted up to {online.REPLAY_MAX_LIMIT + 1:,}."
        ),
        "rows": serializers.IntegerField(help_text="Rows the testset would get."),
        "limit": serializers.IntegerField(),
        "more": serializers.BooleanField(help_text="More match than the limit takes."),
        "columns": serializers.ListField(child=serializers.CharField()),
        "sample": serializers.ListField(child=serializers.JSONField(), help_text="First rows."),
    },
)


def _application(project, ref: str) -> Application | None:
    if not ref:
        return None
    lookup = {"pk": int(ref)} if ref.isdecimal() else {"slug": ref}
    app = Application.objects.for_project(project).filter(**lookup).first()
    if app is None:
        raise InvalidInput({"application": [f"No application {ref!r} in this project."]})
    return app


def _testset(project, ref: str):
    if not ref:
        return None
    found = testsets.testset_get(project=project, ref=ref)
    if found is None:
        raise InvalidInput({"testset": [f"No testset {ref!r} in this project."]})
    return found


@extend_schema(
    request=ReplayCreateSerializer,
    responses={
        201: REPLAY_RESPONSE,
        200: OpenApiResponse(DRY_RUN, description="dry_run: the count and first rows."),
        **ERROR_RESPONSES,
    },
    tags=TAGS,
)
@api_view(["POST"])
def replays(request):
    """Replay production: the newest matching production traces (or sessions: their first
    turn) become a testset with `production_output` (for a failed trace, its error in
    `production_error`: the production side records an error there, never a score) and, where
    people gave one, `correct_answer`; two runs with the same evaluators are queued over it, production's outputs
    (tag `side:production`) and the application's (`side:candidate`), both tagged
    `replay:<id>`. Answers both runs and the comparison's links. Needs the editor role."""
    body = ReplayCreateSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    data, project = body.validated_data, request.project
    filters = online.replay_filters_parse(data["source"], data["filters"])
    choices = {
        "testset": _testset(project, data["testset"]),
        "application": _application(project, data["application"]),
        "evaluators": revisions_from_refs(project, data["evaluators"]),
    }
    common = {"project": project, "source": data["source"], "filters": filters}
    if data["dry_run"]:
        preview = online.replay_preview(**common, limit=data["limit"])
        return Response(
            {
                "dry_run": True,
                "source": preview.source,
                "matched": preview.matched,
                "rows": preview.count,
                "limit": preview.limit,
                "more": preview.more,
                "columns": preview.columns,
                "sample": preview.rows,
            }
        )
    replay = online.replay_create(
        **common, **choices, limit=data["limit"], name=data["name"], user=request.user
    )
    return Response(_replay_body(request, replay), status=status.HTTP_201_CREATED)


def _replay_body(request, replay) -> dict:
    query = replay.compare_query
    page = reverse("run-compare", args=[request.project.slug])
    return {
        "replay": replay.id,
        "source": replay.source,
        "rows": replay.version.row_count,
        "testset": {
            "id": replay.testset.pk,
            "slug": replay.testset.slug,
            "name": replay.testset.name,
            "version": replay.version.version,
            "columns": replay.version.columns,
        },
        "runs": {
            "production": RunSerializer(replay.production).data,
            "candidate": RunSerializer(replay.candidate).data,
        },
        "compare_url": request.build_absolute_uri(f"{page}?{query}"),
        "compare_api_url": request.build_absolute_uri(f"{reverse('api-run-compare')}?{query}"),
    }


urlpatterns = [path("replays", replays, name="api-replays")]
