"""The web server's worker: gunicorn's threaded worker, taking a new connection when it is the
process best placed to serve it rather than whenever it wakes first.

gunicorn's own lets every process accept whenever a connection waits, and the one already
awake is the quickest: four clients connecting at once often all landed in one process, which
then ran their requests on one core under one GIL while the other processes idled (ingestion at
half its speed, docs/traces.md "Throughput"). Here a process takes a new connection only while
none of its requests started less than ``FRESH`` seconds ago: an idle process takes it first,
and a process whose requests all wait on something else (a model call, a streamed export)
still takes more, up to its threads. A process kept busy by its kept-alive clients' steady
requests refuses for ``PATIENCE`` at most, so a new connection never waits long when every
process is busy. A connection stays with the process that accepted it (keep-alive), so where
connections land is what there is to balance.

Everything here runs on the worker's main thread (gunicorn calls these from its event loop), so
the bookkeeping needs no lock. It leans on ``ThreadWorker``'s methods and its ``_accepting``
flag (gunicorn is pinned to 27.x); tests/evalsite/test_webworker.py runs it in a real gunicorn.
"""

from __future__ import annotations

import time

from gunicorn.workers.gthread import ThreadWorker

from evalsite.env import env_float

# About a CPU-bound request's time: a request older than this is taken to be waiting.
FRESH = env_float("WEB_ACCEPT_FRESH_SECONDS", 0.02)
PATIENCE = 0.25


class BalancedThreadWorker(ThreadWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started: dict[int, float] = {}  # id(connection) -> when its request was queued
        self.refusing_since: float | None = None

    def accept(self, listener) -> None:
        self.refusing_since = None
        super().accept(listener)

    def enqueue_req(self, conn) -> None:
        self.started[id(conn)] = time.monotonic()
        super().enqueue_req(conn)
        # The event loop asks only when its own answer changes: ask now, while more
        # connections may be waiting in this same turn.
        self.set_accept_enabled(self._accepting)

    def finish_request(self, conn, fs) -> None:
        self.started.pop(id(conn), None)
        super().finish_request(conn, fs)

    def set_accept_enabled(self, enabled: bool) -> None:
        # After a "no" here, the event loop asks again on every turn.
        super().set_accept_enabled(enabled and self.may_accept())

    def may_accept(self) -> bool:
        if len(self.started) >= self.cfg.threads:
            return False
        now = time.monotonic()
        newest = max(self.started.values(), default=None)
        if newest is None or now - newest >= FRESH:
            self.refusing_since = None
            return True
        if self.refusing_since is None:
            self.refusing_since = now
        return now - self.refusing_since >= PATIENCE

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self.started and not self._accepting and len(self.started) < self.cfg.threads:
            timeout = min(timeout, FRESH)  # look again once the newest request is no longer fresh
        super().wait_for_and_dispatch_events(timeout)
