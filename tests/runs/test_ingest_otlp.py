"""OTLP/HTTP ingestion: JSON, protobuf, and the real OpenTelemetry Python exporter."""

import base64
import gzip
import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from evalsite.models import Role
from evalsite.services import api_key_create
from runs.models import Span, Trace
from runs.traces import trace_dict

URL = "/api/v1/otlp/v1/traces"
TRACE = "5b8efff798038103d269b633813fc60c"
ROOT, CHAT = "eee19b7ec3c1b174", "eee19b7ec3c1b173"
NANOS = 1_795_600_000_000_000_000  # 2026-11-25T09:46:40Z


def otlp_json(**chat_extra):
    chat = {
        "traceId": TRACE,
        "spanId": CHAT,
        "parentSpanId": ROOT,
        "name": "chat gpt-4o-mini",
        "kind": 3,
        "startTimeUnixNano": str(NANOS + 100_000_000),
        "endTimeUnixNano": str(NANOS + 1_180_000_000),
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.system", "value": {"stringValue": "openai"}},
            {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o-mini"}},
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "42"}},
            {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 9}},
            {"key": "gen_ai.request.temperature", "value": {"doubleValue": 0.2}},
            {"key": "gen_ai.request.stream", "value": {"boolValue": False}},
            {
                "key": "gen_ai.response.finish_reasons",
                "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}},
            },
            {
                "key": "llm.invocation",
                "value": {"kvlistValue": {"values": [{"key": "seed", "value": {"intValue": "7"}}]}},
            },
        ],
        "status": {},
        **chat_extra,
    }
    root = {
        "traceId": TRACE,
        "spanId": ROOT,
        "parentSpanId": "",
        "name": "capital_qa",
        "kind": "SPAN_KIND_SERVER",
        "startTimeUnixNano": str(NANOS),
        "endTimeUnixNano": str(NANOS + 1_234_500_000),
        "attributes": [
            {"key": "input.value", "value": {"stringValue": '{"country": "France"}'}},
            {"key": "input.mime_type", "value": {"stringValue": "application/json"}},
            {"key": "output.value", "value": {"stringValue": "Paris"}},
        ],
    }
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "qa-app"}}]
                },
                "scopeSpans": [
                    {"scope": {"name": "openai.instrumentation"}, "spans": [root, chat]}
                ],
            }
        ]
    }


def test_it_maps_otlp_json_with_genai_attributes(api, project):
    response = api.post(URL, otlp_json(), format="json")
    assert response.status_code == 200 and response.json() == {}
    trace = Trace.objects.get(project=project)
    assert (trace.trace_id, trace.name, trace.source, trace.tokens) == (
        TRACE,
        "capital_qa",
        "otlp",
        51,
    )
    data = trace_dict(trace)
    root = data["spans"][ROOT]
    assert root["start_time"] == "2026-11-25T09:46:40.000Z"
    assert root["attributes"]["ag"]["data"] == {"inputs": {"country": "France"}, "outputs": "Paris"}
    assert root["attributes"]["ag"]["metrics"]["unit"]["duration"] == {"total": 1234.5}
    assert root["attributes"]["ag"]["metrics"]["acc"]["tokens"]["total"] == 51
    assert root["attributes"]["ag"]["meta"]["service"] == "qa-app"
    chat = root["children"][CHAT]
    assert chat["kind"] == "llm"
    ag = chat["attributes"]["ag"]
    assert ag["metrics"]["unit"]["tokens"] == {"prompt": 42, "completion": 9, "total": 51}
    assert ag["meta"]["model"] == "gpt-4o-mini" and ag["meta"]["system"] == "openai"
    assert ag["meta"]["otel"]["span_kind"] == "client"
    assert ag["meta"]["otel"]["scope"] == "openai.instrumentation"
    assert chat["attributes"]["gen_ai.request.temperature"] == 0.2
    assert chat["attributes"]["gen_ai.request.stream"] is False
    assert chat["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
    assert chat["attributes"]["llm.invocation"] == {"seed": 7}


def test_it_reads_base64_ids_and_error_status(api, project):
    body = otlp_json(
        status={"code": 2},
        events=[
            {
                "name": "exception",
                "timeUnixNano": str(NANOS + 1_000_000_000),
                "attributes": [
                    {"key": "exception.type", "value": {"stringValue": "RateLimitError"}},
                    {"key": "exception.message", "value": {"stringValue": "slow down"}},
                ],
            }
        ],
    )
    chat = body["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    chat["traceId"] = base64.b64encode(bytes.fromhex(TRACE)).decode()
    chat["spanId"] = base64.b64encode(bytes.fromhex(CHAT)).decode()
    assert api.post(URL, body, format="json").status_code == 200
    trace = Trace.objects.get()
    assert trace.status == "error" and trace.span_count == 2
    chat_span = trace_dict(trace)["spans"][ROOT]["children"][CHAT]
    assert chat_span["status"] == "error"
    assert chat_span["status_message"] == "RateLimitError: slow down"
    assert chat_span["attributes"]["ag"]["meta"]["otel"]["events"][0]["name"] == "exception"


def kv(key, value):
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def otlp_protobuf(**chat_changes) -> bytes:
    root = PbSpan(
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes.fromhex(ROOT),
        name="agent",
        kind=PbSpan.SPAN_KIND_INTERNAL,
        start_time_unix_nano=NANOS,
        end_time_unix_nano=NANOS + 2_000_000_000,
        attributes=[kv("openinference.span.kind", "AGENT"), kv("ag.data.inputs", '{"q": "hi"}')],
    )
    chat = PbSpan(
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes.fromhex(CHAT),
        parent_span_id=bytes.fromhex(ROOT),
        name="chat",
        kind=PbSpan.SPAN_KIND_CLIENT,
        start_time_unix_nano=NANOS + 10_000_000,
        end_time_unix_nano=NANOS + 900_000_000,
        attributes=[
            kv("gen_ai.system", "anthropic"),
            kv("gen_ai.usage.prompt_tokens", 100),
            kv("gen_ai.usage.completion_tokens", 20),
            kv("score", float("nan")),
            KeyValue(
                key="tags",
                value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")])),
            ),
            KeyValue(
                key="extra",
                value=AnyValue(kvlist_value=KeyValueList(values=[kv("deep", True)])),
            ),
        ],
        status=Status(code=Status.STATUS_CODE_ERROR, message="overloaded"),
    )
    for field, value in chat_changes.items():
        if field == "attributes":
            chat.attributes.extend(value)
        else:
            setattr(chat, field, value)
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[kv("service.name", "agent-svc")]),
                scope_spans=[
                    ScopeSpans(scope=InstrumentationScope(name="manual"), spans=[chat, root])
                ],
            )
        ]
    )
    return request.SerializeToString()


def test_it_ingests_otlp_protobuf(api, project):
    response = api.post(URL, otlp_protobuf(), content_type="application/x-protobuf")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-protobuf"
    ExportTraceServiceResponse.FromString(response.content)  # an empty, valid response
    data = trace_dict(Trace.objects.get(project=project))
    root = data["spans"][ROOT]
    assert root["kind"] == "agent"
    assert root["attributes"]["ag"]["data"]["inputs"] == {"q": "hi"}
    chat = root["children"][CHAT]
    assert (chat["kind"], chat["status"], chat["status_message"]) == ("llm", "error", "overloaded")
    assert chat["attributes"]["ag"]["metrics"]["unit"]["tokens"]["total"] == 120
    assert chat["attributes"]["score"] == "nan"
    assert chat["attributes"]["tags"] == ["a"] and chat["attributes"]["extra"] == {"deep": True}
    assert root["attributes"]["ag"]["metrics"]["acc"]["tokens"]["total"] == 120


def test_it_accepts_gzipped_bodies(api, project):
    response = api.post(
        URL,
        gzip.compress(otlp_protobuf()),
        content_type="application/x-protobuf",
        HTTP_CONTENT_ENCODING="gzip",
    )
    assert response.status_code == 200 and Span.objects.count() == 2


def test_it_refuses_a_malformed_protobuf_with_a_status_message(api):
    response = api.post(URL, b"\xff\xff\xff garbage", content_type="application/x-protobuf")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/x-protobuf"
    assert b"not an OTLP ExportTraceServiceRequest" in response.content
    assert not Span.objects.exists()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s.update(traceId="xyz"), "resourceSpans[0].scopeSpans[0].spans[1].traceId"),
        (
            lambda s: s.update(startTimeUnixNano="soon"),
            "resourceSpans[0].scopeSpans[0].spans[1].startTimeUnixNano",
        ),
        (
            lambda s: s["attributes"].append({"key": "n", "value": {"intValue": "ten"}}),
            "resourceSpans[0].scopeSpans[0].spans[1].attributes[9].value",
        ),
    ],
)
def test_it_refuses_malformed_otlp_json_and_stores_nothing(api, mutate, field):
    body = otlp_json()
    mutate(body["resourceSpans"][0]["scopeSpans"][0]["spans"][1])
    response = api.post(URL, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not Span.objects.exists() and not Trace.objects.exists()


def test_it_refuses_json_that_does_not_parse(api):
    response = api.post(URL, b"{nope", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("body: not JSON")


def test_it_refuses_other_content_types_with_415(api):
    response = api.post(URL, b"hello", content_type="text/plain")
    assert response.status_code == 415
    assert "text/plain" in response.json()["error"]["message"]


def test_it_refuses_an_oversized_body_with_413(api, settings):
    settings.EVALSITE_TRACE_MAX_BODY_BYTES = 100
    response = api.post(URL, otlp_json(), format="json")
    assert response.status_code == 413
    assert response.json()["error"]["message"].startswith("body: ")
    response = api.post(URL, otlp_protobuf(), content_type="application/x-protobuf")
    assert response.status_code == 413 and b"the limit is 100" in response.content
    assert not Span.objects.exists()


def test_it_refuses_a_gzip_bomb_with_413(api, settings):
    settings.EVALSITE_TRACE_MAX_BODY_BYTES = 10_000
    bomb = gzip.compress(json.dumps({"resourceSpans": [], "pad": "x" * 100_000}).encode())
    response = api.post(URL, bomb, content_type="application/json", HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413
    assert "decompressed" in response.json()["error"]["message"]


def test_it_needs_an_editor_key_to_ingest(viewer_api, client):
    assert viewer_api.post(URL, otlp_json(), format="json").status_code == 403
    assert client.post(URL, otlp_json(), content_type="application/json").status_code in (401, 403)
    assert not Span.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_receives_spans_from_the_opentelemetry_sdk_exporter(live_server, project, editor):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource as SdkResource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    _, key = api_key_create(project=project, name="otel", created_by=editor, role=Role.EDITOR)
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/api/v1/otlp/v1/traces",
        headers={"Authorization": f"Bearer {key}"},
    )
    provider = TracerProvider(resource=SdkResource.create({"service.name": "capital-qa"}))
    # One export per finished span: the child lands before its parent, in its own request.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.e2e")
    with tracer.start_as_current_span("capital_qa") as root:
        root.set_attribute("input.value", "What is the capital of France?")
        with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            chat.set_attribute("gen_ai.usage.input_tokens", 42)
            chat.set_attribute("gen_ai.usage.output_tokens", 9)
        root.set_attribute("output.value", "Paris")
    provider.shutdown()

    trace = Trace.objects.get(project=project)
    assert (trace.name, trace.source, trace.span_count, trace.tokens) == (
        "capital_qa",
        "otlp",
        2,
        51,
    )
    [root_span] = trace_dict(trace)["spans"].values()
    assert root_span["attributes"]["ag"]["data"]["outputs"] == "Paris"
    assert root_span["attributes"]["ag"]["meta"]["service"] == "capital-qa"
    assert root_span["attributes"]["ag"]["metrics"]["acc"]["tokens"] == {
        "prompt": 42,
        "completion": 9,
        "total": 51,
    }
    [chat_span] = root_span["children"].values()
    assert chat_span["kind"] == "llm"
    assert chat_span["attributes"]["ag"]["meta"]["model"] == "gpt-4o-mini"


def test_it_stores_every_span_once_when_an_export_is_retried(api, project):
    body = otlp_protobuf()
    request = ExportTraceServiceRequest.FromString(body)
    del request.resource_spans[0].scope_spans[0].spans[1]  # the chat span first, alone
    for payload in (request.SerializeToString(), body):
        response = api.post(URL, payload, content_type="application/x-protobuf")
        assert response.status_code == 200
    spans = list(Span.objects.filter(project=project).order_by("span_id").values())
    traces = list(Trace.objects.filter(project=project).values())
    assert [s["span_id"] for s in spans] == sorted([CHAT, ROOT]) and len(traces) == 1
    assert traces[0]["tokens"] == 120 and traces[0]["span_count"] == 2

    for payload in (body, request.SerializeToString(), body):  # exporters retry whole batches
        response = api.post(URL, payload, content_type="application/x-protobuf")
        assert response.status_code == 200

    assert list(Span.objects.filter(project=project).order_by("span_id").values()) == spans
    assert list(Trace.objects.filter(project=project).values()) == traces


def test_it_keeps_a_json_payload_nested_too_deep_as_its_text(api, project):
    deep = "[" * 5000 + "]" * 5000  # the standard library's parser recursed out on this
    body = otlp_json()
    root = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    root["attributes"][0]["value"]["stringValue"] = deep
    response = api.post(URL, body, format="json")
    assert response.status_code == 200
    root_span = trace_dict(Trace.objects.get(project=project))["spans"][ROOT]
    assert root_span["attributes"]["ag"]["data"]["inputs"] == deep


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        # A sender's own "ag" attributes are checked as native ones are.
        (
            {"attributes": [kv("ag.metrics.unit.tokens.prompt", "many")]},
            "spans[0].attributes.ag.metrics.unit.tokens.prompt",
            "must be a number",
        ),
        ({"start_time_unix_nano": 0}, "spans[0].start_time", "invalid datetime"),
        # Longer than any span id: refused, not cut or sent on to the database.
        (
            {"parent_span_id": bytes(range(1, 41))},
            "spans[0].parent_id",
            "String should have at most 64 characters",
        ),
        ({"name": "chat\x00"}, "spans[0].name", "contains a NUL character"),
    ],
)
def test_it_refuses_a_protobuf_span_naming_the_bad_field_and_stores_nothing(
    api, change, field, reason
):
    body = otlp_protobuf(**change)
    response = api.post(URL, body, content_type="application/x-protobuf")
    assert response.status_code == 400
    assert f"{field}: {reason}" in response.content.decode(errors="replace")
    assert not Span.objects.exists() and not Trace.objects.exists()
