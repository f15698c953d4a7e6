"""Reachability checks for /healthz."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from kombu import Connection


def check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # any failure is the answer here, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"


def check_broker() -> str:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"error: {exc.__class__.__name__}: {exc}"


def check_all() -> dict[str, str]:
    return {"database": check_database(), "broker": check_broker()}
