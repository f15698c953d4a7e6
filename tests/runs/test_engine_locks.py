"""The engine's row locks against the read model's refresh, on two real database connections.

A unit writing cells locks its scenarios, then adds to the run's counters. A refresh writes the
run's row, inserts statistics rows pointing at scenarios, and checks those foreign keys as it
commits. Under ``FOR UPDATE`` that check waited for the unit's scenario locks while the unit
waited for the run's row: PostgreSQL's deadlock detector killed the unit, whose judge calls were
then made again (tests/runs/test_reliability.py caught it)."""

import threading
import time

import pytest
from django.db import connection, transaction

from runs.engine import read_model_refresh, run_create, run_start
from runs.engine.cells import run_counters_add, scenarios_locked
from runs.models import Run, RunMetrics, Scenario

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished_run(project, capitals, column_app, exact, celery_eager):
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    run_start(run=run)
    run.refresh_from_db()
    assert run.status == "success"
    # Statistics rows the refresh inserts again (an insert checks its foreign key; an update of
    # other columns does not).
    RunMetrics.objects.filter(run=run, scenario__isnull=False).delete()
    return run


def test_a_refresh_commits_while_a_unit_holds_its_scenarios_and_neither_deadlocks(finished_run):
    run, errors = finished_run, []

    def refresh() -> None:
        try:
            read_model_refresh(run_id=run.pk, rescan=True)
        except Exception as exc:  # named by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    scenario_ids = list(Scenario.objects.filter(run=run).values_list("pk", flat=True))
    with transaction.atomic():
        assert sorted(scenarios_locked(scenario_ids)) == sorted(scenario_ids)
        thread = threading.Thread(target=refresh)
        thread.start()
        waited = _until_done_or_waiting(thread)
        # What the unit does next: the run's counters, on the row the refresh wrote.
        run_counters_add(run_id=run.pk, done=0, errors=0)
    thread.join(60)
    assert not waited, "the refresh waited for the unit's scenario locks"
    assert not thread.is_alive() and not errors
    assert RunMetrics.objects.filter(run=run, scenario__isnull=False).count() == len(scenario_ids)
    assert Run.objects.get(pk=run.pk).metrics_refreshed_at is not None


def _until_done_or_waiting(thread: threading.Thread, seconds: float = 60) -> bool:
    """Whether another connection of this database waited on a lock before ``thread`` ended."""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while thread.is_alive() and time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # read the view afresh
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.02)
    return False
