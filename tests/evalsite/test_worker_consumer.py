"""The worker's consumer when the broker drops with a message in hand, on a real Redis broker.

Celery 5.7 collects a lost connection and then closes it. When the first close was cut short
(the channel was mid-BRPOP as the socket died), collecting detaches the transport before the
default channel is closed for good, and that close restores the unacknowledged messages through
the detached transport: kombu raises ``AttributeError``, which used to stop the worker. The race
is reproduced here without timing: a connection whose ``collect`` detaches its transport as the
cut-short close leaves it.
"""

from __future__ import annotations

import pytest
from kombu import Connection, Exchange, Queue

from evalsite.celery import app
from evalsite.worker_consumer import BrokerLossConsumer


class _CollectCutShort(Connection):
    """A real connection whose collect leaves the default channel open and the transport
    detached, as a close cut short by the dead socket does."""

    def collect(self, socket_timeout=None):
        self._do_close_transport()


def _consumer_losing(broker) -> BrokerLossConsumer:
    connection = _CollectCutShort(broker.url)
    queue = Queue("lost", Exchange("lost"), routing_key="lost")
    with connection.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="lost", declare=[queue])
    message = connection.default_channel.basic_get("lost")  # delivered, not acknowledged
    assert message is not None
    consumer = BrokerLossConsumer.__new__(BrokerLossConsumer)  # only what this path reads
    consumer.app, consumer.connection = app, connection
    return consumer


def test_the_reproduction_stops_celerys_own_consumer(broker):
    # If an upgrade of Celery or kombu makes this fail, the race is fixed upstream and
    # evalsite.worker_consumer can go.
    consumer = _consumer_losing(broker)
    with pytest.raises(AttributeError):
        super(BrokerLossConsumer, consumer).on_connection_error_after_connected(ConnectionError())


def test_the_worker_consumer_survives_losing_the_broker_with_a_message_in_hand(broker, caplog):
    consumer = _consumer_losing(broker)
    consumer.on_connection_error_after_connected(ConnectionError())
    assert consumer.connection is None  # let go of, so the consumer's restart connects afresh
    assert "reconnecting anyway" in caplog.text
