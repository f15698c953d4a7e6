"""Reachability checks for /healthz: ``ok`` or ``failing`` per dependency. The reason goes to the
log, never to the anonymous caller (exception text can carry hosts, users and paths)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from kombu import Connection

logger = logging.getLogger(__name__)


def check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception:  # any failure is the answer here, not a crash
        logger.warning("health: the database is failing", exc_info=True)
        return "failing"


def check_broker() -> str:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception:
        logger.warning("health: the broker is failing", exc_info=True)
        return "failing"


def check_all() -> dict[str, str]:
    return {"database": check_database(), "broker": check_broker()}
