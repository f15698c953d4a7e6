"""Applications: what a run invokes (a testset column, a logged application, an HTTP endpoint)."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    ValidationError,
    model_serializer,
)

from evalsite import outbound
from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.jsonpaths import dig
from evalsite.models import Project
from evaluators.crypto import UndecryptableKey, reseal, secrets_seal, secrets_unseal
from runs import conf
from runs.models import Application
from runs.traces import spans_valid

MISSING = object()  # an outputs_path the response does not have
# Between attempts: Retry-After when the application names one, else 0.2 s, 0.4 s, ... (jittered).
RETRY = outbound.Backoff(base_seconds=0.1, max_seconds=10.0)


class ColumnConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outputs_column: str = Field("outputs", description="The testset column holding the outputs.")
    error_column: str = Field(
        "",
        description="A testset column that, when a row has a value in it, says the outputs "
        "failed: the row's invocation is that error, not its outputs (empty: none).",
    )

    @model_serializer(mode="wrap")
    def _without_unused_error_column(self, handler) -> dict[str, Any]:
        """An application without an error column is stored as it always was."""
        data = handler(self)
        if not data.get("error_column"):
            data.pop("error_column", None)
        return data


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
        checked = CONFIGS[kind].model_validate(config or {}).model_dump(mode="json")
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc, prefix="config"))
    if "headers" in checked:
        checked["headers"] = secrets_seal(checked["headers"], {}, field="config.headers")
    return checked


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


def application_secrets_rotate() -> dict[str, Any]:
    """Re-encrypt the header values of every HTTP application under the first encryption key;
    ones no configured key decrypts are left as they are and listed by id."""
    rotated, failed = 0, []
    with transaction.atomic():
        apps = Application.objects.filter(kind=Application.Kind.HTTP).select_for_update()
        for app in apps.only("pk", "config"):
            headers = app.config.get("headers") or {}
            try:
                resealed = {name: reseal(value) for name, value in headers.items()}
            except UndecryptableKey:
                failed.append(f"application {app.pk}")
                continue
            Application.objects.filter(pk=app.pk).update(config={**app.config, "headers": resealed})
            rotated += 1
    return {"rotated": {"applications": rotated}, "failed": failed}


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
        error_column = application.config.get("error_column", "")
        return [_from_column(inputs, column, error_column) for inputs in inputs_list]
    if application.kind == Application.Kind.HTTP:
        config = HttpConfig.model_validate(application.config)
        with (
            outbound.client(_policy(), timeout=config.timeout_s) as client,
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


def _from_column(inputs: dict[str, Any], column: str, error_column: str = "") -> Invocation:
    failed = inputs.get(error_column) if error_column else None
    if failed not in (None, ""):
        # The outputs were never produced (a failed production call): an error, never outputs
        # for evaluators to score.
        message = failed if isinstance(failed, str) else json.dumps(failed, default=str)
        return Invocation(inputs, error=_error("outputs_failed", message[:2000]))
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
    error, pause = None, 0.0
    for attempt in range(config.retries + 1):
        time.sleep(pause)
        asked = None  # the headers of a 429 or 5xx, which may say when to come back
        try:
            response = client.post(
                url, json={"inputs": inputs}, headers=secrets_unseal(config.headers)
            )
        except (outbound.Refused, outbound.TooLarge, outbound.Compressed) as exc:
            code = "address_refused" if isinstance(exc, outbound.Refused) else "invalid_response"
            return Invocation(inputs, error=_error(code, str(exc)), start=start)
        except httpx.TimeoutException:
            error = _error(
                "timeout", f"The application did not answer within {config.timeout_s:g} s."
            )
        except httpx.HTTPError as exc:
            error = _error("connection_error", f"Could not reach the application: {exc}")
        else:
            if response.status_code != 429 and response.status_code < 500:
                return _from_response(response, config, inputs, start, started)
            error = _error("http_status", f"The application answered {response.status_code}.")
            asked = response.headers
        pause = RETRY.pause(attempt + 1, asked)
        if RETRY.too_long(pause):
            error["message"] += (
                f" It asked to wait {pause:g} s before a retry, longer than evalsite waits "
                f"({RETRY.max_seconds:g} s)."
            )
            break
    return Invocation(inputs, error=error, start=start, duration_ms=_ms(started))


def _policy() -> outbound.Policy:
    return outbound.Policy(
        allow_private=conf.allow_private("EVALSITE_APPLICATIONS_ALLOW_PRIVATE"),
        setting="EVALSITE_APPLICATIONS_ALLOW_PRIVATE",
        caller="HTTP applications",
    )


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
    outputs = dig(body, config.outputs_path, default=MISSING)
    if outputs is MISSING:
        return Invocation(
            inputs,
            error=_error("outputs_path", f"The response has no {config.outputs_path!r}."),
            start=start,
            duration_ms=duration,
        )
    invocation = Invocation(inputs, outputs=outputs, start=start, duration_ms=duration)
    if config.trace_path:
        invocation.trace = _own_trace(dig(body, config.trace_path), outputs)
    return invocation


def _own_trace(trace: Any, outputs: Any) -> dict | None:
    """The application's own trace, when it sent a usable one (a trace id and root spans); its
    root span's outputs are set to what ``outputs_path`` picked, so every reader of the stored
    invocation sees the outputs the run's evaluators saw. Anything else is ignored: the
    invocation is then recorded as usual."""
    if not (
        isinstance(trace, dict)
        and isinstance(trace.get("trace_id"), str)
        and trace["trace_id"]
        and isinstance(trace.get("spans"), dict)
        and trace["spans"]
        and all(isinstance(span, dict) for span in trace["spans"].values())
        and spans_valid(trace)
    ):
        return None
    root_id, root = next(iter(trace["spans"].items()))
    attributes = dict(root.get("attributes") or {})
    ag = dict(attributes.get("ag") or {})
    ag["data"] = {**(ag.get("data") or {}), "outputs": outputs}
    attributes["ag"] = ag
    spans = {**trace["spans"], root_id: {"span_id": root_id, **root, "attributes": attributes}}
    return {**trace, "spans": spans}


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "type": code, "message": message, "stacktrace": ""}


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


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
