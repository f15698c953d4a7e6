"""Traces REST API: native batch ingestion, OTLP/HTTP ingestion, list and read.

Ingestion is a write: it needs the editor role (an editor's or owner's API key). Viewers read.
"""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, time

from django.http import Http404, HttpResponse
from django.urls import path
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.utils import inline_serializer as shape
from rest_framework import exceptions, generics, serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from evalsite.errors import InvalidInput
from runs.models import Trace
from runs.traces import (
    JSON,
    PROTOBUF,
    TooLarge,
    limits,
    otlp_ingest,
    trace_dict,
    trace_ingest,
    trace_list,
)


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_code = "too_large"
    default_detail = "The request is larger than the limit."


TOO_LARGE = {413: OpenApiResponse(description="Over a documented limit; the message says which.")}


def _check_size(request) -> None:
    # Before the body is read: a client sending too much learns it without being read.
    limit, length = limits().body_bytes, int(request.META.get("CONTENT_LENGTH") or 0)
    if length > limit:
        raise PayloadTooLarge(f"body: {length} bytes; the limit is {limit}")


def _body(request) -> bytes:
    """The raw body within the size limit, decompressed when the client compressed it."""
    _check_size(request)
    limit, body = limits().body_bytes, request.body
    encoding = request.headers.get("Content-Encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):
        inflater = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
        try:
            body = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise InvalidInput({"body": [f"not valid {encoding} ({exc})"]})
        if len(body) > limit or inflater.unconsumed_tail:
            raise PayloadTooLarge(f"body: more than {limit} bytes once decompressed")
    elif encoding != "identity":
        raise exceptions.UnsupportedMediaType(f"Content-Encoding {encoding}")
    return body


# --- native ingestion, list -----------------------------------------------------------------


class TraceSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = Trace
        fields = [
            "trace_id",
            "name",
            "root_span_id",
            "start_time",
            "end_time",
            "duration_ms",
            "status",
            "tokens",
            "cost",
            "span_count",
            "source",
            "created_at",
            "updated_at",
        ]


SPAN_FIELDS = {
    "trace_id": serializers.CharField(),
    "span_id": serializers.CharField(),
    "parent_id": serializers.CharField(allow_null=True, required=False),
    "name": serializers.CharField(),
    "kind": serializers.CharField(required=False, help_text="workflow, agent, llm, tool, ..."),
    "start_time": serializers.DateTimeField(),
    "end_time": serializers.DateTimeField(allow_null=True, required=False),
    "status": serializers.ChoiceField(choices=["ok", "error"], required=False),
    "status_message": serializers.CharField(allow_null=True, required=False),
    "attributes": serializers.JSONField(
        required=False, help_text='{"ag": {"data", "metrics": {"unit"}, "meta"}, ...otel}'
    ),
}
INGEST_REQUEST = shape(
    "TraceIngest",
    {
        "spans": serializers.ListField(
            child=serializers.JSONField(),
            help_text="Flat spans (see TraceSpan) and/or trace dicts "
            '(`{"trace_id", "spans": {root_id: {..., "children": {...}}}}`).',
        )
    },
)
INGEST_RESPONSE = shape(
    "TraceIngested",
    {
        "traces": serializers.ListField(child=serializers.CharField()),
        "spans": serializers.IntegerField(),
    },
)
LIST_PARAMETERS = [
    OpenApiParameter("name", str, description="Root span name, exactly."),
    OpenApiParameter("search", str, description="Substring of the name, or a trace id."),
    OpenApiParameter("status", str, enum=["ok", "error"], description="error: any span failed."),
    OpenApiParameter("source", str, description="api, otlp, invocation, judge."),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Started at or after."),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="Started before."),
    OpenApiParameter(
        "attr.<path>",
        str,
        description="Any span has this attribute value, e.g. `attr.ag.meta.env=prod` or "
        "`attr.gen_ai.request.model=gpt-4o-mini`; repeat for several.",
    ),
]


class TraceListView(generics.GenericAPIView):
    queryset = Trace.objects.none()
    serializer_class = TraceSummarySerializer

    @extend_schema(
        parameters=LIST_PARAMETERS,
        responses={200: TraceSummarySerializer(many=True), **ERROR_RESPONSES},
        tags=["traces"],
    )
    def get(self, request):
        """Trace summaries of the project, newest first, cursor-paginated."""
        traces = trace_list(project=request.project, **_filters(request.query_params))
        page = self.paginate_queryset(traces.order_by("-id"))
        return self.get_paginated_response(TraceSummarySerializer(page, many=True).data)

    @extend_schema(
        request=INGEST_REQUEST,
        responses={200: INGEST_RESPONSE, **ERROR_RESPONSES, **TOO_LARGE},
        tags=["traces"],
        description="Store spans (upserted on trace id + span id) and answer the touched trace "
        'ids. The body is `{"spans": [...]}`, `{"traces": [...]}`, a bare list, or one trace '
        "dict as `GET /traces/{trace_id}` returns it. All or nothing: on a 400 or 413 nothing "
        "is stored. Needs the editor role.",
    )
    def post(self, request):
        _check_size(request)
        try:
            traces = trace_ingest(project=request.project, spans=_spans_of(request.data))
        except TooLarge as exc:
            raise PayloadTooLarge(str(exc))
        received = sum(trace.spans_received for trace in traces)
        return Response({"traces": [t.trace_id for t in traces], "spans": received})


def _spans_of(data) -> list:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        if isinstance(data.get("spans"), dict):
            return [data]  # one trace dict, as GET /traces/{id} returns it
        items = data.get("spans", data.get("traces"))
        if isinstance(items, list):
            return items
    raise InvalidInput({"spans": ['send {"spans": [...]} (flat spans or trace dicts)']})


def _filters(params) -> dict:
    filters = {key: params.get(key, "") for key in ("name", "search", "status", "source")}
    for key in ("since", "until"):
        if params.get(key):
            filters[key] = _datetime(key, params[key])
    filters["attributes"] = {
        key.removeprefix("attr."): value for key, value in params.items() if key.startswith("attr.")
    }
    return filters


def _datetime(name: str, value: str) -> datetime:
    parsed = parse_datetime(value)
    if parsed is None and (day := parse_date(value)):
        parsed = datetime.combine(day, time.min)
    if parsed is None:
        raise InvalidInput({name: ["invalid datetime; use ISO 8601 (2026-11-20T10:00:00Z)"]})
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


TRACE_CONTRACT = shape(
    "TraceContract",
    {
        "trace_id": serializers.CharField(),
        "spans": serializers.DictField(
            child=shape("TraceSpan", {**SPAN_FIELDS, "children": serializers.DictField()}),
            help_text="Root spans keyed by span id; each has its children keyed the same way.",
        ),
    },
)


@extend_schema(
    parameters=[OpenApiParameter("trace_id", str, OpenApiParameter.PATH)],
    responses={200: TRACE_CONTRACT, **ERROR_RESPONSES},
    tags=["traces"],
)
@api_view(["GET"])
def trace_detail(request, trace_id: str):
    """The whole trace in the shape evaluators receive (docs/traces.md)."""
    trace = Trace.objects.for_project(request.project).filter(trace_id=trace_id).first()
    if trace is None:
        raise Http404
    return Response(trace_dict(trace))


# --- OTLP/HTTP --------------------------------------------------------------------------------


@extend_schema(
    request={PROTOBUF: OpenApiTypes.BINARY, JSON: OpenApiTypes.OBJECT},
    responses={
        (200, PROTOBUF): OpenApiResponse(
            OpenApiTypes.BINARY, description="An empty ExportTraceServiceResponse."
        ),
        (200, JSON): OpenApiResponse(OpenApiTypes.OBJECT, description="`{}`"),
        **ERROR_RESPONSES,
        **TOO_LARGE,
        415: OpenApiResponse(description="Neither application/x-protobuf nor application/json."),
    },
    tags=["traces"],
    operation_id="otlp_traces_export",
)
@api_view(["POST"])
def otlp_traces(request):
    """OTLP/HTTP trace export: point an OpenTelemetry exporter here with
    `Authorization: Bearer <key>`. Protobuf (the SDKs' default) or JSON, optionally gzipped.
    Errors to protobuf clients are a protobuf `google.rpc.Status`, as the OTLP spec says."""
    content_type = request.content_type
    if content_type not in (PROTOBUF, JSON):
        raise exceptions.UnsupportedMediaType(content_type or "(none)")
    try:
        otlp_ingest(project=request.project, body=_body(request), content_type=content_type)
    except (InvalidInput, PayloadTooLarge) as exc:
        too_large = isinstance(exc, TooLarge | PayloadTooLarge)
        message = str(exc.detail) if isinstance(exc, PayloadTooLarge) else str(exc)
        if content_type == PROTOBUF:
            return _rpc_status(413 if too_large else 400, message)
        if isinstance(exc, TooLarge):
            raise PayloadTooLarge(message)
        raise
    if content_type == PROTOBUF:
        return HttpResponse(b"", content_type=PROTOBUF)
    return Response({})


def _rpc_status(http_status: int, message: str) -> HttpResponse:
    # google.rpc.Status{code = 1, message = 2}, encoded by hand: the only message we send,
    # not worth a dependency. Codes: 3 INVALID_ARGUMENT, 8 RESOURCE_EXHAUSTED.
    code = 8 if http_status == 413 else 3
    text = message.encode()
    body = bytes([0x08, code, 0x12]) + _varint(len(text)) + text
    return HttpResponse(body, status=http_status, content_type=PROTOBUF)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


urlpatterns = [
    path("traces", TraceListView.as_view(), name="api-trace-list"),
    path("traces/<str:trace_id>", trace_detail, name="api-trace-detail"),
    path("otlp/v1/traces", otlp_traces, name="api-otlp-traces"),
]
