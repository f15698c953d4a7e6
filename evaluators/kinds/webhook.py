"""Webhook: POST the evaluation to the user's own HTTP endpoint; its JSON answer is the result.

The request body is ``{"inputs", "outputs", "trace", "parameters"}``; the answer is any JSON
value the evaluator contract accepts (a bool, a number, a dict of metrics), normalised like a
code evaluator's return value.

Evaluators are configured by project members, and the request leaves from evalsite's own
network, so the URL must not reach private, loopback or link-local addresses (cloud metadata,
the database, admin ports). The host is resolved once, every address is checked, and the
connection goes to a checked address (no second lookup that DNS rebinding could answer
differently); redirects are not followed. ``EVALSITE_WEBHOOK_ALLOW_PRIVATE`` lifts the address
check for installations whose webhooks live on the internal network.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import time
from typing import Any

import httpx
from django.conf import settings
from pydantic import Field, field_validator

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
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
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
        description='Extra request headers, e.g. {"Authorization": "Bearer ..."}.',
        json_schema_extra=ui(advanced=True, widget="json"),
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
    addresses = _resolve(url)
    if not settings.EVALSITE_WEBHOOK_ALLOW_PRIVATE:
        for address in addresses:
            refuse_private_address(url, address)
    body = json.dumps(
        {
            "inputs": inputs,
            "outputs": outputs,
            "trace": trace,
            # Headers often carry a secret; the receiver already has them as headers.
            "parameters": parameters.model_dump(mode="json", exclude={"headers"}),
        }
    ).encode()
    deadline = time.monotonic() + parameters.timeout_seconds
    try:
        with httpx.Client(
            timeout=parameters.timeout_seconds, follow_redirects=False, trust_env=False
        ) as client:
            return _post(client, url, addresses, body, parameters, deadline)
    except httpx.TimeoutException:
        raise _timeout(parameters)
    except httpx.HTTPError as exc:
        raise EvaluationError(
            f"The webhook call to {_where(url)} failed: {exc or type(exc).__name__}",
            code="webhook_unreachable",
        )


def _resolve(url: httpx.URL) -> list[str]:
    host = url.raw_host.decode("ascii")
    try:
        found = socket.getaddrinfo(host, url.port or 0, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EvaluationError(
            f"The webhook host {url.host!r} could not be resolved: {exc}",
            code="webhook_unresolvable",
        )
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def refuse_private_address(url: httpx.URL, address: str) -> None:
    """Raise ``webhook_address_refused`` unless ``address`` is public, seen through IPv4 wrapped
    in IPv6 (mapped, 6to4, NAT64)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address wrapped in IPv6 is reached as that IPv4 address.
        if ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        else:
            ip = ip.ipv4_mapped or ip.sixtofour or ip
    if ip.is_global and not ip.is_multicast:
        return
    what = next(
        (
            name
            for name, found in (
                ("loopback", ip.is_loopback),
                ("link-local", ip.is_link_local),
                ("private", ip.is_private),
            )
            if found
        ),
        "non-public",
    )
    raise EvaluationError(
        f"The webhook host {url.host!r} resolves to {address}, a {what} address. Webhooks may "
        f"only call public addresses (an operator can allow private ones with "
        f"EVALSITE_WEBHOOK_ALLOW_PRIVATE).",
        code="webhook_address_refused",
    )


def _post(client, url, addresses, body, parameters, deadline) -> Any:
    response = _connect(client, url, addresses, body, parameters, deadline)
    try:
        if not response.is_success:
            raise _http_error(url, response, _read(response, SNIPPET, deadline, parameters)[0])
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise EvaluationError(
                f"The webhook answered with Content-Encoding {encoding}; evalsite asks for an "
                f"uncompressed answer (Accept-Encoding: identity) and reads only that.",
                code="webhook_invalid_response",
            )
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > parameters.max_response_bytes:
            raise _too_large(parameters)
        content, complete = _read(response, parameters.max_response_bytes, deadline, parameters)
        if not complete:
            raise _too_large(parameters)
    finally:
        response.close()
    try:
        return json.loads(content)
    except ValueError as exc:
        text = content[:SNIPPET].decode("utf-8", "replace")
        raise EvaluationError(
            f"The webhook's answer is not JSON ({exc}): {text!r}", code="webhook_invalid_response"
        )


def _connect(client, url, addresses, body, parameters, deadline) -> httpx.Response:
    """Send to the checked addresses in turn, keeping the name for Host and TLS (SNI and
    certificate checks use the name, not the address)."""
    headers = httpx.Headers({"Accept": "application/json", "User-Agent": "evalsite-webhook/1"})
    headers.update(parameters.headers)
    headers.update(
        {
            "Host": url.netloc.decode("ascii"),
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }
    )
    extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    for attempt, address in enumerate(addresses, start=1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout(parameters)
        request = client.build_request(
            "POST",
            url.copy_with(host=address),
            content=body,
            headers=headers,
            extensions=extensions,
            timeout=remaining,
        )
        try:
            return client.send(request, stream=True)
        except httpx.ConnectError:
            if attempt == len(addresses):
                raise
    raise EvaluationError(f"{url.host!r} has no address", code="webhook_unresolvable")


def _read(response: httpx.Response, limit: int, deadline: float, parameters) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body, and whether that was all of it."""
    chunks, size = [], 0
    for chunk in response.iter_raw():
        if time.monotonic() > deadline:
            raise _timeout(parameters)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True


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
