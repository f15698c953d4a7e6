"""The database backend's health check (evalsite/postgres/base.py): no round trip while the
server has said nothing on the connection, and a connection the server closed is replaced
before a request uses it."""

from __future__ import annotations

import select
import time

import pytest
from django.db import connection, connections

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _last_statement(pid: int) -> str:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone()[0]
    finally:
        other.close()


def test_a_healthy_connection_is_checked_without_a_round_trip():
    pid = _backend_pid()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last statement'")
    assert connection.is_usable()
    assert _last_statement(pid) == "SELECT 'the last statement'"


def test_a_connection_the_server_closed_is_replaced_before_the_request_uses_it():
    pid = _backend_pid()
    other = connections.create_connection("default")
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    other.close()
    socket = connection.connection.pgconn.socket
    for _ in range(200):  # the backend says goodbye on the socket as it exits
        if select.select([socket], [], [], 0)[0]:
            break
        time.sleep(0.05)
    # What Django does as a request starts, and before its first query.
    connection.close_if_unusable_or_obsolete()
    connection.close_if_health_check_failed()
    assert _backend_pid() != pid
