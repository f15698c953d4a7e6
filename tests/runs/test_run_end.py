"""The end of a computed run. Its final figures commit with its status, so a client that polls
the status and then reads the metrics never reads the figures of before the last cells. A run
whose every cell is final but which nobody ended (the end's refresh failed, or its worker died
after the last cell) is ended by the sweeper. Workers are threads with their own database
connections; the run's messages go to the test's own broker, where nobody takes them."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import redis
from django.db import OperationalError, connection
from django.utils import timezone

from runs.engine import (
    read_model_refresh,
    run_create,
    run_dispatch,
    run_start,
    unit_work,
    units_sweep,
)
from runs.metrics.stats import REFRESH_LOCK
from runs.models import Result, Run, RunMetrics

pytestmark = pytest.mark.django_db(transaction=True)

EXACT = "evaluator-exact-v1"


def run_wide(run: Run) -> dict | None:
    return (
        RunMetrics.objects.filter(run=run, scenario=None, bucket_start=None)
        .values_list("data", flat=True)
        .first()
    )


def in_thread(target, errors: list) -> threading.Thread:
    def work():
        try:
            target()
        except Exception as exc:  # surfaced by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def wait_for_refresh_lock_waiter(run: Run) -> None:
    """Until another session waits for the run's refresh lock (a guard against a hang, not a
    timing: the worker gets there in milliseconds)."""
    deadline = time.monotonic() + 60
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid = %s AND objid = %s",
                [REFRESH_LOCK, run.pk],
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the worker never reached the run's refresh")


@pytest.fixture
def started(project, capitals, column_app, exact, broker):
    """A run of four scenarios, started and planned in one unit no worker has taken yet."""
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    run_start(run=run)
    assert run_dispatch(run_id=run.pk) == 1
    return run


def test_a_client_that_sees_the_run_ended_reads_its_final_figures(started):
    run = started
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [REFRESH_LOCK, run.pk])
    errors: list = []
    worker = in_thread(lambda: unit_work(run_id=run.pk, lane="runs", heartbeat=False), errors)
    try:
        wait_for_refresh_lock_waiter(run)
        # Every cell is written; the worker is in the end's refresh. A reader still sees a
        # running run (whose figures trail it), not an ended run with figures of before.
        assert Result.objects.filter(run=run).count() == run.total_cells
        assert Run.objects.get(pk=run.pk).status == "running"
        assert run_wide(run) is None
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [REFRESH_LOCK, run.pk])
        worker.join()

    assert errors == []
    run.refresh_from_db()
    assert run.status == "success" and run.finished_at is not None
    assert run_wide(run)[EXACT]["success"]["count"] == 4


def test_a_failed_end_leaves_the_run_running_and_the_sweeper_ends_it(started):
    run = started
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [REFRESH_LOCK, run.pk])

    def work():
        with connection.cursor() as cursor:  # this worker's refresh gives up on the lock
            cursor.execute("SET lock_timeout = '200ms'")
        unit_work(run_id=run.pk, lane="runs", heartbeat=False)

    errors: list = []
    in_thread(work, errors).join()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [REFRESH_LOCK, run.pk])

    assert len(errors) == 1 and isinstance(errors[0], OperationalError)
    run.refresh_from_db()
    assert (run.done_cells, run.total_cells) == (12, 12)
    assert run.status == "running" and run.finished_at is None  # not ended with stale figures
    assert run_wide(run) is None

    assert units_sweep()["finished"] == 0  # within the grace, the worker may still end it
    Run.objects.filter(pk=run.pk).update(progressed_at=timezone.now() - timedelta(minutes=2))
    assert units_sweep()["finished"] == 1

    run.refresh_from_db()
    assert run.status == "success" and run.finished_at is not None
    assert run_wide(run)[EXACT]["success"]["count"] == 4
    assert units_sweep()["finished"] == 0


def queued_tasks(broker) -> list[str]:
    """The names of the tasks waiting on the test broker's ``runs`` queue."""
    messages = redis.Redis.from_url(broker.url).lrange("runs", 0, -1)
    return [json.loads(message)["headers"]["task"] for message in messages]


def test_a_run_whose_refresh_keeps_failing_still_ends_and_queues_a_refresh(started, broker):
    run = started
    with connection.cursor() as cursor:  # every refresh of this run gives up on the lock
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [REFRESH_LOCK, run.pk])

    def impatient(work):
        def run_it():
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '200ms'")
            work()

        return run_it

    errors: list = []
    in_thread(
        impatient(lambda: unit_work(run_id=run.pk, lane="runs", heartbeat=False)), errors
    ).join()
    Run.objects.filter(pk=run.pk).update(progressed_at=timezone.now() - timedelta(minutes=2))
    swept: list = []
    in_thread(impatient(lambda: swept.append(units_sweep())), errors).join()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [REFRESH_LOCK, run.pk])

    assert len(errors) == 1 and isinstance(errors[0], OperationalError)  # the worker's
    assert swept[0]["finished"] == 1
    run.refresh_from_db()
    assert run.status == "success" and run.finished_at is not None
    assert run_wide(run) is None  # ended with the figures it had: none yet
    # A refresh is on its way and the run's end was announced. Run the refresh as its task would.
    tasks = queued_tasks(broker)
    assert "runs.tasks.run_read_model_refresh" in tasks and "runs.tasks.run_finished" in tasks
    read_model_refresh(run_id=run.pk, rescan=True)
    assert run_wide(run)[EXACT]["success"]["count"] == 4
    assert RunMetrics.objects.filter(run=run, scenario__isnull=False).count() == 4
