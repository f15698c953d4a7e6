"""The runs app's settings, read in one place. Each is an ``EVALSITE_*`` setting (settings.py
reads it from the environment; docs/configuration.md lists them) with the default below, so a
test may override one with ``settings.X = ...`` and every reader sees it."""

from __future__ import annotations

from django.conf import settings


def _get(name: str, default):
    return getattr(settings, name, default)


def chunk_size() -> int:
    """Scenarios per work unit of a batch run."""
    return int(_get("EVALSITE_RUN_CHUNK_SIZE", 250))


def lease_seconds() -> float:
    """How long a worker holds a unit without renewing its lease (it renews every third of it)."""
    return float(_get("EVALSITE_UNIT_LEASE_SECONDS", 15))


def unit_max_attempts() -> int:
    """Claims of one unit before it is failed with ``engine_error`` (a unit that kills its worker)."""
    return int(_get("EVALSITE_UNIT_MAX_ATTEMPTS", 3))


def resend_seconds() -> float:
    """A queued unit nobody claimed for this long has its message sent again (a broker that
    restarted empty loses messages; a duplicate finds nothing to claim and does nothing)."""
    return float(_get("EVALSITE_UNIT_RESEND_SECONDS", 30))


def refresh_delay_seconds() -> float:
    """Debounce of the read-model refresh (metrics, mappings, inference) after cells land."""
    return float(_get("EVALSITE_METRICS_REFRESH_SECONDS", 2))


def online_delay_seconds() -> float:
    return float(_get("EVALSITE_ONLINE_DELAY_SECONDS", 5.0))


def online_chunk_size() -> int:
    return int(_get("EVALSITE_ONLINE_CHUNK_SIZE", 50))


def session_sweep_limit() -> int:
    """Sessions one session rule judges per sweep at most: a flood is spread over sweeps."""
    return int(_get("EVALSITE_SESSION_SWEEP_LIMIT", 200))


def testset_max_bytes() -> int:
    return int(_get("EVALSITE_TESTSET_MAX_BYTES", 50 * 1024 * 1024))


def testset_max_rows() -> int:
    return int(_get("EVALSITE_TESTSET_MAX_ROWS", 100_000))


def trace_max_spans() -> int:
    return int(_get("EVALSITE_TRACE_MAX_SPANS", 10_000))


def trace_max_attributes_bytes() -> int:
    return int(_get("EVALSITE_TRACE_MAX_ATTRIBUTES_BYTES", 1024 * 1024))


def trace_max_body_bytes() -> int:
    body = int(_get("EVALSITE_TRACE_MAX_BODY_BYTES", settings.EVALSITE_MAX_BODY_BYTES))
    return min(body, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or body)


def partitions_ahead() -> int:
    """Daily span partitions kept created beyond today (docs/traces.md)."""
    return int(_get("EVALSITE_PARTITIONS_AHEAD", 7))


def code_runner() -> str:
    return str(_get("EVALSITE_CODE_RUNNER", "sandbox"))


def allow_private(setting: str) -> bool:
    """``EVALSITE_APPLICATIONS_ALLOW_PRIVATE`` and friends: may outbound calls reach private
    addresses (tests and on-premises applications)."""
    return bool(_get(setting, False))
