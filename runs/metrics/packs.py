"""A finished run's read model packed for comparisons (``ScenarioValuePack``): per step and metric
key, the scenarios' indexes and values as byte strings of big-endian numbers, which a comparison
reads as a few values in one statement and numpy takes as they are, instead of a row per scenario
and metric (at a million scenarios, reading two runs' rows is most of a comparison's first view).

Each pack takes the narrowest shape that gives back the same doubles (``pack_encode``), since
moving the bytes out of PostgreSQL is most of what reading them costs: no indexes when they are
0 to n - 1 (a testset's rows), and values as integers of 1, 2 or 4 bytes holding
``value * 10 ** scale`` when every value comes back from ``integer / 10 ** scale`` (one IEEE
division: the double nearest the decimal, as parsing it gives) as the very same double; else
float8. A pass/fail metric takes 1 byte a scenario, a 1-5 grade 1, a score of four decimals 2,
latencies in ms 2 or 4; a similarity of arbitrary doubles stays 8.

Read in one statement from ``ScenarioValue`` and the run's scenarios and shaped by numpy, on a
worker after a run-wide refresh (``runs.queue.values_pack``: the refresh and a request closing a
logged run do not wait for it), under the refresh's advisory lock, and stamped with its
``metrics_refreshed_at``: the packs hold at least what that refresh wrote, and a reader that finds
the run refreshed since (a backfill, a late cell, the *Refresh metrics* button) reads the rows
until the packing after that refresh. A pack of a stamp already packed is skipped; a task that
runs after a later refresh packs that one: 0.5-1.2 s a 100,000 scenarios. A beat sweep
(``engine.read_model_packs_sweep``) queues packing again for a finished run whose task was lost.
A running run's refresh does not pack it; its old packs stay, unread (its stamp moved on), until
it finishes and is packed again."""

from __future__ import annotations

import numpy as np
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from evalsite.models import Project
from runs.metrics.stats import REFRESH_LOCK
from runs.models import ACTIVE_RUN_STATUSES, Run, ScenarioValuePack

# Each group's rows come in index order from the unique index (run, step_key, key, index), and
# its aggregates take them in that one order: the indexes and the numbers line up (and ascend)
# with no sort (an ORDER BY inside each aggregate sorted each group again: 3x the time).
_ROWS_SQL = """
SELECT step_key, key,
    coalesce(string_agg(int4send(index), ''), ''),
    coalesce(string_agg(float8send(coalesce(value, 'NaN'::float8)), ''), ''),
    coalesce(string_agg(int4send(index), '') FILTER (WHERE value IS NULL AND errors > 0), '')
FROM (SELECT step_key, key, index, value, errors FROM runs_scenariovalue
      WHERE run_id = %(run)s ORDER BY step_key, key, index) v
GROUP BY step_key, key
UNION ALL
SELECT '', '', coalesce(string_agg(int4send(index), ''), ''), '', ''
FROM (SELECT index FROM runs_scenario WHERE run_id = %(run)s AND testcase_id IS NOT NULL
      ORDER BY index) s
"""
_INSERT_SQL = (
    "INSERT INTO runs_scenariovaluepack (run_id, step_key, key, count, indexes, numbers, dtype,"
    " scale, errored, refreshed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
INDEX = np.dtype(">i4")
FLOAT = np.dtype(">f8")
INTEGERS = {"i1": np.dtype(">i1"), "i2": np.dtype(">i2"), "i4": np.dtype(">i4")}
DTYPES = {"f8": FLOAT, **INTEGERS}
MAX_SCALE = 9  # 10 ** 9 and every integer of 4 bytes are exact doubles


def pack_encode(values: np.ndarray) -> tuple[str, int, bytes]:
    """``values`` (float64, NaN without one) in their narrowest exact shape: (dtype, scale,
    bytes). Integers when ``round(v * 10 ** scale) / 10 ** scale == v`` for every value at the
    least such scale (NaN as the type's least integer), else float8."""
    valued = values[~np.isnan(values)]
    if np.signbit(valued[valued == 0]).any():  # -0.0: no integer gives it back
        return "f8", 0, values.astype(FLOAT).tobytes()
    sample = valued[:1024]  # most scales fail on the first values: no pass over all of them
    for scale in range(MAX_SCALE + 1):
        factor = float(10**scale)
        with np.errstate(over="ignore", invalid="ignore"):
            if not np.array_equal(np.rint(sample * factor) / factor, sample):
                continue
            scaled = np.rint(valued * factor)
            if np.all(np.abs(scaled) < 2**31 - 1) and np.array_equal(scaled / factor, valued):
                break
    else:
        return "f8", 0, values.astype(FLOAT).tobytes()
    low, high = (scaled.min(), scaled.max()) if len(scaled) else (0, 0)
    name, dtype = next(
        (n, d) for n, d in INTEGERS.items() if np.iinfo(d).min < low and high <= np.iinfo(d).max
    )
    ints = np.full(len(values), np.iinfo(dtype).min, dtype=dtype)
    ints[~np.isnan(values)] = scaled
    return name, scale, ints.tobytes()


def pack_decode(dtype: str, scale: int, data, offset: int = 0, length: int | None = None):
    """The float64 values ``pack_encode`` packed (from ``data[offset:offset + length]``)."""
    kind = DTYPES[dtype]
    count = (len(data) - offset if length is None else length) // kind.itemsize
    raw = np.frombuffer(data, dtype=kind, count=count, offset=offset)
    if dtype == "f8":
        return raw.astype(np.float64)
    values = raw.astype(np.float64)
    if scale:
        values /= float(10**scale)
    values[raw == np.iinfo(kind).min] = np.nan
    return values


def indexes_encode(indexes: bytes) -> tuple[int, bytes]:
    """(count, bytes) of ascending int4 indexes: no bytes when they are 0 to count - 1."""
    found = np.frombuffer(indexes, dtype=INDEX)
    dense = len(found) and found[0] == 0 and found[-1] == len(found) - 1
    return len(found), b"" if dense else indexes


def indexes_decode(count: int, data, offset: int = 0, length: int | None = None):
    """The indexes ``indexes_encode`` packed (from ``data[offset:offset + length]``) as a native
    array; no bytes and a ``count``: ``range(count)``, which a reader lays out without an array
    of indexes."""
    length = len(data) - offset if length is None else length
    if length <= 0:
        return range(count) if count else np.empty(0, dtype=np.int32)
    return np.frombuffer(data, dtype=INDEX, count=length // 4, offset=offset).astype(np.int32)


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
        cursor.execute(_ROWS_SQL, {"run": run.pk})
        rows = cursor.fetchall()
        packs = []
        for step_key, key, indexes, numbers, errored in rows:
            count, indexes = indexes_encode(bytes(indexes))
            dtype, scale, numbers = pack_encode(np.frombuffer(numbers, dtype=FLOAT))
            row = [run.pk, step_key, key, count, indexes, numbers, dtype, scale, bytes(errored)]
            packs.append([*row, stamp])
        cursor.executemany(_INSERT_SQL, packs)
        return len(packs)


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
