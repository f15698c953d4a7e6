"""Operations on a run: cancel, retry what failed, add evaluators, close."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.text import slugify

from evalsite.errors import InvalidInput
from evaluators.models import EvaluatorRevision
from runs import metrics, queue
from runs.engine.cells import run_counters_add
from runs.engine.locks import run_check_open, run_locked
from runs.engine.progress import (
    read_model_refresh,
    run_final_status,
    run_is_logged,
    run_progress_update,
)
from runs.engine.steps import annotation_step, step_key_for_revision
from runs.engine.units import units_cancel, units_reset
from runs.models import (
    ACTIVE_RUN_STATUSES,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    RunStep,
    Scenario,
    ScenarioStatus,
)


@transaction.atomic
def run_cancel(*, run: Run) -> Run:
    """Stop a run: units not yet claimed never start (a unit in progress finishes what it
    computes), scenarios not started are marked cancelled."""
    now = timezone.now()
    if Run.objects.filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.CANCELLED, finished_at=now
    ):
        units_cancel(run_id=run.pk)
        run.scenarios.filter(status=ScenarioStatus.PENDING).update(
            status=ScenarioStatus.CANCELLED, updated_at=now
        )
    run.refresh_from_db()
    return run


@transaction.atomic
def run_retry_failed(*, run: Run) -> int:
    """Forget errored and skipped cells (and what depended on a failed invocation) and run them
    again. Returns how many cells will be recomputed."""
    run = run_locked(run)
    run_check_open(run)
    if run.is_active:
        raise InvalidInput({"run": ["Wait for the run to end (or cancel it) before retrying."]})
    failed = Result.objects.filter(
        run=run, status__in=(ResultStatus.ERROR, ResultStatus.SKIPPED, ResultStatus.CANCELLED)
    )
    scenario_ids = set(failed.values_list("scenario_id", flat=True))
    cancelled = set(
        run.scenarios.filter(status=ScenarioStatus.CANCELLED).values_list("pk", flat=True)
    )
    counts = failed.aggregate(
        done=Count("id"), errors=Count("id", filter=Q(status=ResultStatus.ERROR))
    )
    count = counts["done"]
    failed.delete()
    if count:
        run_counters_add(run_id=run.pk, done=-count, errors=-counts["errors"])
    scenario_ids |= cancelled
    if not scenario_ids:
        return 0
    Scenario.objects.filter(pk__in=scenario_ids).update(
        status=ScenarioStatus.PENDING, updated_at=timezone.now()
    )
    _requeue(run)
    return count


@transaction.atomic
def run_add_evaluators(*, run: Run, revisions: list[EvaluatorRevision]) -> Run:
    """Add annotation steps to a run; only the new cells are computed (outputs are reused)."""
    run = run_locked(run)
    run_check_open(run)
    if run.is_active:
        raise InvalidInput({"run": ["Wait for the run to end before adding evaluators."]})
    keys = set(run.steps.values_list("key", flat=True))
    new = [r for r in revisions if step_key_for_revision(r) not in keys]
    if any(r.project_id != run.project_id for r in new):
        raise InvalidInput({"evaluators": ["Every evaluator must belong to this project."]})
    if not new:
        raise InvalidInput({"evaluators": ["These evaluators are already in the run."]})
    position = run.steps.count()
    RunStep.objects.bulk_create([annotation_step(run, r, position + i) for i, r in enumerate(new)])
    run.total_cells += run.scenario_count * run.repeats * len(new)
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["total_cells", "mappings"])
    run.scenarios.update(status=ScenarioStatus.PENDING, updated_at=timezone.now())
    _requeue(run)
    return run


def _requeue(run: Run) -> None:
    units_reset(run_id=run.pk)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.QUEUED, finished_at=None, error=None, progressed_at=timezone.now()
    )
    queue.run_dispatch(run.pk)


@transaction.atomic
def run_close(*, run: Run) -> Run:
    """Close a run: read-only from now on. A logged (SDK) run ends here, with its metrics."""
    metrics.refresh_lock(run.pk)  # before the run's row, in the order every refresh takes them
    run = run_locked(run)
    logged = run_is_logged(run)
    if run.is_active and not logged:
        raise InvalidInput({"run": ["A running run cannot be closed; cancel it first."]})
    if run.is_active:
        run = run_progress_update(run_id=run.pk)
        Run.objects.filter(pk=run.pk).update(
            status=run_final_status(run), finished_at=timezone.now()
        )
        run.refresh_from_db()
        read_model_refresh(run_id=run.pk)
    Run.objects.filter(pk=run.pk).update(closed=True)
    run.refresh_from_db()
    return run


def run_slug_name(name: str) -> str:
    return slugify(name)[:100]
