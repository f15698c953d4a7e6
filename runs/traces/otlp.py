"""OTLP/HTTP decoding (protobuf and JSON) into native spans; docs/traces.md has the mapping."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from runs.traces.spans import EPOCH, SYSTEM_ATTRIBUTES, CheckedSpan, has_flat_ag_keys, iso

PROTOBUF = "application/x-protobuf"


JSON = "application/json"


OTEL_SPAN_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


GEN_AI_OPERATIONS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
}


def otlp_spans(body: bytes, content_type: str) -> list[tuple[str, dict[str, Any]]]:
    """Decode an OTLP/HTTP ``ExportTraceServiceRequest`` (protobuf or JSON) into native spans,
    each with its location in the request for error messages."""
    if content_type == PROTOBUF:
        return list(_otlp_protobuf(body))
    if content_type == JSON:
        return list(_otlp_json(body))
    raise InvalidInput({"content_type": [f"{content_type!r} is not {PROTOBUF} or {JSON}"]})


class _Scope:
    """What every span of one resource and scope shares, worked out once for all of them."""

    __slots__ = ("otel", "service")

    def __init__(self, resource: dict[str, Any], scope: str):
        self.otel = {
            key: value for key, value in (("scope", scope), ("resource", resource)) if value
        }
        service = resource.get("service.name")
        self.service = service if isinstance(service, str) else None


def _native(
    scope: _Scope,
    trace_id: str,
    span_id: str,
    parent_id: str,
    name: str,
    span_kind: int,
    start_ns: int,
    end_ns: int,
    status_code: int,
    status_message: str,
    attributes: dict[str, Any],
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """One OTLP span, protobuf or JSON, in the native shape. ``attributes`` is the span's own
    dict (built by the decoder): it is changed in place. Called with positional arguments for
    every span of a request, hence no intermediate object."""
    otel = {"span_kind": OTEL_SPAN_KINDS.get(span_kind, "unspecified"), **scope.otel}
    if events:
        otel["events"] = events
    meta = {"otel": otel}
    if scope.service is not None:
        meta["service"] = scope.service
    kind = _otel_kind(attributes)
    # Every field is in its validated shape by construction, but for what the sender shaped
    # itself ("ag" of its own, "ag.*" keys) and a missing start, which pydantic checks and names.
    shaped = (
        "ag" in attributes
        or not start_ns
        or len(parent_id) > 64  # pydantic refuses it (the spec's is 8 bytes)
        or has_flat_ag_keys(attributes)
    )
    given_ag = attributes.get("ag")
    ag = attributes["ag"] = dict(given_ag) if isinstance(given_ag, dict) else {}
    given = ag.get("meta")
    ag["meta"] = {**meta, **given} if isinstance(given, dict) else meta
    if status_code == 2 and not status_message:
        status_message = _exception_message(events)
    return (dict if shaped else CheckedSpan)(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id or None,
        name=(name or "unnamed")[:300],
        kind=kind,
        start_time=_from_nanos(start_ns) if start_ns else None,
        end_time=_from_nanos(end_ns) if end_ns else None,
        status="error" if status_code == 2 else "ok",
        status_message=status_message,
        attributes=attributes,
    )


def _otel_kind(attributes: dict[str, Any]) -> str:
    for key in ("ag.type.node", "openinference.span.kind", "traceloop.span.kind"):
        if isinstance(value := attributes.get(key), str) and value:
            return value.lower()[:32]
    operation = attributes.get("gen_ai.operation.name")
    if isinstance(operation, str) and operation:
        return GEN_AI_OPERATIONS.get(operation, "llm")
    if any(key in attributes for key in SYSTEM_ATTRIBUTES):
        return "llm"
    return "task"


def _exception_message(events: list[dict[str, Any]]) -> str:
    for event in reversed(events):
        if event.get("name") == "exception":
            attrs = event.get("attributes") or {}
            kind, text = attrs.get("exception.type", ""), attrs.get("exception.message", "")
            return f"{kind}: {text}" if kind and text else str(kind or text)
    return ""


def _from_nanos(nanos: int) -> datetime:
    return EPOCH + timedelta(microseconds=nanos // 1000)


def _otlp_protobuf(body: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise InvalidInput({"body": [f"not an OTLP ExportTraceServiceRequest ({exc})"]})
    for r, resource_spans in enumerate(request.resource_spans):
        resource = _proto_attributes(resource_spans.resource.attributes)
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            scope = _Scope(resource, scope_spans.scope.name)
            for i, span in enumerate(scope_spans.spans):
                loc = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                status = span.status
                events = span.events
                yield (
                    loc,
                    _native(
                        scope,
                        _proto_id(span.trace_id, 16, loc, "traceId"),
                        _proto_id(span.span_id, 8, loc, "spanId"),
                        span.parent_span_id.hex(),
                        span.name,
                        span.kind,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        status.code,
                        status.message,
                        _proto_attributes(span.attributes),
                        [_proto_event(event) for event in events] if events else [],
                    ),
                )


def _proto_event(event) -> dict[str, Any]:
    return {
        "name": event.name,
        "time": iso(_from_nanos(event.time_unix_nano)),
        "attributes": _proto_attributes(event.attributes),
    }


def _proto_id(raw: bytes, size: int, loc: str, field: str) -> str:
    if len(raw) != size or not any(raw):
        raise InvalidInput({f"{loc}.{field}": [f"must be {size} bytes, not all zero"]})
    return raw.hex()


def _proto_attributes(pairs) -> dict[str, Any]:
    # Every span's every attribute passes here: the common case (a string) is read in the
    # loop, without a call of its own.
    attributes = {}
    for pair in pairs:
        value = pair.value
        which = value.WhichOneof("value")
        if which == "string_value":
            attributes[pair.key] = value.string_value
        else:
            attributes[pair.key] = _proto_other(value, which)
    return attributes


def _proto_value(value) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":  # most attributes: answered before any other test
        return value.string_value
    return _proto_other(value, which)


def _proto_other(value, which: str | None) -> Any:
    if which is None:
        return None
    if which == "array_value":
        return [_proto_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _proto_attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return _finite(getattr(value, which))


def _finite(value: Any) -> Any:
    # JSON (and PostgreSQL's jsonb) has no NaN or infinities; keep them readable as text.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _otlp_json(body: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        document = jsonsafe.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput({"body": [f"not JSON ({exc})"]})
    if not isinstance(document, dict):
        raise InvalidInput({"body": ["must be an ExportTraceServiceRequest object"]})
    for r, resource_spans in enumerate(_list(document, "resourceSpans", "")):
        resource_loc = f"resourceSpans[{r}]"
        resource = _json_attributes(
            _get(_get(resource_spans, "resource") or {}, "attributes"), f"{resource_loc}.resource"
        )
        for s, scope_spans in enumerate(_list(resource_spans, "scopeSpans", resource_loc)):
            scope_loc = f"{resource_loc}.scopeSpans[{s}]"
            scope = _Scope(resource, str(_get(_get(scope_spans, "scope") or {}, "name") or ""))
            for i, span in enumerate(_list(scope_spans, "spans", scope_loc)):
                yield _json_span(span, f"{scope_loc}.spans[{i}]", scope)


def _json_span(span: Any, loc: str, scope: _Scope) -> tuple[str, dict[str, Any]]:
    if not isinstance(span, dict):
        raise InvalidInput({loc: ["must be a Span object"]})
    status = _get(span, "status") or {}
    return loc, _native(
        scope,
        _json_id(_get(span, "traceId"), 16, f"{loc}.traceId"),
        _json_id(_get(span, "spanId"), 8, f"{loc}.spanId"),
        _json_id(_get(span, "parentSpanId"), 8, f"{loc}.parentSpanId", optional=True),
        str(_get(span, "name") or ""),
        _json_enum(_get(span, "kind"), "SPAN_KIND_", OTEL_SPAN_KINDS, f"{loc}.kind"),
        _json_int(_get(span, "startTimeUnixNano"), f"{loc}.startTimeUnixNano"),
        _json_int(_get(span, "endTimeUnixNano"), f"{loc}.endTimeUnixNano"),
        _json_enum(
            _get(status, "code"), "STATUS_CODE_", {1: "ok", 2: "error"}, f"{loc}.status.code"
        ),
        str(_get(status, "message") or ""),
        _json_attributes(_get(span, "attributes"), f"{loc}.attributes"),
        [
            {
                "name": _get(event, "name") or "",
                "time": iso(_from_nanos(_json_int(_get(event, "timeUnixNano"), f"{loc}.events"))),
                "attributes": _json_attributes(_get(event, "attributes"), f"{loc}.events"),
            }
            for event in _list(span, "events", loc)
        ],
    )


def _get(obj: Any, camel: str) -> Any:
    """A field by its lowerCamelCase name (the OTLP/JSON spelling) or its proto name."""
    if not isinstance(obj, dict):
        return None
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake)


def _list(obj: Any, camel: str, loc: str) -> list:
    value = _get(obj, camel)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput({f"{loc}.{camel}" if loc else camel: ["must be a list"]})
    return value


def _json_id(value: Any, size: int, loc: str, optional: bool = False) -> str:
    # The OTLP/JSON spec says hex; generic protobuf JSON encoders send base64. Take both.
    if not value and optional:
        return ""
    if isinstance(value, str):
        if len(value) == size * 2:
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                raw = b""
        else:
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
        if len(raw) == size and any(raw):
            return raw.hex()
    raise InvalidInput({loc: [f"must be {size * 2} hex digits (or base64 of {size} bytes)"]})


def _json_int(value: Any, loc: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdecimal():
        return int(value)
    raise InvalidInput({loc: ["must be an integer (unix nanoseconds, as a string or number)"]})


def _json_enum(value: Any, prefix: str, names: dict[int, str], loc: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.upper().removeprefix(prefix).lower()
        for number, name in names.items():
            if name == word:
                return number
        if word in ("unset", "unspecified"):
            return 0
    raise InvalidInput({loc: [f"unknown value {value!r}"]})


def _json_attributes(pairs: Any, loc: str) -> dict[str, Any]:
    if pairs is None:
        return {}
    if not isinstance(pairs, list):
        raise InvalidInput({loc: ["must be a list of {key, value}"]})
    result = {}
    for index, pair in enumerate(pairs):
        if not isinstance(pair, dict) or not isinstance(pair.get("key"), str):
            raise InvalidInput({f"{loc}[{index}]": ["must be {key, value}"]})
        result[pair["key"]] = _json_value(pair.get("value"), f"{loc}[{index}].value")
    return result


def _json_value(value: Any, loc: str) -> Any:
    if not isinstance(value, dict) or not value:
        return None
    for camel in ("stringValue", "boolValue", "intValue", "doubleValue"):
        raw = _get(value, camel)
        if raw is None:
            continue
        if camel == "intValue":
            return _json_signed(raw, loc)
        if camel == "doubleValue":
            return _json_double(raw, loc)
        return raw
    if (array := _get(value, "arrayValue")) is not None:
        items = _get(array, "values") or []
        return [_json_value(item, f"{loc}.arrayValue[{i}]") for i, item in enumerate(items)]
    if (kvlist := _get(value, "kvlistValue")) is not None:
        return _json_attributes(_get(kvlist, "values") or [], f"{loc}.kvlistValue")
    if (raw := _get(value, "bytesValue")) is not None:
        return raw
    return None


def _json_signed(raw: Any, loc: str) -> int:
    try:
        if isinstance(raw, bool):
            raise ValueError
        return int(raw)
    except (TypeError, ValueError):
        raise InvalidInput({loc: [f"intValue {raw!r} is not an integer"]})


def _json_double(raw: Any, loc: str) -> Any:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return _finite(float(raw))
    if isinstance(raw, str) and raw in ("NaN", "Infinity", "-Infinity"):
        return raw
    try:
        return _finite(float(raw))
    except (TypeError, ValueError):
        raise InvalidInput({loc: [f"doubleValue {raw!r} is not a number"]})
