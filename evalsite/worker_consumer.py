"""The Celery worker's consumer, surviving a broker that drops while a task is in hand.

Celery 5.7 answers a lost broker connection by collecting the connection (which detaches its
transport) and then closing it. When collecting could not close the default channel (it was
mid-BRPOP as the socket died), the later close restores the unacknowledged messages through the
detached transport, and with the Redis transport that raises ``AttributeError`` (kombu reads the
broker's address off the detached client). The error is not a connection error, so it escaped
and stopped the worker ("Unrecoverable error") when that race met a task in hand: a broker
restart then left the queues without consumers. Here that close error is logged and the consumer reconnects as it does after any
other connection loss. The messages it would have restored are the broker's business: a broker
that lost them lost the queue too (the engine's sweep re-queues lost work, docs/runs.md), and
one that kept them hands them out again after the visibility timeout.

Named by ``CELERY_WORKER_CONSUMER``; only worker processes import it.
"""

from __future__ import annotations

import logging

from celery.worker.consumer import Consumer

logger = logging.getLogger(__name__)


class BrokerLossConsumer(Consumer):
    def on_connection_error_after_connected(self, exc):
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError:
            # Only the close's error, raised after Celery let the connection go; any other
            # AttributeError is a bug that should still stop the worker.
            if self.connection is not None:
                raise
            logger.warning(
                "Closing the lost broker connection failed; reconnecting anyway", exc_info=True
            )
