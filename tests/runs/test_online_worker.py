"""Online evaluation through a real Celery worker process and a real Redis broker: a trace
POSTed to /api/v1/traces (in two requests) is evaluated once, a few seconds later."""

from __future__ import annotations

import time

import pytest

from evalsite.celery import app
from evaluators.services import evaluator_create
from runs.models import Annotation, Result, Scenario
from runs.online import online_rule_create
from tests.runs.test_online import child, root
from tests.runs.test_reliability import Broker, Workers, _wait

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def broker(tmp_path, monkeypatch):
    broker = Broker(tmp_path)
    # Celery reads CELERY_BROKER_URL from the environment before its configuration.
    monkeypatch.setenv("CELERY_BROKER_URL", broker.url)
    original = app.conf.broker_url
    app.conf.broker_url = broker.url
    app._pool = app.amqp._producer_pool = None  # publish to the test's broker from now on
    yield broker
    broker.stop()
    app.conf.broker_url = original
    app._pool = app.amqp._producer_pool = None


@pytest.fixture
def workers(broker, tmp_path):
    workers = Workers(broker, tmp_path)
    yield workers
    workers.stop_all()


def _dispatches_done(tmp_path) -> int:
    log = (tmp_path / "worker-0.log").read_text()
    return sum(
        1 for line in log.splitlines() if "ingest_online_dispatch" in line and "succeeded" in line
    )


def test_it_evaluates_a_posted_trace_on_a_running_worker(project, api, workers, settings, tmp_path):
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 1
    paris = evaluator_create(
        project=project, kind="regex", name="Says Paris", parameters={"pattern": "Paris"}
    )
    rule = online_rule_create(
        project=project, name="Capital QA", revision=paris.head, filter={"name": "capital_qa"}
    )
    workers.start()
    # The root and its child arrive in two requests, each of which queues a dispatch.
    assert api.post("/api/v1/traces", {"spans": [root("t-live")]}, format="json").status_code == 200
    assert (
        api.post("/api/v1/traces", {"spans": [child("t-live")]}, format="json").status_code == 200
    )
    assert not Annotation.objects.exists()  # not at once: a few seconds after the commit
    _wait(lambda: Annotation.objects.exists(), 60, "the worker to evaluate the trace")
    _wait(lambda: _dispatches_done(tmp_path) >= 2, 30, "both dispatches to run")
    time.sleep(0.5)
    annotation = Annotation.objects.get()
    assert annotation.trace.trace_id == "t-live" and annotation.outputs == {"success": True}
    assert Scenario.objects.filter(run=rule.run).count() == 1
    assert Result.objects.filter(run=rule.run).count() == 2
    assert Scenario.objects.get(run=rule.run).status == "success"
