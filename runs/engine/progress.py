"""Progress and the end of a run."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from runs import metrics, queue
from runs.models import (
    FINAL_RESULT_STATUSES,
    Application,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    StepType,
)

logger = logging.getLogger(__name__)


def run_progress_update(*, run_id: int) -> Run:
    """Recount a run's cells (logged runs, whose cells the client may log again in any order)
    and end a computed run when every cell is final. The engine itself never recounts: its
    writes add to the counters as they go."""
    counts = Result.objects.filter(run_id=run_id).aggregate(
        done=Count("id", filter=Q(status__in=FINAL_RESULT_STATUSES)),
        errors=Count("id", filter=Q(status=ResultStatus.ERROR)),
    )
    Run.objects.filter(pk=run_id).update(
        done_cells=counts["done"], error_cells=counts["errors"], progressed_at=timezone.now()
    )
    return run_finish_if_complete(run_id=run_id)


def run_finish_if_complete(*, run_id: int) -> Run:
    run = Run.objects.select_related("application").get(pk=run_id)
    if (
        run.status == RunStatus.RUNNING
        and not run_is_logged(run)
        and not run.is_online
        and run.total_cells
        and run.done_cells >= run.total_cells
    ):
        run_finish(run=run)
    return run


def run_is_logged(run: Run) -> bool:
    """A run whose cells the client logs ends when the client closes it, never on its own."""
    return run.application is None or run.application.kind == Application.Kind.LOGGED


def run_final_status(run: Run) -> str:
    """success; errors when some cells failed; failure when nothing but the inputs succeeded."""
    if not run.error_cells:
        return RunStatus.SUCCESS
    succeeded = Result.objects.filter(run=run, status=ResultStatus.SUCCESS).exclude(
        step_key__in=run.steps.filter(type=StepType.INPUT).values("key")
    )
    return RunStatus.ERRORS if succeeded.exists() else RunStatus.FAILURE


def run_finish(*, run: Run, rescan: bool = False, refresh: bool = True) -> bool:
    """End a computed run whose every cell is final: its statistics are refreshed and its status
    set in one transaction, so a reader who sees the run ended reads its final figures (status
    first, then the refresh, left a gap a polling client landed in). The refresh lock comes
    first, before the dirty scenarios are taken and before the run's row: a debounced refresh
    still writing finishes (and commits) before, and nobody waits in a circle. Two workers
    ending one run at once both refresh; one of them ends it. ``rescan`` refreshes every
    scenario (the sweeper's: the dirty set went with the transaction that failed); without
    ``refresh`` the run ends with the figures it has and a refresh is queued. Returns whether
    this call ended the run."""
    status = run_final_status(run)
    with transaction.atomic():
        if refresh:
            metrics.refresh_lock(run.pk)
            dirty = None if rescan else queue.read_model_refresh_started(run.pk)
            _statistics_refresh(run, dirty)
            queue.values_pack(run.pk)  # on commit: this refresh's packs, whoever ended the run
        if not Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=status, finished_at=timezone.now()
        ):
            return False
        run.status = status
        if not refresh:
            queue.read_model_refresh_now(run.pk)
        queue.run_finished(run.pk)  # on commit: what rests on a finished run: alignments, records
    return True


# A run whose every cell is final still running this long after its last cell: its worker died
# between that cell's commit and the end of the run, or the end's refresh failed and rolled back.
UNFINISHED_GRACE = timedelta(minutes=1)
UNFINISHED_LIMIT = 20  # runs ended per sweep: each refreshes all its scenarios


def runs_unfinished_finish() -> list[int]:
    """Sweeper: end computed runs whose every cell is final but which nobody ended; the ids of
    those this call ended. One whose refresh fails here too ends with the figures it has (and a
    refresh queued) rather than never, and never stops the sweep of the others."""
    stale = Run.objects.filter(
        status=RunStatus.RUNNING,
        is_online=False,
        total_cells__gt=0,
        done_cells__gte=F("total_cells"),
        progressed_at__lt=timezone.now() - UNFINISHED_GRACE,
        application__isnull=False,
    ).exclude(application__kind=Application.Kind.LOGGED)
    ended = []
    for run in stale.select_related("application").order_by("pk")[:UNFINISHED_LIMIT]:
        try:
            finished = run_finish(run=run, rescan=True)
        except Exception:
            logger.exception("run %s: its final refresh failed again; ending it without", run.pk)
            finished = run_finish(run=run, refresh=False)
        if finished:
            ended.append(run.pk)
    return ended


def read_model_refresh(*, run_id: int, rescan: bool = False) -> None:
    """Bring a run's read model up to date: per-scenario statistics of the scenarios whose cells
    landed since the last refresh, then the run-wide statistics, mappings and inferred schemas,
    then (a finished run's) the packs comparisons read, queued: packing is the slowest part and
    nothing waits for it. One transaction under the run's refresh lock, taken before the dirty
    set (so a run's end, which takes it too, never reads around a refresh still writing). Runs
    on Celery (debounced after writes) and when a logged run is closed; a computed run's end
    refreshes in the transaction that ends it (``run_finish``). ``rescan`` refreshes every
    scenario."""
    with transaction.atomic():
        metrics.refresh_lock(run_id)
        dirty = queue.read_model_refresh_started(run_id)
        dirty = None if rescan else dirty
        run = Run.objects.select_related("application", "testset_version").get(pk=run_id)
        _statistics_refresh(run, dirty)
        if not run.is_active:
            queue.values_pack(run.pk)


def _statistics_refresh(run: Run, dirty: list[int] | None) -> None:
    metrics.scenarios_refresh(run=run, scenario_ids=dirty)
    metrics.run_refresh(run=run, scenario_ids=dirty)


# A pack task queued after a refresh normally lands within seconds; a run still without packs
# of its last refresh this long after it lost its task (a broker that dropped the message, a
# task out of retries) or finished before packs existed.
PACK_GRACE = timedelta(minutes=2)
PACK_SWEEP_LIMIT = 20  # runs queued per sweep: packing a large run takes seconds of a worker


def read_model_packs_sweep() -> int:
    """Beat: queue packing for finished runs whose packs are not of their last refresh, a few
    at a time, oldest first; how many were queued. Two beats at once queue a run twice, and the
    second task finds it packed."""
    stale = metrics.runs_unpacked().filter(metrics_refreshed_at__lt=timezone.now() - PACK_GRACE)
    run_ids = list(stale.values_list("pk", flat=True)[:PACK_SWEEP_LIMIT])
    for run_id in run_ids:
        queue.values_pack(run_id)
    return len(run_ids)


def read_model_pack(*, run_id: int) -> int:
    """Pack a finished run's read model as its last refresh left it (a running run's packs are
    dropped); how many packs were written (0 when they already were of that refresh)."""
    return metrics.values_pack(run=Run(pk=run_id))


def run_metrics_refresh_request(*, run: Run) -> None:
    """Someone asked for fresh statistics (a button, the API): a refresh on Celery, at once."""
    queue.read_model_refresh(run.pk)


def run_is_online(*, run_id: int) -> bool:
    return Run.objects.filter(pk=run_id, is_online=True).exists()
