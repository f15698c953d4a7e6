"""Online evaluation through a real Celery worker process and a real Redis broker: a trace
POSTed to /api/v1/traces (in two requests) is evaluated once, a few seconds later."""

from __future__ import annotations

import pytest

from evaluators.services import evaluator_create
from runs.models import Annotation, Result, Scenario
from runs.online import online_rule_create
from runs.queue import online_dispatch_pending
from tests.runs.test_online import child, root
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _dispatches_settled(tmp_path, project) -> bool:
    """At least one dispatch ran, every one received has ended, and none waits in Redis."""
    lines = [
        line
        for line in (tmp_path / "worker-0.log").read_text().splitlines()
        if "ingest_online_dispatch" in line
    ]
    received = sum(
        "Task runs.tasks.ingest_online_dispatch[" in line and "received" in line for line in lines
    )
    ended = sum("succeeded" in line or "raised" in line for line in lines)
    return 0 < received == ended and not online_dispatch_pending(project.pk)


def test_it_evaluates_a_posted_trace_on_a_running_worker(project, api, workers, settings, tmp_path):
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 1
    paris = evaluator_create(
        project=project, kind="regex", name="Says Paris", parameters={"pattern": "Paris"}
    )
    rule = online_rule_create(
        project=project, name="Capital QA", revision=paris.head, filter={"name": "capital_qa"}
    )
    workers.start()
    # The root and its child arrive in two requests: the second rides along with the first's
    # dispatch, or queues its own if that one has started already.
    assert api.post("/api/v1/traces", {"spans": [root("t-live")]}, format="json").status_code == 200
    assert (
        api.post("/api/v1/traces", {"spans": [child("t-live")]}, format="json").status_code == 200
    )
    assert not Annotation.objects.exists()  # not at once: a few seconds after the commit
    wait_for(lambda: Annotation.objects.exists(), 60, "the worker to evaluate the trace")
    wait_for(lambda: _dispatches_settled(tmp_path, project), 30, "every dispatch to run")
    annotation = Annotation.objects.get()
    assert annotation.trace.trace_id == "t-live" and annotation.outputs == {"success": True}
    assert Scenario.objects.filter(run=rule.run).count() == 1
    assert Result.objects.filter(run=rule.run).count() == 2
    assert Scenario.objects.get(run=rule.run).status == "success"
