"""Sessions REST API: the project's sessions (filtered, keyset-paginated) and one session, as a
summary with its traces and conversation, or whole as session evaluators receive it."""

from __future__ import annotations

from django.http import Http404
from django.urls import path, re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
)
from drf_spectacular.utils import inline_serializer as shape
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from runs.api.traces import TRACE_CONTRACT
from runs.models import Session, Trace
from runs.traces.sessions import (
    session_cursor,
    session_cursor_parse,
    session_dict,
    session_get,
    session_list,
    session_overview,
    session_span_count,
)

DETAIL_MAX_TRACES = 1_000  # traces (and their messages) in a session's summary
FULL_MAX_SPANS = 20_000  # spans ``?full=1`` loads and answers at most
DATETIME_FORMATS = ["iso-8601", "%Y-%m-%d"]


class SessionSerializer(serializers.ModelSerializer):
    class Meta:
        model = Session
        fields = [
            "session_id",
            "trace_count",
            "start_time",
            "last_activity",
            "duration_ms",
            "status",
            "tokens",
            "cost",
            "created_at",
            "updated_at",
        ]


class SessionTraceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Trace
        fields = [
            "trace_id",
            "name",
            "start_time",
            "end_time",
            "duration_ms",
            "status",
            "tokens",
            "cost",
            "span_count",
        ]


class SessionFiltersSerializer(serializers.Serializer):
    """The list's query parameters, checked: a bad one is a 400 naming it."""

    search = serializers.CharField(
        required=False, max_length=200, help_text="Substring of the session id."
    )
    session_id = serializers.CharField(
        required=False,
        trim_whitespace=False,
        help_text="Exactly this session id (any characters, URL-encoded): the session whose id "
        "cannot be a URL path.",
    )
    status = serializers.ChoiceField(
        required=False, choices=["ok", "error"], help_text="error: any of its traces failed."
    )
    since = serializers.DateTimeField(
        required=False, input_formats=DATETIME_FORMATS, help_text="Last active at or after."
    )
    until = serializers.DateTimeField(
        required=False, input_formats=DATETIME_FORMATS, help_text="Last active before."
    )
    min_turns = serializers.IntegerField(
        required=False, min_value=1, help_text="At least this many traces."
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=500, default=50, help_text="Sessions per page."
    )
    cursor = serializers.CharField(
        required=False, help_text="Where the previous page ended: follow `next`."
    )

    def validate_cursor(self, value: str):
        cursor = session_cursor_parse(value)
        if cursor is None:
            raise serializers.ValidationError("not a cursor of this list; follow `next`.")
        return cursor


SESSION_PAGE = shape(
    "SessionPage",
    {
        "next": serializers.URLField(allow_null=True, help_text="The next page, or null."),
        "previous": serializers.URLField(
            allow_null=True, help_text="Always null: keyset pages go forward from the newest."
        ),
        "results": SessionSerializer(many=True),
    },
)


@extend_schema(
    parameters=[SessionFiltersSerializer],
    responses={200: SESSION_PAGE, **ERROR_RESPONSES},
    tags=["sessions"],
    operation_id="sessions_list",
)
@api_view(["GET"])
def session_list_api(request):
    """Sessions of the project, most recently active first, keyset-paginated (`next`)."""
    filters = SessionFiltersSerializer(data=request.query_params)
    filters.is_valid(raise_exception=True)
    data = filters.validated_data
    sessions = session_list(
        project=request.project,
        search=data.get("search", ""),
        session_id=data.get("session_id"),
        status=data.get("status", ""),
        since=data.get("since"),
        until=data.get("until"),
        min_traces=data.get("min_turns"),
        before=data.get("cursor"),
    )
    page = list(sessions[: data["limit"] + 1])
    more = len(page) > data["limit"]
    page = page[: data["limit"]]
    url = request.build_absolute_uri()
    return Response(
        {
            "next": replace_query_param(url, "cursor", session_cursor(page[-1])) if more else None,
            "previous": None,
            "results": SessionSerializer(page, many=True).data,
        }
    )


MESSAGES = serializers.ListField(
    child=serializers.DictField(),
    help_text="The conversation, OpenAI-style (`role`, `content`, ...), assembled from the "
    "traces' root inputs and outputs (docs/traces.md, Sessions).",
)
SESSION_DETAIL = shape(
    "SessionDetail",
    {
        **{name: field for name, field in SessionSerializer().get_fields().items()},
        "traces": SessionTraceSerializer(many=True, help_text="In time order."),
        "truncated": serializers.BooleanField(
            help_text=f"The session has more than the {DETAIL_MAX_TRACES:,} traces listed "
            "(and messages are those of the listed traces)."
        ),
        "messages": MESSAGES,
    },
)
SESSION_CONTRACT = shape(
    "SessionContract",
    {
        "session_id": serializers.CharField(),
        "traces": serializers.ListField(child=TRACE_CONTRACT, help_text="In time order."),
        "messages": MESSAGES,
    },
)


@extend_schema(
    parameters=[
        OpenApiParameter("session_id", str, OpenApiParameter.PATH),
        OpenApiParameter(
            "full",
            OpenApiTypes.BOOL,
            description="`1`: the session exactly as session evaluators receive it "
            "(`{session_id, traces: [trace contract, ...], messages}`), up to "
            f"{FULL_MAX_SPANS:,} spans in all.",
        ),
    ],
    responses={
        200: PolymorphicProxySerializer(
            component_name="SessionRead",
            serializers=[SESSION_DETAIL, SESSION_CONTRACT],
            resource_type_field_name=None,
        ),
        **ERROR_RESPONSES,
    },
    tags=["sessions"],
    operation_id="sessions_retrieve",
)
@api_view(["GET"])
def session_detail_api(request, session_id: str):
    """One session: its summary, its traces in time order and the conversation; with `full=1`,
    the evaluator contract's session dict."""
    session = session_get(project=request.project, session_id=session_id)
    if session is None:
        raise Http404
    if request.query_params.get("full") in ("1", "true"):
        spans = session_span_count(session)
        if spans > FULL_MAX_SPANS:
            raise InvalidInput(
                {
                    "full": [
                        f"the session has {spans:,} spans; full=1 answers up to "
                        f"{FULL_MAX_SPANS:,}: read its traces one by one (GET /traces/{{id}})"
                    ]
                }
            )
        return Response(session_dict(session))
    traces, messages = session_overview(session, limit=DETAIL_MAX_TRACES)
    return Response(
        {
            **SessionSerializer(session).data,
            "traces": SessionTraceSerializer(traces, many=True).data,
            "truncated": session.trace_count > len(traces),
            "messages": messages,
        }
    )


urlpatterns = [
    path("sessions", session_list_api, name="api-session-list"),
    # Any characters: a session id is the client's free text and may hold slashes or newlines
    # (``<path:...>`` stops at a newline). Ids with ``..`` segments are best asked for with
    # ``GET /sessions?session_id=``, which no client normalises.
    re_path(r"^sessions/(?P<session_id>[\s\S]+)$", session_detail_api, name="api-session-detail"),
]
