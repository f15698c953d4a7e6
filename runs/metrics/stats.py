"""Statistics in SQL: run-wide, per scenario and per time bucket, stored in RunMetrics.

Run-wide statistics read each figure from where it is cheapest and still exact (docs/metrics.md,
"How they are computed"): cell counts and durations from the steps' results; numbers, booleans
and an application's duration, tokens and costs from the read model (``ScenarioValue``), which
holds one value per scenario, so one per cell while every scenario has a single cell of the step;
strings from the per-scenario rows, for the same reason; the rest (repeats, an LLM judge's own
tokens) from the cells. The per-scenario rows and the read model are written together."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from runs.metrics.mappings import mappings_refresh_deferred
from runs.metrics.schema import MetricSpec, jit_off, revision_outputs_schemas, schema_metrics
from runs.models import Run, RunMetrics, Scenario

PERCENTILES = (5, 25, 50, 75, 90, 95, 99)
HISTOGRAM_BINS = 10
FREQUENCIES = 50  # a categorical metric's most frequent values
REFRESH_BATCH = 5000  # scenarios per write of per-scenario statistics
REFRESH_LOCK = 0x52554E53  # advisory lock class of run-wide refreshes ("RUNS")
# Every step has these; a metric key of the same name is shadowed by them run-wide.
DEFAULT_METRICS = frozenset({"duration", "errors", "tokens", "costs"})
# What the read model holds of an invocation step, per scenario (over its successful cells).
INVOCATION_VALUES = ("duration", "tokens", "costs")

_PERCENTILES_SQL = "ARRAY[" + ",".join(str(p / 100) for p in PERCENTILES) + "]"


@dataclass(frozen=True)
class Scope:
    """The scenarios a statistic is restricted to (a time bucket): SQL selecting their ids."""

    sql: str
    params: tuple

    def where(self, column: str) -> tuple[str, list]:
        return f" AND {column} IN ({self.sql})", list(self.params)


def _scoped(scope: Scope | None, column: str) -> tuple[str, list]:
    return scope.where(column) if scope is not None else ("", [])


def step_specs(run, *, fresh: bool = False) -> dict[str, list[MetricSpec]]:
    """Metric keys per annotation step of a run."""
    return _specs_of(list(run.steps.filter(type="annotation").select_related("revision")), fresh)


def _specs_of(steps: list, fresh: bool) -> dict[str, list[MetricSpec]]:
    annotations = [s for s in steps if s.type == "annotation"]
    revisions = {s.revision_id: s.revision for s in annotations if s.revision is not None}
    schemas = revision_outputs_schemas(list(revisions.values()), fresh=fresh)
    return {
        s.key: schema_metrics(schemas[s.revision_id][0]) if s.revision_id else []
        for s in annotations
    }


def _value_sql(spec: MetricSpec) -> str:
    """A SQL expression for the metric's value in ``a.outputs``, NULL when of another type."""
    path = "{" + ",".join(_sql_ident(p) for p in spec.path) + "}"
    if spec.numeric:
        return f"CASE WHEN jsonb_typeof(a.outputs #> '{path}') = 'number' THEN (a.outputs #>> '{path}')::float8 END"
    if spec.type == "binary":
        return f"CASE WHEN jsonb_typeof(a.outputs #> '{path}') = 'boolean' THEN (a.outputs #>> '{path}')::boolean END"
    return f"a.outputs #>> '{path}'"


def _sql_ident(part: str) -> str:
    # Keys come from schemas users write. Inside a text[] literal inside a SQL string literal:
    # escape for the array syntax, then for the string literal, then for psycopg's placeholders.
    element = part.replace("\\", "\\\\").replace('"', '\\"')
    return ('"' + element + '"').replace("'", "''").replace("%", "%%")


def _valued(spec: MetricSpec) -> bool:
    """Numbers and booleans: the metrics the read model holds."""
    return spec.numeric or spec.type == "binary"


# --- run-wide -----------------------------------------------------------------------------------


@dataclass
class _Cells:
    """One step's cells: how many, errored, succeeded, the most repeats, mean duration."""

    cells: int = 0
    errors: int = 0
    successes: int = 0
    max_repeat: int = 0
    duration: float | None = None


def run_stats(
    run,
    *,
    specs: dict | None = None,
    steps: list[tuple[str, str]] | None = None,
    fresh: bool = False,
    scope: Scope | None = None,
) -> dict[str, dict]:
    """Statistics of every step of a run (optionally of some of its scenarios only); ``specs``
    and ``steps`` (key, type) when the caller has them already."""
    specs = step_specs(run, fresh=fresh) if specs is None else specs
    if steps is None:
        steps = list(run.steps.order_by("position", "id").values_list("key", "type"))
    measured = [k for k, t in steps if t in ("invocation", "annotation")]
    annotation_steps = [k for k, t in steps if t == "annotation"]
    data: dict[str, dict] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        jit_off(cursor)
        cells = _cells(cursor, run.pk, measured, scope)
        # One cell per scenario: the read model's value of a scenario is its cell's value.
        single = {k: c for k, c in cells.items() if c.cells and c.max_repeat == 0}
        wanted = [
            (k, key, "latency" if key == "duration" else "sum")
            for k, t in steps
            if t == "invocation" and k in single
            for key in INVOCATION_VALUES
        ] + [
            (k, s.key, "numeric" if s.numeric else "binary")
            for k in annotation_steps
            if k in single
            for s in specs.get(k, [])
            if _valued(s) and s.key not in DEFAULT_METRICS
        ]
        values = _read_model_values(cursor, run.pk, wanted, single, scope)
        texts = _per_scenario_text_stats(cursor, run.pk, specs, single, scope)
        judged = _judged_steps(cursor, run.pk, annotation_steps, scope)
        for key, kind in steps:
            found = cells.get(key, _Cells())
            if kind == "invocation":
                if all((key, v) in values for v in INVOCATION_VALUES):
                    data[key] = _invocation_stats(
                        found, *(values[(key, v)] for v in INVOCATION_VALUES)
                    )
                else:
                    data[key] = _invocation_step_stats(cursor, run.pk, key, scope)
            elif kind == "annotation":
                step_specs_ = specs.get(key, [])
                stats = {}
                for spec in step_specs_:
                    if (key, spec.key) in texts:
                        stats[spec.key] = texts[(key, spec.key)]
                    elif (key, spec.key) in values:
                        stats[spec.key] = _valued_stats(spec, values[(key, spec.key)], found.errors)
                # The step's own duration, errors, tokens and costs take the place of metrics
                # of those names: they need no reading.
                rest = [
                    s for s in step_specs_ if s.key not in stats and s.key not in DEFAULT_METRICS
                ]
                data[key] = _annotation_step_stats(
                    cursor, run.pk, key, step_specs_, rest, stats, found, key in judged, scope
                )
    return data


def _cells(cursor, run_id: int, steps: list[str], scope: Scope | None) -> dict[str, _Cells]:
    """Each step's cells from its results alone: how many, errored, succeeded, the most
    repeats, and the mean duration of the successful ones (an evaluator's own duration)."""
    if not steps:
        return {}
    where, params = _scoped(scope, "r.scenario_id")
    cursor.execute(
        f"""
        SELECT r.step_key, count(*), count(*) FILTER (WHERE r.status = 'error'),
               count(*) FILTER (WHERE r.status = 'success'), max(r.repeat_idx),
               avg(r.duration_ms) FILTER (WHERE r.status = 'success')
        FROM runs_result r
        WHERE r.run_id = %s AND r.step_key = ANY(%s){where}
        GROUP BY r.step_key
        """,
        [run_id, steps, *params],
    )
    return {row[0]: _Cells(*row[1:]) for row in cursor.fetchall()}


@dataclass
class _Values:
    """Aggregates of one metric's values in the read model (``held``: how many rows)."""

    held: int
    count: int
    total: float | None
    mean: float | None
    low: float | None
    high: float | None
    stdev: float | None
    percentiles: list | None
    true: int | None
    false: int | None
    bins: list | None


def _read_model_values(
    cursor, run_id: int, wanted: list, single: dict[str, _Cells], scope: Scope | None
) -> dict[tuple[str, str], _Values]:
    """Aggregates of each wanted (step, key, kind) metric over the read model, all in one
    statement, each from its own range of the index: a number's count, sum, mean, min, max,
    stdev, percentiles and histogram (its bounds read first, from the two ends of the range),
    a latency's mean, min, max and percentiles, a boolean's true and false counts, a sum's sum
    and mean. A metric the read model does not hold a row of for every cell of (scenarios not
    refreshed yet) is left out: the cells give it."""
    if not wanted:
        return {}
    where, scope_params = _scoped(scope, "scenario_id")
    rows = "FROM runs_scenariovalue WHERE run_id = %s AND step_key = %s AND key = %s" + where
    nothing = "NULL::float8, NULL::float8, NULL::float8, NULL::float8, NULL::float8, NULL::float8[]"
    parts, params = [], []
    for step_key, key, kind in wanted:
        cell = [run_id, step_key, key, *scope_params]
        if kind == "numeric":
            bins = ", ".join(
                f"count(*) FILTER (WHERE bin = {b})" for b in range(1, HISTOGRAM_BINS + 1)
            )
            parts.append(
                f"""SELECT %s, %s, count(*), count(value), sum(value), avg(value), min(value),
                       max(value), stddev_samp(value),
                       percentile_cont({_PERCENTILES_SQL}) WITHIN GROUP (ORDER BY value),
                       NULL::bigint, NULL::bigint, ARRAY[{bins}]
                FROM (
                    SELECT value, CASE WHEN value IS NOT NULL AND lo < hi
                                       THEN LEAST(width_bucket(value, lo, hi, {HISTOGRAM_BINS}),
                                                  {HISTOGRAM_BINS}) END AS bin
                    FROM (SELECT (SELECT value {rows} AND value IS NOT NULL
                                  ORDER BY value LIMIT 1) AS lo,
                                 (SELECT value {rows} AND value IS NOT NULL
                                  ORDER BY value DESC LIMIT 1) AS hi) bounds,
                         LATERAL (SELECT value {rows}) v
                    OFFSET 0
                ) binned"""
            )
            params += [step_key, key, *cell, *cell, *cell]
        elif kind == "latency":  # no stdev nor histogram
            parts.append(
                f"SELECT %s, %s, count(*), count(value), NULL::float8, avg(value), min(value), "
                f"max(value), NULL::float8, percentile_cont({_PERCENTILES_SQL}) WITHIN GROUP "
                f"(ORDER BY value), NULL::bigint, NULL::bigint, NULL::bigint[] {rows}"
            )
            params += [step_key, key, *cell]
        elif kind == "binary":
            parts.append(
                f"SELECT %s, %s, count(*), count(value), {nothing}, "
                f"count(*) FILTER (WHERE value = 1), count(*) FILTER (WHERE value = 0), NULL::bigint[] {rows}"
            )
            params += [step_key, key, *cell]
        else:
            parts.append(
                f"SELECT %s, %s, count(*), count(value), sum(value), avg(value), NULL::float8, "
                f"NULL::float8, NULL::float8, NULL::float8[], NULL::bigint, NULL::bigint, NULL::bigint[] {rows}"
            )
            params += [step_key, key, *cell]
    cursor.execute(" UNION ALL ".join(f"({p})" for p in parts), params)
    return {
        (row[0], row[1]): _Values(*row[2:])
        for row in cursor.fetchall()
        if row[2] == single[row[0]].cells
    }


def _valued_stats(spec: MetricSpec, found: _Values, errors: int) -> dict:
    if spec.type == "binary":
        return _binary(found.count, found.true, found.false, errors)
    stats = _numeric(
        spec,
        found.count,
        found.total,
        found.mean,
        found.low,
        found.high,
        found.stdev,
        found.percentiles,
        errors,
    )
    if found.count:
        stats["histogram"] = _bins(stats, list(enumerate(found.bins or [], start=1)))
    return stats


def _invocation_stats(cells: _Cells, duration: _Values, tokens: _Values, costs: _Values) -> dict:
    """An invocation step's statistics from the read model's values of its successful cells."""
    errors = cells.errors
    return {
        "duration": {
            "type": "continuous",
            "count": cells.successes,
            "mean": duration.mean,
            "min": duration.low,
            "max": duration.high,
            "errors": errors,
            "percentiles": {
                f"p{p}": v for p, v in zip(PERCENTILES, duration.percentiles or [], strict=False)
            },
        },
        "tokens": {
            "type": "continuous",
            "sum": tokens.total,
            "mean": tokens.mean,
            "errors": errors,
        },
        "costs": {"type": "continuous", "sum": costs.total, "mean": costs.mean, "errors": errors},
        "errors": {"type": "count", "count": errors},
    }


def _per_scenario_text_stats(
    cursor, run_id: int, specs: dict, single: dict[str, _Cells], scope: Scope | None
) -> dict[tuple[str, str], dict]:
    """Strings of the steps whose scenarios have one cell each, from the per-scenario rows
    (which hold that cell's text): a categorical metric's values counted in one read of the
    rows, with how many rows have the step and how many a value (window sums over the counted
    values); plain strings' counts in one more read. Left out unless every cell has its row."""
    wanted = [
        (k, s)
        for k in single
        for s in specs.get(k, [])
        if not _valued(s) and s.key not in DEFAULT_METRICS
    ]
    if not wanted:
        return {}
    where, scope_params = _scoped(scope, "scenario_id")
    rows = (
        "FROM runs_runmetrics WHERE run_id = %s AND scenario_id IS NOT NULL "
        f"AND bucket_start IS NULL{where}"
    )
    counted: dict[tuple[str, str], tuple] = {}
    categorical = [(k, s) for k, s in wanted if s.type == "categorical"]
    frequencies: dict[int, list] = {n: [] for n in range(len(categorical))}
    if categorical:
        parts, params = [], []
        for n, (step_key, spec) in enumerate(categorical):
            parts.append(
                f"""(SELECT {n}, value, count(*),
                       sum(count(*) FILTER (WHERE data ? %s)) OVER ()::bigint,
                       sum(count(value)) OVER ()::bigint
                FROM (SELECT data, data -> %s ->> %s AS value {rows}) per
                GROUP BY value ORDER BY value IS NULL, 3 DESC, value LIMIT {FREQUENCIES + 1})"""
            )
            params += [step_key, step_key, spec.key, run_id, *scope_params]
        cursor.execute(" UNION ALL ".join(parts), params)
        for n, value, count, held, total in cursor.fetchall():
            step_key, spec = categorical[n]
            counted[(step_key, spec.key)] = (held, total)
            if value is not None and len(frequencies[n]) < FREQUENCIES:
                frequencies[n].append({"value": value, "count": count})
    strings = [(k, s) for k, s in wanted if s.type != "categorical"]
    if strings:
        columns, params = [], []
        for step_key, spec in strings:
            columns.append("count(*) FILTER (WHERE data ? %s), count(data -> %s ->> %s)")
            params += [step_key, step_key, spec.key]
        cursor.execute(f"SELECT {', '.join(columns)} {rows}", [*params, run_id, *scope_params])
        row = cursor.fetchone()
        for n, (step_key, spec) in enumerate(strings):
            counted[(step_key, spec.key)] = row[2 * n : 2 * n + 2]
    found: dict[tuple[str, str], dict] = {}
    for step_key, spec in wanted:
        held, count = counted.get((step_key, spec.key), (0, 0))
        if held != single[step_key].cells:
            continue
        found[(step_key, spec.key)] = {
            "type": spec.type,
            "count": count,
            "errors": single[step_key].errors,
        }
        if spec.type == "categorical":
            found[(step_key, spec.key)]["frequencies"] = frequencies[
                categorical.index((step_key, spec))
            ]
    return found


def _judged_steps(cursor, run_id: int, steps: list[str], scope: Scope | None) -> set[str]:
    """Annotation steps with an LLM judge's own trace on some cell (its tokens and cost), read
    from the annotations that have one (through the index on ``judge_trace_id``): next to
    nothing for any other evaluator."""
    if not steps:
        return set()
    where, params = _scoped(scope, "r.scenario_id")
    cursor.execute(
        f"""
        SELECT DISTINCT r.step_key FROM runs_annotation a
        JOIN runs_result r ON r.annotation_id = a.id
        WHERE a.judge_trace_id IS NOT NULL AND r.run_id = %s AND r.step_key = ANY(%s){where}
        """,
        [run_id, steps, *params],
    )
    return {row[0] for row in cursor.fetchall()}


def _numeric(spec, count, total, mean, low, high, stdev, pcts, errors) -> dict:
    return {
        "type": spec.type,
        "count": count,
        "sum": total,
        "mean": mean,
        "min": low,
        "max": high,
        "stdev": stdev,
        "errors": errors,
        "percentiles": {f"p{p}": v for p, v in zip(PERCENTILES, pcts or [], strict=False)},
    }


def _binary(count, true, false, errors) -> dict:
    return {
        "type": "binary",
        "count": count,
        "true": true,
        "false": false,
        "rate": (true / count) if count else None,
        "errors": errors,
    }


def _aggregates(specs: list[MetricSpec]) -> list[str]:
    columns = []
    for i, spec in enumerate(specs):
        v = f"v{i}"
        if spec.numeric:
            columns += [
                f"count({v})",
                f"sum({v})",
                f"avg({v})",
                f"min({v})",
                f"max({v})",
                f"stddev_samp({v})",
                f"percentile_cont({_PERCENTILES_SQL}) WITHIN GROUP (ORDER BY {v})",
            ]
        elif spec.type == "binary":
            columns += [
                f"count({v})",
                f"count(*) FILTER (WHERE {v})",
                f"count(*) FILTER (WHERE NOT {v})",
            ]
        else:
            columns += [f"count({v})"]
    return columns


def _stats_from_row(specs: list[MetricSpec], row: list, errors: int) -> dict[str, dict]:
    stats: dict[str, dict] = {}
    for spec in specs:
        if spec.numeric:
            stats[spec.key] = _numeric(spec, *row[:7], errors)
            row = row[7:]
        elif spec.type == "binary":
            stats[spec.key] = _binary(*row[:3], errors)
            row = row[3:]
        else:
            stats[spec.key] = {"type": spec.type, "count": row[0], "errors": errors}
            row = row[1:]
    return stats


def _annotation_step_stats(
    cursor,
    run_id: int,
    step_key: str,
    specs: list[MetricSpec],
    rest: list[MetricSpec],
    stats: dict,
    cells: _Cells,
    judged: bool,
    scope: Scope | None,
) -> dict:
    """One annotation step: ``stats`` holds what the read model and per-scenario rows gave; the ``rest`` of
    its metrics (strings; everything when scenarios have repeats) and a judge's tokens come
    from the cells' annotations, read once into a materialised CTE."""
    tokens = cost = tokens_mean = cost_mean = None
    if (rest or judged) and cells.cells:
        tokens, tokens_mean, cost, cost_mean, computed = _cells_stats(
            cursor, run_id, step_key, rest, cells.errors, judged, scope
        )
        stats |= computed
    else:
        stats |= _stats_from_row(rest, _empty_row(rest), cells.errors)
        for spec in rest:
            if spec.type == "categorical":
                stats[spec.key]["frequencies"] = []
    stats = {s.key: stats.get(s.key) for s in specs}  # the schema's order
    errors = cells.errors
    stats["duration"] = {
        "type": "continuous",
        "mean": cells.duration,
        "count": cells.successes,
        "errors": errors,
    }
    stats["errors"] = {"type": "count", "count": errors}
    # An LLM judge's own calls: tokens and cost from its traces (none for other kinds).
    stats["tokens"] = {"type": "continuous", "sum": tokens, "mean": tokens_mean, "errors": errors}
    stats["costs"] = {"type": "continuous", "sum": cost, "mean": cost_mean, "errors": errors}
    return stats


def _empty_row(specs: list[MetricSpec]) -> list:
    """What the aggregates give over no cells."""
    row: list = []
    for spec in specs:
        if spec.numeric:
            row += [0, None, None, None, None, None, None]
        elif spec.type == "binary":
            row += [0, 0, 0]
        else:
            row += [0]
    return row


def _cells_stats(cursor, run_id, step_key, specs, errors, judged, scope) -> tuple:
    values = ", ".join(f"{_value_sql(s)} AS v{i}" for i, s in enumerate(specs)) or "NULL AS v0"
    judge = "LEFT JOIN runs_trace jt ON jt.id = a.judge_trace_id" if judged else ""
    judge_columns = "jt.tokens, jt.cost" if judged else "NULL::float8, NULL::float8"
    aggregates = [
        "sum(judge_tokens)",
        "avg(judge_tokens)",
        "sum(judge_cost)",
        "avg(judge_cost)",
        *_aggregates(specs),
    ]
    extras = []
    for i, spec in enumerate(specs):
        if spec.numeric:
            extras.append(
                f"""(SELECT json_agg(json_build_array(b, c)) FROM (
                      SELECT LEAST(width_bucket(v{i}, lo, hi, {HISTOGRAM_BINS}), {HISTOGRAM_BINS}) AS b, count(*) AS c
                      FROM vals, (SELECT min(v{i}) AS lo, max(v{i}) AS hi FROM vals) bounds
                      WHERE v{i} IS NOT NULL AND hi > lo GROUP BY 1) h)"""
            )
        elif spec.type == "categorical":
            extras.append(
                f"""(SELECT json_agg(json_build_array(v, c)) FROM (
                      SELECT v{i} AS v, count(*) AS c FROM vals WHERE v{i} IS NOT NULL
                      GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {FREQUENCIES}) f)"""
            )
        else:
            extras.append("NULL")
    where, params = _scoped(scope, "r.scenario_id")
    cursor.execute(
        f"""
        WITH vals AS MATERIALIZED (
            SELECT judge.*, {values}
            FROM runs_result r
            LEFT JOIN runs_annotation a ON a.id = r.annotation_id
            {judge}
            CROSS JOIN LATERAL (SELECT {judge_columns}) judge(judge_tokens, judge_cost)
            WHERE r.run_id = %s AND r.step_key = %s{where}
        )
        SELECT {", ".join(aggregates + extras)} FROM vals
        """,
        [run_id, step_key, *params],
    )
    row = list(cursor.fetchone())
    tokens, tokens_mean, cost, cost_mean = row[:4]
    stats = _stats_from_row(specs, row[4 : len(aggregates)], errors)
    for spec, extra in zip(specs, row[len(aggregates) :], strict=True):
        entry = stats[spec.key]
        if spec.numeric and entry["count"]:
            entry["histogram"] = _bins(entry, extra)
        elif spec.type == "categorical":
            entry["frequencies"] = [{"value": v, "count": c} for v, c in (extra or [])]
    return tokens, tokens_mean, cost, cost_mean, stats


def _bins(numeric: dict, counted: list | None) -> list[dict]:
    low, high = numeric["min"], numeric["max"]
    if low == high:
        return [{"start": low, "end": high, "count": numeric["count"]}]
    width = (high - low) / HISTOGRAM_BINS
    counts = {b: c for b, c in counted or []}
    return [
        {"start": low + (b - 1) * width, "end": low + b * width, "count": counts.get(b, 0)}
        for b in range(1, HISTOGRAM_BINS + 1)
    ]


def _invocation_step_stats(cursor, run_id: int, step_key: str, scope: Scope | None) -> dict:
    where, params = _scoped(scope, "r.scenario_id")
    ok = "FILTER (WHERE r.status = 'success')"
    cursor.execute(
        f"""
        SELECT count(*) FILTER (WHERE r.status = 'error'), count(*) {ok},
               avg(d) {ok}, min(d) {ok}, max(d) {ok},
               percentile_cont({_PERCENTILES_SQL}) WITHIN GROUP (ORDER BY d) {ok},
               sum(t.tokens) {ok}, avg(t.tokens) {ok}, sum(t.cost) {ok}, avg(t.cost) {ok}
        FROM runs_result r LEFT JOIN runs_trace t ON t.id = r.trace_id
        CROSS JOIN LATERAL (SELECT coalesce(t.duration_ms, r.duration_ms) AS d) duration
        WHERE r.run_id = %s AND r.step_key = %s{where}
        """,
        [run_id, step_key, *params],
    )
    errors, successes, mean, low, high, pcts, tokens, tokens_mean, cost, cost_mean = (
        cursor.fetchone()
    )
    return {
        "duration": {
            "type": "continuous",
            "count": successes,
            "mean": mean,
            "min": low,
            "max": high,
            "errors": errors,
            "percentiles": {f"p{p}": v for p, v in zip(PERCENTILES, pcts or [], strict=False)},
        },
        "tokens": {"type": "continuous", "sum": tokens, "mean": tokens_mean, "errors": errors},
        "costs": {"type": "continuous", "sum": cost, "mean": cost_mean, "errors": errors},
        "errors": {"type": "count", "count": errors},
    }


def refresh_lock(run_id: int) -> None:
    """Take the run's refresh lock until the transaction ends (again, if it holds it already).
    Whoever refreshes a run takes it before anything else of the run, its row included, so two
    refreshes (or a refresh and a run's end) wait for each other, never in a circle."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [REFRESH_LOCK, run_id])


@transaction.atomic
def run_refresh(*, run, scenario_ids: list[int] | None = None) -> dict:
    """Recompute and store the run-wide statistics (and buckets for online runs). Idempotent;
    concurrent refreshes of one run serialise on an advisory lock (not the run's row, which cell
    writes update) and the last one wins with the same answer.

    Schemas are inferred again first when outputs were added. When that (or an earlier
    inference, or a backfill) changed which keys are numbers or booleans since the read model
    was written, every scenario's values are written again before they are read."""
    refresh_lock(run.pk)
    steps = list(run.steps.select_related("revision").order_by("position", "id"))
    written = _specs_of(steps, fresh=False)  # what the per-scenario refreshes have been using
    specs = _specs_of(steps, fresh=True)
    prior = (
        RunMetrics.objects.filter(run=run, scenario=None, bucket_start=None)
        .values_list("data", flat=True)
        .first()
    )
    valued = _valued_types(specs)
    if valued != _valued_types(written) or (
        prior is not None and valued != _recorded_types(prior, specs)
    ):
        scenarios_refresh(run=run, scenario_ids=None)
    data = run_stats(run, specs=specs, steps=[(s.key, s.type) for s in steps])
    mappings_refresh_deferred(run)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_runmetrics (run_id, scenario_id, bucket_start, data, refreshed_at) "
            "VALUES (%s, NULL, NULL, %s, %s) ON CONFLICT (run_id, scenario_id, bucket_start) "
            "DO UPDATE SET data = EXCLUDED.data, refreshed_at = EXCLUDED.refreshed_at",
            [run.pk, json.dumps(data), now],
        )
    if run.is_online:
        buckets_refresh(run=run, scenario_ids=scenario_ids, specs=specs)
    Run.objects.filter(pk=run.pk).update(metrics_refreshed_at=now)
    return data


def _valued_types(specs: dict) -> set[tuple[str, str, bool]]:
    """(step, key, is a number) of the metrics the read model holds, defaults' names aside."""
    return {
        (step_key, s.key, s.numeric)
        for step_key, ss in specs.items()
        for s in ss
        if _valued(s) and s.key not in DEFAULT_METRICS
    }


def _recorded_types(data: dict, specs: dict) -> set[tuple[str, str, bool]]:
    """The same, as the last run-wide statistics recorded them (each metric has its type)."""
    return {
        (step_key, key, stats.get("type") != "binary")
        for step_key in specs
        for key, stats in (data.get(step_key) or {}).items()
        if key not in DEFAULT_METRICS
        and isinstance(stats, dict)
        and stats.get("type") in ("binary", "continuous", "discrete")
    }


# --- per scenario -------------------------------------------------------------------------------


def scenarios_refresh(*, run, scenario_ids: list[int] | None) -> None:
    """Per-scenario statistics and read-model values of the given scenarios of the run (all of
    them with None): each batch is one statement that reads every step's cells of its scenarios
    and writes both, all in one transaction."""
    if scenario_ids is not None:
        ids = sorted(
            Scenario.objects.filter(run=run, pk__in=scenario_ids).values_list("pk", flat=True)
        )
        if not ids:
            return
    elif not Scenario.objects.filter(run=run).exists():
        return
    mappings_refresh_deferred(run)
    steps = list(run.steps.filter(type__in=["annotation", "invocation"]).select_related("revision"))
    specs = _specs_of(steps, fresh=False)
    invocations = [s.key for s in steps if s.type == "invocation"]
    kept = _kept(specs, invocations)
    params = {
        "run": run.pk,
        "steps": [*specs, *invocations],
        "invocations": invocations,
        "now": timezone.now(),
        "kept_steps": [k for k, _ in kept],
        "kept_keys": [key for _, key in kept],
    }
    with transaction.atomic(), connection.cursor() as cursor:
        if scenario_ids is None:
            # The whole run in one statement: joined, grouped and sorted in memory.
            cursor.execute("SELECT set_config('work_mem', '64MB', true)")
            jit_off(cursor)
            _values_prune(cursor, run, kept)
            cursor.execute(
                _per_scenario_sql(specs, invocations, batch=False),
                {**params, "prune": False, "ids": []},
            )
        else:
            sql = _per_scenario_sql(specs, invocations, batch=True)
            for start in range(0, len(ids), REFRESH_BATCH):
                batch = ids[start : start + REFRESH_BATCH]
                cursor.execute(sql, {**params, "prune": True, "ids": batch})


def _per_scenario_sql(specs: dict, invocations: list[str], *, batch: bool) -> str:
    """One statement for the per-scenario rows and read-model values of the run's scenarios,
    or with ``batch`` of those in ``%(ids)s``. ``per`` has each scenario's aggregates: per annotation step how many cells,
    how many errored and each metric (the mean over repeats of a number, the rate of a
    boolean, one of the values of a string); per invocation step how many cells, how many
    errored and the mean duration, tokens and cost of its successful ones. From it: the
    per-scenario row ``{step: {"errors": n, key: value}}`` of the steps it has cells of, and one
    read-model row per number, boolean and invocation value. Rows that did not change are not
    written again; with ``prune``, these scenarios' rows of keys no longer held go."""
    aggregates, values, data, stored = ["s.id", "s.index"], [], [], []
    for n, (step_key, step_specs_) in enumerate(specs.items()):
        step, cells, errors = _sql_text(step_key), f"c{n}", f"e{n}"
        aggregates += [
            f"count(r.id) FILTER (WHERE r.step_key = {step}) AS {cells}",
            f"count(*) FILTER (WHERE r.step_key = {step} AND r.status = 'error') AS {errors}",
        ]
        pairs = [("'errors'", errors)]
        for i, spec in enumerate(step_specs_):
            v = f"s{n}v{i}"
            values.append(f"{_value_sql(spec)} AS {v}")
            if spec.numeric:
                aggregates.append(f"avg({v}) FILTER (WHERE r.step_key = {step}) AS {v}")
            elif spec.type == "binary":
                aggregates.append(
                    f"(avg({v}::int) FILTER (WHERE r.step_key = {step}))::float8 AS {v}"
                )
            else:
                aggregates.append(f"(array_agg({v}) FILTER (WHERE r.step_key = {step}))[1] AS {v}")
            pairs.append((_sql_text(spec.key), v))
            if _valued(spec):
                stored.append((step, _sql_text(spec.key), v, errors, cells))
        data.append(
            f"CASE WHEN {cells} > 0 THEN jsonb_build_object({step}, {_json_object(pairs)}) ELSE '{{}}'::jsonb END"
        )
    for n, step_key in enumerate(invocations):
        step, cells, errors = _sql_text(step_key), f"ic{n}", f"ie{n}"
        ok = f"FILTER (WHERE r.step_key = {step} AND r.status = 'success')"
        aggregates += [
            f"count(r.id) FILTER (WHERE r.step_key = {step}) AS {cells}",
            f"count(*) FILTER (WHERE r.step_key = {step} AND r.status = 'error') AS {errors}",
            f"avg(coalesce(t.duration_ms, r.duration_ms)) {ok} AS id{n}",
            f"avg(t.tokens) {ok} AS it{n}",
            f"avg(t.cost) {ok} AS ico{n}",
        ]
        pairs = [("'errors'", errors)]
        for key, column in zip(INVOCATION_VALUES, (f"id{n}", f"it{n}", f"ico{n}"), strict=True):
            pairs.append((_sql_text(key), column))
            stored.append((step, _sql_text(key), column, errors, cells))
        data.append(
            f"CASE WHEN {cells} > 0 THEN jsonb_build_object({step}, {_json_object(pairs)}) ELSE '{{}}'::jsonb END"
        )
    held = ", ".join(f"({step}, {key}, {v}, {e}, {c})" for step, key, v, e, c in stored)
    some = "AND s.id = ANY(%(ids)s)" if batch else ""
    return f"""
        WITH per AS MATERIALIZED (
            SELECT {", ".join(aggregates)}
            FROM runs_scenario s
            LEFT JOIN runs_result r ON r.scenario_id = s.id AND r.run_id = s.run_id
                                    AND r.step_key = ANY(%(steps)s)
            LEFT JOIN runs_annotation a ON a.id = r.annotation_id
            LEFT JOIN runs_trace t ON t.id = r.trace_id AND r.step_key = ANY(%(invocations)s)
            CROSS JOIN LATERAL (SELECT {", ".join(values) or "NULL AS v"}) vals
            WHERE s.run_id = %(run)s {some}
            GROUP BY s.id
        ), metrics AS (
            INSERT INTO runs_runmetrics (run_id, scenario_id, bucket_start, data, refreshed_at)
            SELECT %(run)s, id, NULL, {" || ".join(data) or "'{{}}'::jsonb"}, %(now)s
            FROM per ORDER BY id
            ON CONFLICT (run_id, scenario_id, bucket_start)
            DO UPDATE SET data = EXCLUDED.data, refreshed_at = EXCLUDED.refreshed_at
            WHERE runs_runmetrics.data IS DISTINCT FROM EXCLUDED.data
        ), gone AS (
            DELETE FROM runs_scenariovalue
            WHERE %(prune)s AND scenario_id = ANY(%(ids)s)  -- (only this run has these scenarios)
              AND (step_key, key) NOT IN
                  (SELECT * FROM unnest(%(kept_steps)s::text[], %(kept_keys)s::text[]))
        )
        INSERT INTO runs_scenariovalue (run_id, scenario_id, index, step_key, key, value, errors)
        SELECT %(run)s, per.id, per.index, v.step_key, v.key, v.value, v.errors
        FROM per
        CROSS JOIN LATERAL (VALUES {held or "(NULL::text, NULL::text, NULL::float8, 0, 0)"})
             AS v(step_key, key, value, errors, cells)
        WHERE v.cells > 0
        ORDER BY per.id
        ON CONFLICT (run_id, step_key, key, index)
        DO UPDATE SET value = EXCLUDED.value, errors = EXCLUDED.errors
        WHERE (runs_scenariovalue.value, runs_scenariovalue.errors)
              IS DISTINCT FROM (EXCLUDED.value, EXCLUDED.errors)
    """


def _json_object(pairs: list[tuple[str, str]]) -> str:
    """jsonb_build_object of (key SQL, value SQL) pairs; a function takes at most 100
    arguments, so a long list is built in parts and merged."""
    parts = [pairs[i : i + 40] for i in range(0, len(pairs), 40)]
    return " || ".join(
        "jsonb_build_object(" + ", ".join(f"{k}, {v}" for k, v in part) + ")" for part in parts
    )


def _sql_text(text: str) -> str:
    """A text literal for SQL run through psycopg (its placeholders' % doubled)."""
    return "'" + text.replace("'", "''").replace("%", "%%") + "'::text"


def _kept(specs: dict, invocations: list[str]) -> list[tuple[str, str]]:
    """The (step, key) pairs the read model holds for these steps."""
    return [(k, s.key) for k, ss in specs.items() for s in ss if _valued(s)] + [
        (k, key) for k in invocations for key in INVOCATION_VALUES
    ]


# The (step, key) pairs a run's read model holds, one index probe each (a loose index scan).
_VALUE_KEYS_SQL = """
WITH RECURSIVE pairs(step_key, key) AS (
    (SELECT step_key, key FROM runs_scenariovalue WHERE run_id = %(run)s
     ORDER BY step_key, key LIMIT 1)
  UNION ALL
    SELECT next.step_key, next.key FROM pairs, LATERAL (
        SELECT step_key, key FROM runs_scenariovalue
        WHERE run_id = %(run)s AND (step_key, key) > (pairs.step_key, pairs.key)
        ORDER BY step_key, key LIMIT 1) next
)
SELECT step_key, key FROM pairs
"""


def _values_prune(cursor, run, kept: list[tuple[str, str]]) -> None:
    """A whole run's read-model rows of keys its schemas no longer have as numbers or booleans."""
    kept = set(kept)
    cursor.execute(_VALUE_KEYS_SQL, {"run": run.pk})
    for step_key, key in cursor.fetchall():
        if (step_key, key) not in kept:
            cursor.execute(
                "DELETE FROM runs_scenariovalue WHERE run_id = %s AND step_key = %s AND key = %s",
                [run.pk, step_key, key],
            )


# --- time buckets -------------------------------------------------------------------------------

_BUCKETS_SQL = (
    "SELECT DISTINCT to_timestamp(floor(extract(epoch FROM created_at) / %s) * %s) "
    "FROM runs_scenario WHERE run_id = %s"
)
_BUCKET_SCENARIOS = (
    "SELECT id FROM runs_scenario WHERE run_id = %s AND created_at >= %s "
    "AND created_at < %s + make_interval(secs => %s)"
)


def buckets_refresh(
    *, run, scenario_ids: list[int] | None = None, specs: dict | None = None
) -> None:
    """Online runs: statistics per time bucket of the evaluated traces; with ``scenario_ids``
    only the buckets those scenarios fall in (not every bucket the run ever had)."""
    seconds = getattr(getattr(run, "online_rule", None), "bucket_seconds", 3600) or 3600
    sql, params = _BUCKETS_SQL, [seconds, seconds, run.pk]
    if scenario_ids is not None:
        sql, params = sql + " AND id = ANY(%s)", [*params, list(scenario_ids)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        starts = [row[0] for row in cursor.fetchall()]
    specs = step_specs(run) if specs is None else specs
    steps = list(run.steps.order_by("position", "id").values_list("key", "type"))
    now = timezone.now()
    for start in starts:
        scope = Scope(_BUCKET_SCENARIOS, (run.pk, start, start, seconds))
        data = run_stats(run, specs=specs, steps=steps, scope=scope)
        RunMetrics.objects.update_or_create(
            run=run, bucket_start=start, scenario=None, defaults={"data": data, "refreshed_at": now}
        )
