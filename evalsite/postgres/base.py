"""Django's PostgreSQL backend, with a cheaper connection health check.

``CONN_HEALTH_CHECKS`` makes Django ask PostgreSQL ``SELECT 1`` before the first query of every
request, so that a connection the server closed (a restart, ``pg_terminate_backend``, an idle
timeout) is replaced instead of failing the request: a round trip each request, a twentieth of
an ingest's CPU. A server that closes a connection says so on its socket first (an error
message, then end of file), so the socket turns readable while the connection sits idle between
requests. Here the check polls the socket without waiting: nothing there on an idle connection,
the connection is taken as usable; anything else (something to read, a connection not idle, a
socket that cannot be polled), Django's ``SELECT 1`` decides as before. A connection whose peer
vanished without a word is seen by neither check: its first query fails.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        if connection.info.transaction_status != pq.TransactionStatus.IDLE:
            return super().is_usable()
        try:
            poller = select.poll()  # not select(): a descriptor past 1023 is fine here
            poller.register(connection.pgconn.socket, select.POLLIN)
            quiet = not poller.poll(0)
        except (OSError, ValueError):
            quiet = False
        return quiet or super().is_usable()
