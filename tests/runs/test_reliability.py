"""The engine under failure, with real Celery worker processes and a real Redis broker, on the
DEFAULT lease, sweep and resend settings (nothing shrunk for the test): a worker killed with
SIGKILL mid-run, and a broker restarted (empty) mid-run. Either way the run completes within a
minute with every cell present exactly once and nothing written twice, and what was paid for
(application calls, model calls) before the kill is not paid for again."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_start
from runs.models import Annotation, Result, Run, Trace, WorkUnit
from tests.runs.factories import make_testset
from tests.servers import Reply
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROWS = 240


@pytest.fixture
def slow_app_run(project, http_server):
    # Each call takes a little while, so the run is surely mid-way when the trouble starts.
    http_server.handler = lambda request: Reply(
        200, {"outputs": request.json()["inputs"]["answer"]}, delay=0.03
    )
    version = make_testset(
        project, [{"q": i, "answer": str(i % 7), "correct_answer": str(i % 5)} for i in range(ROWS)]
    )
    app_ = application_create(
        project=project,
        name="Slow bot",
        kind="http",
        config={"url": http_server.url, "concurrency": 1, "retries": 0, "timeout_s": 5},
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    return run_create(project=project, testset_version=version, application=app_, revisions=[exact])


def _done_cells(run) -> int:
    return Result.objects.filter(run=run).count()


def _assert_complete_once(run: Run) -> None:
    run.refresh_from_db()
    assert run.status == "success", run.status
    assert run.done_cells == run.total_cells == ROWS * 3
    assert Result.objects.filter(run=run).count() == ROWS * 3  # one per cell (and unique by key)
    evaluated = Result.objects.filter(
        run=run, step_key="evaluator-exact-v1", status="success"
    ).count()
    assert Annotation.objects.filter(evaluator_slug="exact").count() == evaluated == ROWS
    assert not Annotation.objects.filter(results__isnull=True).exists()  # nothing written twice
    invoked = Result.objects.filter(
        run=run, step_key="application-slow-bot", trace__isnull=False
    ).count()
    assert Trace.objects.filter(source="invocation").count() == invoked == ROWS


def test_it_completes_a_run_when_a_worker_is_killed_mid_run(slow_app_run, workers):
    run = slow_app_run
    first = workers.start()
    run_start(run=run)
    wait_for(lambda: _done_cells(run) > ROWS // 3, 60, "the first cells")
    workers.kill(first)
    assert _done_cells(run) < ROWS * 3, "the run finished before the worker was killed"
    workers.start()
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status not in ("queued", "running"),
        120,
        "the run to end",
    )
    _assert_complete_once(run)


def test_it_completes_a_run_when_the_broker_restarts_empty_mid_run(
    slow_app_run, http_server, workers, broker
):
    run = slow_app_run
    # Application calls are held across the restart, so the worker loses the broker with tasks
    # in hand (unacknowledged), where Celery 5.7's own consumer could stop the worker for good
    # (evalsite/worker_consumer.py; tests/evalsite/test_worker_consumer.py makes that race).
    answer = http_server.handler
    held, release = threading.Event(), threading.Event()

    def handler(request):
        if len(http_server.requests) > ROWS // 3 and not release.is_set():
            held.set()
            release.wait(30)
        return answer(request)

    http_server.handler = handler
    worker = workers.start()
    run_start(run=run)
    wait_for(held.is_set, 60, "an application call held mid-run")
    broker.stop()  # every queued chunk is lost with it
    time.sleep(1)
    broker.start()
    time.sleep(2)  # the worker notices the lost connection while the call is still held
    release.set()
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status not in ("queued", "running"),
        120,
        "the run to end",
    )
    assert worker.poll() is None, "the worker stopped when it lost the broker"
    _assert_complete_once(run)


# A code evaluator that takes a while on one scenario: the kill lands while a worker computes it,
# after the unit's application calls were stored (the engine writes them before evaluating).
SLOW_ON_50 = (
    "import time\n"
    "def evaluate(inputs, outputs, trace):\n"
    "    if inputs['q'] == 50:\n"
    "        time.sleep(4)\n"
    "    return outputs == inputs['correct_answer']\n"
)


def test_it_finishes_within_a_minute_of_a_sigkill_and_pays_for_nothing_twice(
    project, http_server, llm_server, llm_connection, workers
):
    http_server.handler = lambda request: Reply(
        200, {"outputs": request.json()["inputs"]["answer"]}, delay=0.005
    )
    version = make_testset(
        project, [{"q": i, "answer": str(i % 7), "correct_answer": str(i % 5)} for i in range(ROWS)]
    )
    app_ = application_create(
        project=project,
        name="Slow bot",
        kind="http",
        config={"url": http_server.url, "concurrency": 2, "retries": 0, "timeout_s": 5},
    )
    revisions = [
        evaluator_create(project=project, kind="exact_match", name="Exact").head,
        evaluator_create(
            project=project, kind="code", name="Slow", parameters={"code": SLOW_ON_50}
        ).head,
        evaluator_create(
            project=project, kind="llm_judge", name="Judge", parameters={"connection": "local"}
        ).head,
    ]
    run = run_create(
        project=project, testset_version=version, application=app_, revisions=revisions
    )
    # The deployment the README shows: runs workers, and an llm worker that also runs beat.
    workers.start(queues=("llm", "default"), beat=True)
    # One process each: the killed worker is busy with scenario 50's unit and nothing else (a
    # call in flight in another process of it would be made again: at-least-once, in flight).
    for _ in range(2):
        workers.start(queues=("runs", "code", "ingest"), beat=False, concurrency=1)
    run_start(run=run)
    invoked_50 = Result.objects.filter(run=run, scenario__index=50, step_key="application-slow-bot")
    wait_for(invoked_50.exists, 60, "the invocation of scenario 50")
    unit = WorkUnit.objects.get(run=run, lane="runs", first__lte=50, last__gte=50)
    assert (
        unit.status == "leased"
        and not Result.objects.filter(
            run=run, scenario__index=50, step_key="evaluator-slow-v1"
        ).exists()
    ), "scenario 50 was evaluated before the kill"
    pid = int(unit.owner.split(":")[1])
    workers.kill(workers.holding(pid))
    killed_at = time.monotonic()
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status not in ("queued", "running"),
        90,
        "the run to end",
    )
    recovered_s = time.monotonic() - killed_at
    assert recovered_s < 60, f"the run ended {recovered_s:.1f} s after the kill"
    run.refresh_from_db()
    assert run.status == "success", run.status
    cells = ROWS * (2 + len(revisions))
    assert run.done_cells == run.total_cells == cells
    assert Result.objects.filter(run=run).count() == cells
    assert Annotation.objects.count() == ROWS * len(revisions)
    calls = Counter(r.json()["inputs"]["q"] for r in http_server.requests)
    assert set(calls) == set(range(ROWS)) and set(calls.values()) == {1}, (
        "an application call twice"
    )
    assert len(llm_server.calls) == ROWS, "a judge call made twice"
    assert WorkUnit.objects.get(pk=unit.pk).attempts == 2
