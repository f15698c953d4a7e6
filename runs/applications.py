"""Applications: what a run evaluates, and how one invocation is made and recorded as a trace.

Three kinds: ``column`` (outputs already in a testset column), ``logged`` (the user's own code
logs outputs and traces through the API, SDK-style), and ``http`` (evalsite POSTs the inputs to
an endpoint). Every invocation evalsite makes is recorded as a trace in the public contract
shape, so evaluators read it the same way as production traces.
"""

from __future__ import annotations

import ipaddress
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Project
from runs.models import Application, Span, Trace

# --- configuration ----------------------------------------------------------------------------


class ColumnConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outputs_column: str = Field("outputs", description="The testset column holding the outputs.")


class LoggedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HttpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: HttpUrl
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(30.0, gt=0, le=600)
    retries: int = Field(2, ge=0, le=10, description="Retries on timeouts, 429 and 5xx.")
    concurrency: int = Field(8, ge=1, le=64, description="Calls in flight per worker.")
    outputs_path: str = Field(
        "outputs",
        description="Dot path of the outputs in the JSON response; empty for the whole body.",
    )
    trace_path: str = Field(
        "", description="Dot path of a trace (contract shape) in the response, if it returns one."
    )


CONFIGS: dict[str, type[BaseModel]] = {
    Application.Kind.COLUMN: ColumnConfig,
    Application.Kind.LOGGED: LoggedConfig,
    Application.Kind.HTTP: HttpConfig,
}


def application_config_validate(kind: str, config: dict | None) -> dict:
    if kind not in CONFIGS:
        raise InvalidInput(
            {"kind": [f"Unknown application kind {kind!r}; use column, logged or http."]}
        )
    try:
        return CONFIGS[kind].model_validate(config or {}).model_dump(mode="json")
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc, prefix="config"))


def application_create(
    *,
    project: Project,
    name: str,
    kind: str,
    config: dict | None = None,
    slug: str = "",
    description: str = "",
) -> Application:
    from django.utils.text import slugify

    config = application_config_validate(kind, config)
    slug = slug or slugify(name)[:100] or "app"
    if Application.objects.filter(project=project, slug=slug).exists():
        raise InvalidInput({"slug": [f"An application with slug {slug!r} already exists."]})
    return Application.objects.create(
        project=project, name=name, slug=slug, kind=kind, config=config, description=description
    )


# --- one invocation ---------------------------------------------------------------------------


@dataclass
class Invocation:
    """What one call of the application produced, before it is stored."""

    inputs: dict[str, Any]
    outputs: Any = None
    error: dict[str, str] | None = None
    start: datetime = field(default_factory=timezone.now)
    duration_ms: float = 0.0
    trace: dict[str, Any] | None = None  # the contract dict evaluators receive

    @property
    def ok(self) -> bool:
        return self.error is None


def invoke_many(application: Application, inputs_list: list[dict[str, Any]]) -> list[Invocation]:
    """Call the application once per inputs; never raises for a failing call."""
    if application.kind == Application.Kind.COLUMN:
        column = application.config.get("outputs_column", "outputs")
        return [_from_column(inputs, column) for inputs in inputs_list]
    if application.kind == Application.Kind.HTTP:
        config = HttpConfig.model_validate(application.config)
        with (
            httpx.Client(timeout=config.timeout_s, follow_redirects=False) as client,
            ThreadPoolExecutor(max_workers=config.concurrency) as pool,
        ):
            return list(pool.map(lambda i: _call_http(client, config, i), inputs_list))
    return [
        Invocation(
            inputs,
            error=_error(
                "not_invocable", "Logged applications send their outputs through the API."
            ),
        )
        for inputs in inputs_list
    ]


def _from_column(inputs: dict[str, Any], column: str) -> Invocation:
    if column not in inputs:
        columns = ", ".join(sorted(inputs)) or "none"
        return Invocation(
            inputs,
            error=_error(
                "missing_outputs_column",
                f"The outputs column {column!r} is not in the testcase (columns: {columns}).",
            ),
        )
    return Invocation(inputs, outputs=inputs[column])


def _call_http(client: httpx.Client, config: HttpConfig, inputs: dict[str, Any]) -> Invocation:
    started, start = time.perf_counter(), timezone.now()
    url = str(config.url)
    try:
        check_public_url(url, setting="EVALSITE_APPLICATIONS_ALLOW_PRIVATE")
    except InvalidInput as exc:
        return Invocation(
            inputs, error=_error("address_refused", next(iter(exc.fields.values()))[0]), start=start
        )
    error = None
    for attempt in range(config.retries + 1):
        try:
            response = client.post(url, json={"inputs": inputs}, headers=config.headers)
        except httpx.TimeoutException:
            error = _error(
                "timeout", f"The application did not answer within {config.timeout_s:g} s."
            )
        except httpx.HTTPError as exc:
            error = _error("connection_error", f"Could not reach the application: {exc}")
        else:
            if response.status_code == 429 or response.status_code >= 500:
                error = _error("http_status", f"The application answered {response.status_code}.")
                _sleep_before_retry(response, attempt)
                continue
            return _from_response(response, config, inputs, start, started)
        _sleep_before_retry(None, attempt)
    return Invocation(inputs, error=error, start=start, duration_ms=_ms(started))


def _sleep_before_retry(response: httpx.Response | None, attempt: int) -> None:
    retry_after = response.headers.get("Retry-After") if response is not None else None
    delay = float(retry_after) if retry_after and retry_after.isdigit() else 0.2 * 2**attempt
    time.sleep(min(delay, 10.0))


def _from_response(response, config: HttpConfig, inputs, start, started) -> Invocation:
    duration = _ms(started)
    if response.status_code >= 400:
        text = response.text[:500]
        return Invocation(
            inputs,
            error=_error("http_status", f"The application answered {response.status_code}: {text}"),
            start=start,
            duration_ms=duration,
        )
    try:
        body = response.json()
    except ValueError:
        body = response.text
    try:
        outputs = dot_get(body, config.outputs_path)
    except KeyError:
        return Invocation(
            inputs,
            error=_error("outputs_path", f"The response has no {config.outputs_path!r}."),
            start=start,
            duration_ms=duration,
        )
    invocation = Invocation(inputs, outputs=outputs, start=start, duration_ms=duration)
    if config.trace_path:
        try:
            trace = dot_get(body, config.trace_path)
        except KeyError:
            trace = None
        invocation.trace = trace if isinstance(trace, dict) and "spans" in trace else None
    return invocation


def dot_get(value: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts and lists; an empty path is the value itself."""
    for part in [p for p in path.split(".") if p]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


def check_public_url(url: str, *, setting: str) -> None:
    """Refuse URLs whose host resolves to a private, loopback or link-local address, unless the
    named setting allows them (a self-hosted server must not become a proxy into its network)."""
    if getattr(settings, setting, False):
        return
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        raise InvalidInput({"url": [f"The host {host!r} does not resolve."]})
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if (
            address.is_private
            or address.is_loopback
            or address.is_link_local
            or address.is_reserved
        ):
            raise InvalidInput(
                {
                    "url": [
                        f"{host} resolves to {address}, a private address; set {setting}=1 to allow it."
                    ]
                }
            )


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "type": code, "message": message, "stacktrace": ""}


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


# --- recording ---------------------------------------------------------------------------------


def invocation_trace(invocation: Invocation, name: str) -> dict[str, Any]:
    """The contract trace dict of one invocation (the application's own trace when it sent one)."""
    if invocation.trace is not None:
        return invocation.trace
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    end = invocation.start + timedelta(milliseconds=invocation.duration_ms)
    metrics = {"duration": {"total": invocation.duration_ms}}
    span = {
        "span_id": span_id,
        "parent_id": None,
        "name": name,
        "kind": "workflow",
        "start_time": invocation.start.isoformat().replace("+00:00", "Z"),
        "end_time": end.isoformat().replace("+00:00", "Z"),
        "status": "ok" if invocation.ok else "error",
        "attributes": {
            "ag": {
                "data": {
                    "inputs": invocation.inputs,
                    "outputs": invocation.outputs,
                    "internals": {},
                },
                "metrics": {"unit": metrics, "acc": metrics},
                "meta": {},
            }
        },
        "children": {},
    }
    if not invocation.ok:
        span["status_message"] = invocation.error["message"]
    return {"trace_id": trace_id, "spans": {span_id: span}}


def traces_store(
    project: Project, trace_dicts: list[dict[str, Any]], source: str = "invocation"
) -> list[Trace]:
    """Store contract-shaped trace dicts in bulk (two INSERTs for any number of traces).

    Used for the traces evalsite records itself; they are complete and new, so no upsert and no
    re-aggregation is needed (ingestion of user traces goes through ``runs.ingest``).
    """
    now = timezone.now()
    traces, spans = [], []
    for data in trace_dicts:
        roots = list(data["spans"].values())
        walked = list(_walk(roots))
        root = roots[0] if roots else {}
        acc = root.get("attributes", {}).get("ag", {}).get("metrics", {}).get("acc", {})
        trace = Trace(
            project=project,
            trace_id=data["trace_id"],
            name=root.get("name", ""),
            root_span_id=root.get("span_id", ""),
            start_time=root.get("start_time"),
            end_time=root.get("end_time"),
            duration_ms=(acc.get("duration") or {}).get("total"),
            status=root.get("status", "ok"),
            tokens=(acc.get("tokens") or {}).get("total"),
            cost=(acc.get("costs") or {}).get("total"),
            source=source,
            span_count=len(walked),
            created_at=now,
            updated_at=now,
        )
        traces.append(trace)
        spans.extend((trace, span) for span in walked)
    Trace.objects.bulk_create(traces, batch_size=1000)
    rows = []
    for trace, span in spans:
        rows.append(
            Span(
                project=project,
                trace=trace,
                span_id=span["span_id"],
                parent_id=span.get("parent_id") or "",
                name=span.get("name", ""),
                kind=span.get("kind", "task"),
                start_time=span.get("start_time"),
                end_time=span.get("end_time"),
                status=span.get("status", "ok"),
                status_message=span.get("status_message", ""),
                attributes=span.get("attributes", {}),
            )
        )
    Span.objects.bulk_create(rows, batch_size=1000)
    return traces


def _walk(spans):
    for span in spans:
        yield span
        yield from _walk((span.get("children") or {}).values())
