"""The judge's settings: a Django setting of the same name wins, else the environment, else the
default. A malformed value raises ``ImproperlyConfigured`` naming the setting.

=====================================  =======  ================================================
EVALSITE_JUDGE_CONCURRENCY             64       model calls in flight per batch (threads)
EVALSITE_JUDGE_MAX_WAIT_SECONDS        120      longest wait for a rate-limit slot before a
                                                cell fails as ``rate_limited``
EVALSITE_JUDGE_MAX_BACKOFF_SECONDS     30       longest single pause between retries (also
                                                the longest Retry-After honoured)
EVALSITE_MODELS_ALLOW_PRIVATE          False    allow model connections to private, loopback
                                                and link-local addresses (local models)
EVALSITE_TEMPLATE_RENDER_SECONDS       2        wall-clock deadline of one template render
                                                (curly, jinja2), and the longest wait for a
                                                free render worker
EVALSITE_TEMPLATE_RENDER_MEMORY_MB     256      memory one render may build, past the render
                                                worker's own
EVALSITE_TEMPLATE_RENDER_WORKERS       2        render worker processes per server process
=====================================  =======  ================================================
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULTS: dict[str, str | int | float | bool] = {
    "EVALSITE_JUDGE_CONCURRENCY": 64,
    "EVALSITE_JUDGE_MAX_WAIT_SECONDS": 120.0,
    "EVALSITE_JUDGE_MAX_BACKOFF_SECONDS": 30.0,
    "EVALSITE_MODELS_ALLOW_PRIVATE": False,
    "EVALSITE_TEMPLATE_RENDER_SECONDS": 2.0,
    "EVALSITE_TEMPLATE_RENDER_MEMORY_MB": 256,
    "EVALSITE_TEMPLATE_RENDER_WORKERS": 2,
}


def setting(name: str):
    default = DEFAULTS[name]
    if hasattr(settings, name):
        return getattr(settings, name)
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        if isinstance(default, bool):
            return _bool(raw)
        if isinstance(default, int | float):
            value = type(default)(raw)
            if value < 0:
                raise ValueError
            return value
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a valid {type(default).__name__}.")
    return raw


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(raw)
