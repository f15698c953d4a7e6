"""Incoming spans: limits, validation (pydantic) and normalisation into Span rows (the GenAI and
OpenInference mapping into ``ag``, units, data attributes)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, NotRequired

import orjson
from pydantic import (
    ConfigDict,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from typing_extensions import TypedDict  # pydantic's choice before Python 3.12

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from runs import conf


@dataclass(frozen=True)
class Limits:
    spans: int
    attributes_bytes: int
    body_bytes: int


def limits() -> Limits:
    """The documented ingestion limits; settings may lower or raise them (docs/traces.md)."""
    return Limits(
        spans=conf.trace_max_spans(),
        attributes_bytes=conf.trace_max_attributes_bytes(),
        # Django refuses bodies above DATA_UPLOAD_MAX_MEMORY_SIZE on its own; stay under it.
        body_bytes=conf.trace_max_body_bytes(),
    )


class TooLarge(InvalidInput):
    """A documented size limit was exceeded; the API answers 413 with the reason."""


@dataclass(slots=True)
class SpanRow:
    """A span as ingestion carries it, validated and normalised: the stored columns, in a plain
    object (a model instance per span costs more than validating the span)."""

    trace_id: str  # as sent, not the Trace's primary key
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: str
    start_time: datetime | None
    end_time: datetime | None
    status: str
    status_message: str
    attributes: dict[str, Any]
    # Where the span was in its request (``spans[3]``), for errors found as it is written; ""
    # for a span read back from the database.
    loc: str = dataclasses.field(default="", compare=False)


Id = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]
ParentId = Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Za-z0-9_.:\-]*$")]


# What pydantic checks, it checks without calling back into Python: a call per span and field
# from its validator costs more than the rest of the validation. ``_row`` finishes the span
# (time zones, end before start, status words, unit numbers) in plain Python.
# The attributes validate into plain dicts (TypedDicts), not model instances: a span carries
# several of them and ingestion handles thousands of spans a second.
class MetricsIn(TypedDict):
    __pydantic_config__ = ConfigDict(extra="allow")

    unit: NotRequired[dict[str, dict[str, Any]]]  # numbers: _unit_checked
    # Whatever a sender puts in acc is ignored: it is recomputed from the stored tree.
    acc: NotRequired[Any]


class AgIn(TypedDict):
    __pydantic_config__ = ConfigDict(extra="allow")

    data: NotRequired[dict[str, Any]]
    metrics: NotRequired[MetricsIn]
    meta: NotRequired[dict[str, Any]]


class AttributesIn(TypedDict):
    """``ag`` plus any other attributes, kept verbatim."""

    __pydantic_config__ = ConfigDict(extra="allow")

    ag: NotRequired[AgIn]


def _nest_flat_ag_keys(value: Any) -> Any:
    # OpenTelemetry attributes are flat ("ag.data.inputs"); they join the nested "ag".
    if not isinstance(value, dict) or not has_flat_ag_keys(value):
        return value
    if not isinstance(value.get("ag") or {}, dict):
        return value  # pydantic names the "ag" that is not an object
    value = dict(value)
    ag = value["ag"] = _copy_dicts(value.get("ag") or {})
    for key in [key for key in value if key.startswith("ag.")]:
        _set_path(ag, key[3:].split("."), _maybe_json(key, value.pop(key)))
    return value


def has_flat_ag_keys(value: dict) -> bool:
    # Asked of every span: one scan of the joined keys, not a Python step per key.
    try:
        return "\0ag." in "\0" + "\0".join(value)
    except TypeError:  # a key that is not a string (a Python caller's dict)
        return any(isinstance(key, str) and key.startswith("ag.") for key in value)


class SpanIn(TypedDict):
    """One span in the native shape (docs/traces.md), as pydantic checks it."""

    __pydantic_config__ = ConfigDict(extra="ignore")

    trace_id: Id
    span_id: Id
    parent_id: NotRequired[ParentId | None]  # "" and None: a root
    name: Annotated[str, StringConstraints(min_length=1, max_length=300)]
    kind: NotRequired[Annotated[str, StringConstraints(min_length=1, max_length=32, to_lower=True)]]
    start_time: datetime
    end_time: NotRequired[datetime | None]
    status: NotRequired[Any]  # _status
    status_message: NotRequired[str | None]
    session_id: NotRequired[Annotated[str, StringConstraints(max_length=200)] | None]
    attributes: NotRequired[AttributesIn]


def _status(value: Any) -> str:
    # OpenTelemetry spells them UNSET / OK / ERROR (or STATUS_CODE_ERROR); unset is ok.
    if value is None or value == "ok":
        return "ok"
    if isinstance(value, str):
        word = value.lower().removeprefix("status_code_")
        if word in ("", "unset", "ok"):
            return "ok"
        if word == "error":
            return word
    raise InvalidInput({"status": ["Input should be 'ok' or 'error'"]})


def _unit_checked(unit: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    # Not pydantic's float: it would turn token counts into 10.0 and accept true as 1.
    for group, values in unit.items():
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                reason = "must be a number"
            elif isinstance(value, float) and not math.isfinite(value):
                reason = "must be a finite number"
            else:
                continue
            raise InvalidInput({f"attributes.ag.metrics.unit.{group}.{key}": [reason]})
    return unit


def _first_error(exc: ValidationError, loc: str, skip: int = 0) -> InvalidInput:
    """The first problem, named by its path: ``spans[3].start_time: invalid datetime``
    (``skip``: leading parts of pydantic's location that ``loc`` already names)."""
    error = exc.errors()[0]
    path = ".".join(str(part) for part in error["loc"][skip:])
    if error["type"].startswith(("datetime", "date_")):
        message = "invalid datetime"
    elif error["type"] == "missing":
        message = "required"
    else:
        message = error["msg"].removeprefix("Value error, ")
    return InvalidInput({".".join(part for part in (loc, path) if part): [message]})


SPAN_LIST = TypeAdapter(list[SpanIn])


class CheckedSpan(dict):
    """A span already in the shape validation gives, built by a decoder that checked each of its
    fields on the way (OTLP protobuf, whose fields come typed): ``span_rows`` takes it as it is.
    A decoder uses it only where that holds; anything the sender shaped itself goes as a plain
    dict, through pydantic."""


def _validate_all(located: list[tuple[str, Any]]) -> list[SpanIn]:
    """Every span validated in one call into pydantic (a call per span costs as much again);
    the first problem is named by its span's location."""
    raws, at = [], []  # what pydantic validates, and where each goes in the answer
    spans: list[Any] = [None] * len(located)
    for index, (loc, raw) in enumerate(located):
        if type(raw) is CheckedSpan:
            spans[index] = raw
            continue
        if not isinstance(raw, dict):
            raise InvalidInput({loc: ["must be an object (a span)"]})
        attributes = raw.get("attributes")
        if isinstance(attributes, dict) and has_flat_ag_keys(attributes):
            raw = {**raw, "attributes": _nest_flat_ag_keys(attributes)}
        raws.append(raw)
        at.append(index)
    if not raws:
        return spans
    try:
        validated = SPAN_LIST.validate_python(raws)
    except ValidationError as exc:
        index, *_ = exc.errors()[0]["loc"]
        raise _first_error(exc, located[at[int(index)]][0], skip=1)
    for index, span in zip(at, validated, strict=True):
        spans[index] = span
    return spans


def spans_flatten(items: Iterable[Any], prefix: str = "spans") -> Iterator[tuple[str, Any]]:
    """(location, flat span) for each span: flat spans pass through, trace dicts
    (``{"trace_id", "spans": {root_id: {..., "children": {...}}}}``) and spans with nested
    ``children`` are unnested."""
    for index, item in enumerate(items):
        loc = f"{prefix}[{index}]"
        if isinstance(item, dict) and isinstance(item.get("spans"), dict | list):
            for key, root in _pairs(item["spans"], f"{loc}.spans"):
                yield from _unnest(item.get("trace_id"), None, root, *key)
        elif isinstance(item, dict) and item.get("children"):
            yield from _unnest(item.get("trace_id"), None, item, loc, item.get("span_id"))
        else:
            yield loc, item


def _unnest(
    trace_id: Any, parent_id: str | None, node: Any, loc: str, key: Any
) -> Iterator[tuple[str, Any]]:
    """A span and its descendants, each given the trace id and the parent it is nested in."""
    if not isinstance(node, dict):
        yield loc, node
        return
    span = {k: v for k, v in node.items() if k != "children"}
    span["trace_id"] = trace_id
    span.setdefault("span_id", key)
    if parent_id is not None:
        span["parent_id"] = parent_id
    yield loc, span
    for child_key, child in _pairs(node.get("children") or {}, f"{loc}.children"):
        yield from _unnest(trace_id, span["span_id"], child, *child_key)


def _pairs(nodes: Any, loc: str) -> Iterator[tuple[tuple[str, Any], Any]]:
    """((location, key), node) for spans keyed by id (the contract) or listed."""
    if isinstance(nodes, dict):
        for key, node in nodes.items():
            yield (f"{loc}.{key}", key), node
    elif isinstance(nodes, list):
        for index, node in enumerate(nodes):
            yield (f"{loc}[{index}]", None), node
    else:
        raise InvalidInput({loc: ["must be an object keyed by span id"]})


TOKEN_ATTRIBUTES = {
    "prompt": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "llm.token_count.prompt",
    ),
    "completion": (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    ),
    "total": ("gen_ai.usage.total_tokens", "llm.token_count.total"),
}


COST_ATTRIBUTES = {
    "prompt": ("gen_ai.usage.input_cost", "llm.cost.prompt"),
    "completion": ("gen_ai.usage.output_cost", "llm.cost.completion"),
    "total": ("gen_ai.usage.cost", "llm.cost.total"),
}


MODEL_ATTRIBUTES = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name")


SYSTEM_ATTRIBUTES = ("gen_ai.provider.name", "gen_ai.system", "llm.provider")
# A span's session: the native field, else OpenTelemetry's / OpenInference's attribute, else the
# GenAI conversation id. Kept as ag.meta.session_id; the trace takes the first one it has.
SESSION_ATTRIBUTES = ("session.id", "gen_ai.conversation.id")


# Payloads moved into ag.data are not kept twice.
DATA_ATTRIBUTES = {
    "inputs": ("input.value", "input.mime_type"),
    "outputs": ("output.value", "output.mime_type"),
}


def _row(span: SpanIn, loc: str) -> SpanRow:
    """The span with ``ag`` normalised and ``unit`` metrics filled in from the span."""
    start, end = span["start_time"], span.get("end_time")
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    if end is not None:
        if end.tzinfo is None:
            end = end.replace(tzinfo=UTC)
        if end < start:
            raise InvalidInput({"end_time": ["is before start_time"]})
    name, kind = span["name"], span.get("kind", "task")
    message = span.get("status_message") or ""
    attributes = _attributes(span, start, end)
    # PostgreSQL's text refuses NUL: these reach the trace's row before the attributes are
    # checked as they are written.
    session = attributes["ag"]["meta"].get("session_id")
    for field, text in (("name", name), ("kind", kind), ("status_message", message)):
        if "\x00" in text:
            raise InvalidInput({field: [NUL]})
    if isinstance(session, str) and "\x00" in session:
        raise InvalidInput({"attributes.ag.meta.session_id": [NUL]})
    return SpanRow(
        trace_id=span["trace_id"],
        span_id=span["span_id"],
        parent_id=span.get("parent_id") or "",
        name=name,
        kind=kind,
        start_time=start,
        end_time=end,
        status=_status(span.get("status")),
        status_message=message,
        attributes=attributes,
        loc=loc,
    )


NUL = "contains a NUL character (\\u0000)"


def _attributes(span: SpanIn, start: datetime, end: datetime | None) -> dict[str, Any]:
    # The dicts pydantic made for this span are its own: changed in place, not copied. A span
    # with no attribute besides "ag" (most native ones) has nothing to map.
    other = span.get("attributes") or {}
    ag = other.pop("ag", None) or {}
    data, meta = ag.pop("data", None) or {}, ag.pop("meta", None) or {}
    given = ag.pop("metrics", None) or {}
    unit = _unit_checked(given.pop("unit", None) or {})
    if other:
        for field, (value_key, mime_key) in DATA_ATTRIBUTES.items():
            if value_key in other:
                value, mime = other.pop(value_key), other.pop(mime_key, "")
                data.setdefault(field, _decode_text(value, mime))
        if "model" not in meta and (model := _first(other, MODEL_ATTRIBUTES)) is not None:
            meta["model"] = model
        if "system" not in meta and (system := _first(other, SYSTEM_ATTRIBUTES)) is not None:
            meta["system"] = system
    if "session_id" not in meta and (
        session := span.get("session_id") or (other and _first(other, SESSION_ATTRIBUTES))
    ):
        meta["session_id"] = str(session)[:200]
    if end is not None and "total" not in unit.get("duration", {}):
        unit.setdefault("duration", {})["total"] = ms_between(end - start)
    for group, names in (("tokens", TOKEN_ATTRIBUTES), ("costs", COST_ATTRIBUTES)):
        values = unit.get(group) or (other and _semconv_numbers(other, names))
        if values:
            unit[group] = _with_total(values)
    given.pop("acc", None)
    metrics = {**given, "unit": unit, "acc": {}}
    return {"ag": {"data": data, "metrics": metrics, "meta": meta, **ag}, **other}


def attributes_json(span: SpanRow, max_bytes: int) -> bytes:
    """The span's attributes as the JSON stored, once checked: storable (no NaN, nothing JSON
    has not), free of NUL (PostgreSQL's jsonb refuses it), and within the size limit, which
    counts the attributes as sent and mapped, not the ``acc`` computed from the tree (a span
    sent with or without its children is held to the same limit). Ingestion calls this as it
    writes each span, inside the ingest's transaction: a refusal there stores nothing, as one
    found before writing would."""
    where = f"{span.loc}.attributes" if span.loc else "attributes"
    try:
        text = json_bytes(span.attributes, strict=True)
    except (TypeError, ValueError) as exc:
        raise InvalidInput({where: [f"not storable as JSON ({exc})"]})
    size = len(text)
    if size > max_bytes and (acc := span.attributes["ag"]["metrics"]["acc"]):
        size -= len(json_bytes(acc)) - len(b"{}")  # as it was sent: with acc still empty
    if size > max_bytes:
        raise TooLarge({where: [f"{size} bytes of JSON; the limit is {max_bytes}"]})
    if b"\\u0000" in text:
        raise InvalidInput({where: [NUL]})
    return text


# orjson would write datetimes, dataclasses and subclasses of JSON types as it sees fit; handing
# them back makes them the standard library's business, as they were before orjson.
_ORJSON = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def json_bytes(value: Any, *, strict: bool = False) -> bytes:
    """``value`` as compact UTF-8 JSON, by orjson (a tenth of the standard library's time).

    What orjson refuses (integers past 64 bits, non-string keys, the passed-through types) goes
    to the standard library, which writes it or raises ``TypeError``/``ValueError`` as before.
    ``strict`` also refuses NaN and infinities, which orjson would write as null: text with a
    null in it is checked again by the standard library.
    """
    try:
        text = orjson.dumps(value, option=_ORJSON)
    except orjson.JSONEncodeError:
        text = None
    if text is None or (strict and b"null" in text):
        plain = json.dumps(value, allow_nan=not strict, ensure_ascii=False, separators=(",", ":"))
        text = plain.encode()
    return text


def _semconv_numbers(attributes: dict, names: dict[str, tuple[str, ...]]) -> dict:
    found = {}
    for field, keys in names.items():
        for key in keys:
            if key in attributes:
                value = attributes[key]
                if isinstance(value, int | float) and not isinstance(value, bool):
                    found[field] = value
                break
    return found


def _with_total(values: dict) -> dict:
    if "total" not in values and ("prompt" in values or "completion" in values):
        values = {
            **values,
            "total": number_add(values.get("prompt", 0), values.get("completion", 0)),
        }
    return values


def _first(attributes: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in attributes:
            return attributes[key]
    return None


def _decode_text(value: Any, mime: Any) -> Any:
    if isinstance(value, str) and "json" in str(mime):
        try:
            return jsonsafe.loads(value)
        except ValueError:  # not JSON after all, or JSON we refuse: kept as the text it is
            pass
    return value


def _maybe_json(key: str, value: Any) -> Any:
    # SDKs serialise structured ag.data values into strings; nothing else is guessed at.
    if key.startswith("ag.data.") and isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return jsonsafe.loads(value)
        except ValueError:
            pass
    return value


def _copy_dicts(value: dict) -> dict:
    return {k: _copy_dicts(v) if isinstance(v, dict) else v for k, v in value.items()}


def _set_path(target: dict, parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        nested = target.get(part)
        if not isinstance(nested, dict):
            nested = target[part] = {}
        target = nested
    target[parts[-1]] = value


def spans_valid(trace: Any) -> bool:
    """Whether a trace dict (or spans) would pass ingestion's validation."""
    try:
        limit = limits().attributes_bytes
        for row in span_rows(list(spans_flatten([trace]))):
            attributes_json(row, limit)
    except InvalidInput:
        return False
    return True


def span_rows(located: list[tuple[str, Any]]) -> list[SpanRow]:
    """Validate and normalise every span before anything is written. What only the stored form
    tells (its size, NUL characters) is checked as each span is written (``attributes_json``)."""
    limit = limits()
    if len(located) > limit.spans:
        raise TooLarge(
            {"spans": [f"{len(located)} spans in one request; the limit is {limit.spans}"]}
        )
    rows = []
    for (loc, _), span in zip(located, _validate_all(located), strict=True):
        try:
            rows.append(_row(span, loc))
        except InvalidInput as exc:
            raise type(exc)({f"{loc}.{name}": reasons for name, reasons in exc.fields.items()})
    return rows


def ms_between(delta: timedelta) -> float:
    return round(delta.total_seconds() * 1000, 3)


def number_add(a: int | float, b: int | float) -> int | float:
    total = a + b
    return round(total, 12) if isinstance(total, float) else total


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    value = value.astimezone(UTC)
    spec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
    return value.isoformat(timespec=spec).replace("+00:00", "Z")
