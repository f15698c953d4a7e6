"""The one way evalsite calls out over HTTP: webhooks, HTTP applications, model connections.

Their URLs are set by project members and the requests leave from evalsite's own network, so a
call must not become a way into that network (cloud metadata at 169.254.169.254, the database,
admin ports). ``client(policy, ...)`` returns an ``httpx.Client`` whose ``Transport``, for every
request and so for every redirect hop:

- looks the host up once, with ``resolver`` (tests put a stub in its place);
- refuses the request unless every address is globally routable and not multicast, judging an
  IPv4 address wrapped in IPv6 (mapped ``::ffff:a.b.c.d``, compatible ``::a.b.c.d``, NAT64
  ``64:ff9b::/96``, 6to4 ``2002::/16``) as the IPv4 address it reaches; the call site's setting
  (``Policy.allow_private``) lifts this;
- connects to the address it checked, never looking the name up again (DNS rebinding), keeping
  the name for the Host header and for TLS (SNI and the certificate check);
- asks for an uncompressed answer (a compressed one could grow past the size bound once
  decoded) and reads at most ``max_response_bytes`` of it, within ``timeout`` seconds in all.

Proxy settings of the environment (``HTTP_PROXY``) are ignored: a proxy would resolve the name
itself. Callers that retry use ``Backoff``, which honours ``Retry-After``.
"""

from __future__ import annotations

import email.utils
import ipaddress
import random
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import httpx

MAX_RESPONSE_BYTES = 10 * 1024 * 1024
MAX_REDIRECTS = 5
MAX_POOLS = 32  # host names one client keeps connections to

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
# Not global, though the tables of Python 3.11's ipaddress say they are (RFC 8215 local NAT64).
_NOT_GLOBAL = (ipaddress.ip_network("64:ff9b:1::/48"),)
_PHRASES = {
    "unspecified": "an unspecified address",
    "loopback": "a loopback address",
    "link-local": "a link-local address",
    "multicast": "a multicast address",
    "shared": "a shared address (100.64.0.0/10, carrier-grade NAT)",
    "private": "a private address",
    "reserved": "a reserved, non-public address",
}


class Resolver(Protocol):
    def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of ``host``, best first; ``socket.gaierror`` when there are none."""
        ...


class SystemResolver:
    def resolve(self, host: str, port: int) -> list[str]:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return list(dict.fromkeys(str(info[4][0]) for info in found))


resolver: Resolver = SystemResolver()


class OutboundError(httpx.TransportError):
    """A request evalsite would not make or finish. It is an ``httpx.TransportError``, so code
    that handles transport failures (the openai SDK too) handles it."""


class Refused(OutboundError):
    def __init__(self, message: str, *, host: str, address: str, reason: str, request=None):
        super().__init__(message, request=request)
        self.host, self.address, self.reason = host, address, reason


class Unresolvable(OutboundError):
    pass


class TooLarge(OutboundError):
    pass


class Compressed(OutboundError):
    pass


class TooSlow(OutboundError, httpx.TimeoutException):
    pass


def reached(ip: IPAddress) -> IPAddress:
    """The address packets to ``ip`` really reach: IPv4 wrapped in IPv6 is that IPv4 address."""
    if ip.version == 4:
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    # ::/96 holds :: and ::1 too, which are IPv6's own unspecified and loopback addresses.
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return ip.sixtofour or ip


def why_not_global(address: str) -> str | None:
    """Why ``address`` is not a public unicast address ("loopback", "private", "shared", ...),
    or None when it is one."""
    ip = reached(ipaddress.ip_address(address))
    for reason, found in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("shared", ip in _SHARED),
        ("private", any(ip in network for network in _PRIVATE)),
        ("reserved", not ip.is_global or any(ip in network for network in _NOT_GLOBAL)),
    ):
        if found:
            return reason
    return None


@dataclass(frozen=True)
class Policy:
    """Which addresses one feature's calls may reach. ``setting`` is what lifts the refusal and
    ``caller`` who calls ("Webhooks"), both for the message; ``resolver`` None means the
    module's ``resolver``."""

    allow_private: bool
    setting: str
    caller: str = "Outbound calls"
    resolver: Resolver | None = None

    def refuses(self, address: str, port: int) -> str | None:
        """Why this address may not be called, or None."""
        return None if self.allow_private else why_not_global(address)

    def message(self, host: str, address: str, reason: str) -> str:
        ip = ipaddress.ip_address(address)
        inside = f" (IPv4 {reached(ip)})" if reached(ip) != ip else ""
        return (
            f"The host {host!r} resolves to {address}{inside}, "
            f"{_PHRASES.get(reason, f'an address refused ({reason})')}. {self.caller} may only "
            f"call public addresses; an operator can allow private ones with {self.setting}=1."
        )


def checked_addresses(url: httpx.URL | str, policy: Policy, request=None) -> list[str]:
    """The addresses of ``url``'s host, looked up once and each checked by ``policy``; raises
    ``Refused`` when any is refused (a name that also points inward is not trusted) and
    ``Unresolvable`` when there are none."""
    url = httpx.URL(url)
    host, port = url.raw_host.decode("ascii"), url.port or (443 if url.scheme == "https" else 80)
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = (policy.resolver or resolver).resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise Unresolvable(
                f"The host {url.host!r} could not be resolved: {exc}", request=request
            )
    if not addresses:
        raise Unresolvable(f"The host {url.host!r} has no address.", request=request)
    for address in addresses:
        reason = policy.refuses(address, port)
        if reason:
            message = policy.message(url.host, address, reason)
            raise Refused(message, host=url.host, address=address, reason=reason, request=request)
    return addresses


class Transport(httpx.BaseTransport):
    """Checks and pins every request (see the module). One connection pool per host name, so a
    TLS connection made for one name never carries another name's request."""

    def __init__(
        self,
        policy: Policy,
        *,
        timeout: float,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        limits: httpx.Limits | None = None,
    ) -> None:
        self.policy = policy
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._limits = limits or httpx.Limits()
        self._ssl = httpx.create_ssl_context()
        self._pools: OrderedDict[str, httpx.HTTPTransport] = OrderedDict()
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + self.timeout
        addresses = checked_addresses(request.url, self.policy, request)
        pool = self._pool(request.url.raw_host.decode("ascii"))
        for attempt, address in enumerate(addresses, start=1):
            try:
                response = pool.handle_request(self._pinned(request, address, deadline))
            except httpx.ConnectError:
                if attempt == len(addresses):
                    raise
                continue
            return self._bounded(response, request, deadline)
        raise AssertionError("checked_addresses returns at least one address")

    def _pinned(self, request: httpx.Request, address: str, deadline: float) -> httpx.Request:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TooSlow(f"No answer within {self.timeout:g} s.", request=request)
        timeouts = request.extensions.get("timeout", {})
        extensions = {
            **request.extensions,
            "timeout": {
                name: remaining if timeouts.get(name) is None else min(timeouts[name], remaining)
                for name in ("connect", "read", "write", "pool")
            },
        }
        if request.url.scheme == "https":
            extensions["sni_hostname"] = request.url.raw_host.decode("ascii")
        headers = request.headers.copy()  # Host stays the name: httpx set it from the URL
        headers["Accept-Encoding"] = "identity"
        return httpx.Request(
            request.method,
            request.url.copy_with(host=address),
            headers=headers,
            stream=request.stream,
            extensions=extensions,
        )

    def _bounded(self, response: httpx.Response, request, deadline: float) -> httpx.Response:
        encoding = response.headers.get("content-encoding", "").strip().lower()
        declared = response.headers.get("content-length", "")
        try:
            if encoding not in ("", "identity"):
                raise Compressed(
                    f"The answer came with Content-Encoding {encoding}; evalsite asks for an "
                    f"uncompressed answer (Accept-Encoding: identity) and reads only that.",
                    request=request,
                )
            if declared.isdecimal() and int(declared) > self.max_response_bytes:
                raise self._too_large(request)
        except OutboundError:
            response.close()
            raise
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedStream(response.stream, self, request, deadline),
            extensions=response.extensions,
        )

    def _too_large(self, request) -> TooLarge:
        return TooLarge(
            f"The answer is larger than {self.max_response_bytes} bytes.", request=request
        )

    def _pool(self, name: str) -> httpx.HTTPTransport:
        with self._lock:
            pool = self._pools.pop(name, None) or httpx.HTTPTransport(
                verify=self._ssl, limits=self._limits, trust_env=False
            )
            self._pools[name] = pool
            if len(self._pools) > MAX_POOLS:
                # Not closed: a request may still be using it; its sockets close when collected.
                self._pools.popitem(last=False)
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), OrderedDict()
        for pool in pools:
            pool.close()


class _BoundedStream(httpx.SyncByteStream):
    def __init__(self, stream, transport: Transport, request, deadline: float) -> None:
        self._stream, self._transport = stream, transport
        self._request, self._deadline = request, deadline

    def __iter__(self) -> Iterator[bytes]:
        size = 0
        for chunk in self._stream:
            size += len(chunk)
            if size > self._transport.max_response_bytes:
                raise self._transport._too_large(self._request)
            if time.monotonic() > self._deadline:
                raise TooSlow(
                    f"No complete answer within {self._transport.timeout:g} s.",
                    request=self._request,
                )
            yield chunk

    def close(self) -> None:
        self._stream.close()


def client(
    policy: Policy,
    *,
    timeout: float,
    max_response_bytes: int = MAX_RESPONSE_BYTES,
    follow_redirects: bool = False,
    limits: httpx.Limits | None = None,
) -> httpx.Client:
    """An ``httpx.Client`` that calls out only as ``policy`` allows (see the module). ``timeout``
    bounds each request in all (each redirect hop is a request); redirects, when followed, are
    checked hop by hop like the first request."""
    transport = Transport(
        policy, timeout=timeout, max_response_bytes=max_response_bytes, limits=limits
    )
    return httpx.Client(
        transport=transport,
        timeout=timeout,
        follow_redirects=follow_redirects,
        max_redirects=MAX_REDIRECTS,
        trust_env=False,
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms``, or ``Retry-After`` (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True)
class Backoff:
    """The retry policy: the server's ``Retry-After`` when it names one, else exponential
    backoff with full jitter (a random pause up to ``base_seconds * 2**retry``, at most
    ``max_seconds``). A caller whose server asks for more than ``max_seconds`` gives up rather
    than wait (``too_long``)."""

    base_seconds: float = 0.25
    max_seconds: float = 30.0

    def pause(self, retry: int, headers: Mapping[str, str] | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        after = retry_after(headers) if headers is not None else None
        if after is not None:
            return after
        return random.uniform(0, min(self.max_seconds, self.base_seconds * 2**retry))

    def too_long(self, pause: float) -> bool:
        return pause > self.max_seconds
