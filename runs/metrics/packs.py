"""A finished run's read model packed for comparisons (``ScenarioValuePack``): per step and metric
key, the scenarios' indexes and values as byte strings of big-endian numbers, which a comparison
reads as a few values in one statement and numpy takes as they are, instead of a row per scenario
and metric (at a million scenarios, reading two runs' rows is most of a comparison's first view).

Packed in one statement from ``ScenarioValue`` and the run's scenarios, on a worker after a
run-wide refresh (``runs.queue.values_pack``: the refresh and a request closing a logged run do
not wait for it), under the refresh's advisory lock, and stamped with its
``metrics_refreshed_at``: the packs hold at least what that refresh wrote, and a reader that finds
the run refreshed since (a backfill, a late cell, the *Refresh metrics* button) reads the rows
until the packing after that refresh. A pack of a stamp already packed is skipped, so a burst of
refreshes packs once; each refresh that moves the stamp packs again: ~0.9 s a 100,000
scenarios."""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from evalsite.models import Project
from runs.metrics.stats import REFRESH_LOCK
from runs.models import ACTIVE_RUN_STATUSES, Run, ScenarioValuePack

# Each group's rows come in index order from the unique index (run, step_key, key, index), and
# its aggregates take them in that one order: the indexes and the numbers line up (and ascend)
# with no sort (an ORDER BY inside each aggregate sorted each group again: 3x the time).
_PACK_SQL = """
INSERT INTO runs_scenariovaluepack
    (run_id, step_key, key, indexes, numbers, errored, refreshed_at)
SELECT %(run)s, step_key, key,
    string_agg(int4send(index), ''),
    string_agg(float8send(coalesce(value, 'NaN'::float8)), ''),
    coalesce(string_agg(int4send(index), '') FILTER (WHERE value IS NULL AND errors > 0), ''),
    %(stamp)s
FROM (SELECT step_key, key, index, value, errors FROM runs_scenariovalue
      WHERE run_id = %(run)s ORDER BY step_key, key, index) v
GROUP BY step_key, key
UNION ALL
SELECT %(run)s, '', '', coalesce(string_agg(int4send(index), ''), ''), '', '', %(stamp)s
FROM (SELECT index FROM runs_scenario WHERE run_id = %(run)s AND testcase_id IS NOT NULL
      ORDER BY index) s
"""


@transaction.atomic
def values_pack(*, run: Run) -> int:
    """Pack the run's read model as its last refresh left it (replacing older packs); how many
    packs were written, 0 when they already are of that refresh. A run still running is not
    packed and loses its packs: its read model moves with each cell, and packs would be stale
    before they were read."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [REFRESH_LOCK, run.pk])
        # The refresh the packs are of: under the lock, no run-wide refresh moves it before
        # they are written.
        stamp = (
            Run.objects.filter(pk=run.pk)
            .exclude(status__in=ACTIVE_RUN_STATUSES)
            .values_list("metrics_refreshed_at", flat=True)
            .first()
        )
        packed = ScenarioValuePack.objects.filter(run=run.pk, step_key="", key="")
        if stamp is not None and packed.filter(refreshed_at=stamp).exists():
            return 0  # another task packed this refresh already
        cursor.execute("DELETE FROM runs_scenariovaluepack WHERE run_id = %s", [run.pk])
        if stamp is None:  # running, or never refreshed: nothing to pack
            return 0
        cursor.execute(_PACK_SQL, {"run": run.pk, "stamp": stamp})
        return cursor.rowcount


def runs_unpacked(*, project: Project | None = None) -> QuerySet[Run]:
    """Finished, refreshed runs without packs of their last refresh (runs that finished before
    packs existed, say): what ``manage.py values_pack`` packs."""
    current = ScenarioValuePack.objects.filter(
        run=OuterRef("pk"), step_key="", key="", refreshed_at=OuterRef("metrics_refreshed_at")
    )
    runs = (
        Run.objects.exclude(status__in=ACTIVE_RUN_STATUSES)
        .filter(metrics_refreshed_at__isnull=False)
        .exclude(Exists(current))
        .order_by("pk")
    )
    return runs.filter(project=project) if project else runs
