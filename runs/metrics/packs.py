"""A finished run's read model packed for comparisons (``ScenarioValuePack``): per step and metric
key, the scenarios' indexes and values as byte strings of big-endian numbers, which a comparison
reads as a few values in one statement and numpy takes as they are, instead of a row per scenario
and metric (at a million scenarios, reading two runs' rows is most of a comparison's first view).

Packed in one statement from ``ScenarioValue`` and the run's scenarios, under the run-wide
refresh's lock and stamped with its ``metrics_refreshed_at``: a pack is of exactly one refresh,
and a reader that finds the run refreshed since (a backfill, a late cell) reads the rows."""

from __future__ import annotations

from django.db import connection, transaction

from runs.metrics.stats import REFRESH_LOCK
from runs.models import ACTIVE_RUN_STATUSES, Run

_PACK_SQL = """
INSERT INTO runs_scenariovaluepack
    (run_id, step_key, key, indexes, numbers, errored, refreshed_at)
SELECT %(run)s, step_key, key,
    string_agg(int4send(index), '' ORDER BY index),
    string_agg(float8send(coalesce(value, 'NaN'::float8)), '' ORDER BY index),
    coalesce(string_agg(int4send(index), '' ORDER BY index)
        FILTER (WHERE value IS NULL AND errors > 0), ''),
    r.metrics_refreshed_at
FROM runs_scenariovalue, (SELECT metrics_refreshed_at FROM runs_run WHERE id = %(run)s) r
WHERE run_id = %(run)s AND r.metrics_refreshed_at IS NOT NULL
GROUP BY step_key, key, r.metrics_refreshed_at
UNION ALL
SELECT %(run)s, '', '', coalesce(string_agg(int4send(index), '' ORDER BY index), ''), '', '',
    r.metrics_refreshed_at
FROM (SELECT metrics_refreshed_at FROM runs_run WHERE id = %(run)s) r
LEFT JOIN runs_scenario s ON s.run_id = %(run)s AND s.testcase_id IS NOT NULL
WHERE r.metrics_refreshed_at IS NOT NULL
GROUP BY r.metrics_refreshed_at
"""


@transaction.atomic
def values_pack(*, run: Run) -> int:
    """Pack the run's read model as its last refresh left it (replacing older packs); how many
    packs were written. A run still running is not packed: its read model moves with each
    cell, and its packs would be stale before they were read."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [REFRESH_LOCK, run.pk])
        cursor.execute("DELETE FROM runs_scenariovaluepack WHERE run_id = %s", [run.pk])
        if Run.objects.filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES).exists():
            return 0
        cursor.execute(_PACK_SQL, {"run": run.pk})
        return cursor.rowcount
