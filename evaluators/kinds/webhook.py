"""Webhook: POST the evaluation to the user's own HTTP endpoint; its JSON answer is the result.

The request body is ``{"inputs", "outputs", "trace", "parameters"}``; the answer is any JSON
value the evaluator contract accepts (a bool, a number, a dict of metrics), normalised like a
code evaluator's return value.

Evaluators are configured by project members, and the request leaves from evalsite's own
network, so the call goes through ``evalsite.outbound``: only public addresses, the connection
pinned to the address checked, the answer bounded by ``max_response_bytes`` and
``timeout_seconds``. Redirects are not followed. ``EVALSITE_WEBHOOK_ALLOW_PRIVATE`` lifts the
address check for installations whose webhooks live on the internal network.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import httpx
from django.conf import settings
from pydantic import Field, field_validator

from evalsite import outbound
from evaluators.crypto import secrets_unseal
from evaluators.kinds.base import Kind, KindParameters, register, ui
from evaluators.normalize import EvaluationError

_HOSTNAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Headers evalsite sets itself: the pinned connection depends on Host, and the body on the rest.
_RESERVED_HEADERS = {
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "accept-encoding",
}
SNIPPET = 300


class Parameters(KindParameters):
    url: str = Field(
        ...,
        max_length=2048,
        description="The endpoint that receives a POST with inputs, outputs, trace and "
        "parameters, and answers with JSON.",
        json_schema_extra=ui(label="Webhook URL"),
    )
    timeout_seconds: float = Field(
        10.0, gt=0, le=120, description="Give up when the whole call takes longer."
    )
    max_response_bytes: int = Field(
        1_000_000,
        ge=1,
        le=10_000_000,
        description="Refuse answers larger than this.",
        json_schema_extra=ui(advanced=True),
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description='Extra request headers, e.g. {"Authorization": "Bearer ..."}. Values are '
        'stored encrypted and read back as "••••••"; send "••••••" to keep a stored value.',
        json_schema_extra=ui(advanced=True, widget="json", sealed=True),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Any JSON your webhook wants; sent as parameters.config.",
        json_schema_extra=ui(advanced=True, widget="json"),
    )
    threshold: float = Field(
        0.5,
        description="When the webhook answers a bare number, success means score >= threshold.",
        json_schema_extra=ui(advanced=True),
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a valid URL: {exc}")
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parsed.userinfo:
            raise ValueError("must not hold credentials; send them in headers instead")
        if not _HOSTNAME.fullmatch(parsed.raw_host.decode("ascii")) and not _is_ip(parsed):
            raise ValueError(f"{parsed.host!r} is not a valid host name")
        if parsed.port is not None and not 0 < parsed.port < 65536:
            raise ValueError(f"port {parsed.port} is out of range")
        return url

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid header name")
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"{name} is set by evalsite and cannot be changed")
            if any(char in value for char in "\r\n\0"):
                raise ValueError(f"the value of {name} contains a line break")
        return headers


def _is_ip(url: httpx.URL) -> bool:
    try:
        ipaddress.ip_address(url.raw_host.decode("ascii"))
    except ValueError:
        return False
    return True


def evaluate(parameters: Parameters, inputs: dict, outputs: Any, trace) -> Any:
    url = httpx.URL(parameters.url)
    body = json.dumps(
        {
            "inputs": inputs,
            "outputs": outputs,
            "trace": trace,
            # Headers often carry a secret; the receiver already has them as headers.
            "parameters": parameters.model_dump(mode="json", exclude={"headers"}),
        }
    ).encode()
    headers = httpx.Headers({"Accept": "application/json", "User-Agent": "evalsite-webhook/1"})
    headers.update(secrets_unseal(parameters.headers))
    headers["Content-Type"] = "application/json"
    try:
        with outbound.client(
            _policy(),
            timeout=parameters.timeout_seconds,
            max_response_bytes=parameters.max_response_bytes,
        ) as client:
            response = client.post(url, content=body, headers=headers)
    except outbound.Refused as exc:
        raise EvaluationError(str(exc), code="webhook_address_refused")
    except outbound.Unresolvable as exc:
        raise EvaluationError(str(exc), code="webhook_unresolvable")
    except outbound.TooLarge:
        raise _too_large(parameters)
    except outbound.Compressed as exc:
        raise EvaluationError(str(exc), code="webhook_invalid_response")
    except httpx.TimeoutException:
        raise _timeout(parameters)
    except httpx.HTTPError as exc:
        raise EvaluationError(
            f"The webhook call to {_where(url)} failed: {exc or type(exc).__name__}",
            code="webhook_unreachable",
        )
    if not response.is_success:
        raise _http_error(url, response, response.content[:SNIPPET])
    try:
        return json.loads(response.content)
    except ValueError as exc:
        text = response.content[:SNIPPET].decode("utf-8", "replace")
        raise EvaluationError(
            f"The webhook's answer is not JSON ({exc}): {text!r}", code="webhook_invalid_response"
        )


def _policy() -> outbound.Policy:
    return outbound.Policy(
        allow_private=settings.EVALSITE_WEBHOOK_ALLOW_PRIVATE,
        setting="EVALSITE_WEBHOOK_ALLOW_PRIVATE",
        caller="Webhooks",
    )


def _http_error(url: httpx.URL, response: httpx.Response, body: bytes) -> EvaluationError:
    status = response.status_code
    if response.is_redirect:
        target = response.headers.get("location", "?")
        return EvaluationError(
            f"The webhook answered HTTP {status}, a redirect to {target}; evalsite does not "
            f"follow webhook redirects, so point the URL at the final address.",
            code="webhook_http_error",
        )
    text = body.decode("utf-8", "replace").strip()
    return EvaluationError(
        f"The webhook at {_where(url)} answered HTTP {status}{': ' + text if text else ''}",
        code="webhook_http_error",
    )


def _too_large(parameters: Parameters) -> EvaluationError:
    return EvaluationError(
        f"The webhook's answer is larger than max_response_bytes "
        f"({parameters.max_response_bytes} bytes).",
        code="webhook_response_too_large",
    )


def _timeout(parameters: Parameters) -> EvaluationError:
    return EvaluationError(
        f"The webhook did not answer within {parameters.timeout_seconds:g} seconds.",
        code="webhook_timeout",
    )


def _where(url: httpx.URL) -> str:
    return str(url.copy_with(query=None, fragment=None))


kind = register(
    Kind(
        key="webhook",
        name="Webhook",
        description="POSTs inputs, outputs and trace to your HTTP endpoint; its JSON answer "
        "(a bool, a number, or a dict of metrics) is the result.",
        parameters=Parameters,
        evaluate=evaluate,
        outputs=None,
    )
)
