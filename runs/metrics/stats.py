"""Statistics in SQL: run-wide, per scenario and per time bucket, stored in RunMetrics."""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.utils import timezone

from runs.metrics.mappings import mappings_refresh_deferred
from runs.metrics.schema import MetricSpec, revision_outputs_schema, schema_metrics
from runs.models import Run, RunMetrics, Scenario

PERCENTILES = (5, 25, 50, 75, 90, 95, 99)
HISTOGRAM_BINS = 10
REFRESH_BATCH = 5000  # scenarios per per-scenario statement
REFRESH_LOCK = 0x52554E53  # advisory lock class of run-wide refreshes ("RUNS")


def step_specs(run, *, fresh: bool = False) -> dict[str, list[MetricSpec]]:
    """Metric keys per annotation step of a run."""
    specs: dict[str, list[MetricSpec]] = {}
    for step in run.steps.filter(type="annotation").select_related("revision"):
        schema, _ = revision_outputs_schema(step.revision, fresh=fresh)
        specs[step.key] = schema_metrics(schema)
    return specs


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


def _aggregates(specs: list[MetricSpec]) -> list[str]:
    columns = []
    percentiles = ",".join(str(p / 100) for p in PERCENTILES)
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
                f"percentile_cont(ARRAY[{percentiles}]) WITHIN GROUP (ORDER BY {v})",
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
            count, total, mean, low, high, stdev, pcts = row[:7]
            row = row[7:]
            stats[spec.key] = {
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
        elif spec.type == "binary":
            count, true, false = row[:3]
            row = row[3:]
            stats[spec.key] = {
                "type": "binary",
                "count": count,
                "true": true,
                "false": false,
                "rate": (true / count) if count else None,
                "errors": errors,
            }
        else:
            stats[spec.key] = {"type": spec.type, "count": row[0], "errors": errors}
            row = row[1:]
    return stats


def _annotation_step_stats(
    run_id: int, step_key: str, specs: list[MetricSpec], where: str = "", params=()
) -> dict:
    """All statistics of one annotation step in ONE statement: the join is read once into a
    materialised CTE, then aggregates, histograms and frequencies are taken from it."""
    values = ", ".join(f"{_value_sql(s)} AS v{i}" for i, s in enumerate(specs)) or "NULL AS v0"
    aggregates = [
        "count(*) FILTER (WHERE status = 'error')",
        "count(*) FILTER (WHERE status = 'success')",
        "avg(duration_ms) FILTER (WHERE status = 'success')",
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
        elif spec.type in ("categorical", "string"):
            extras.append(
                f"""(SELECT json_agg(json_build_array(v, c)) FROM (
                      SELECT v{i} AS v, count(*) AS c FROM vals WHERE v{i} IS NOT NULL
                      GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 50) f)"""
                if spec.type == "categorical"
                else "NULL"
            )
        else:
            extras.append("NULL")
    sql = f"""
        WITH vals AS MATERIALIZED (
            SELECT r.status, r.duration_ms, jt.tokens AS judge_tokens, jt.cost AS judge_cost, {values}
            FROM runs_result r
            LEFT JOIN runs_annotation a ON a.id = r.annotation_id
            LEFT JOIN runs_trace jt ON jt.id = a.judge_trace_id
            WHERE r.run_id = %s AND r.step_key = %s {where}
        )
        SELECT {", ".join(aggregates + extras)} FROM vals
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, step_key, *params])
        row = list(cursor.fetchone())
    errors, successes, duration, tokens, tokens_mean, cost, cost_mean = row[:7]
    extra_values = row[len(aggregates) :]
    stats = _stats_from_row(specs, row[7 : len(aggregates)], errors)
    stats["duration"] = {
        "type": "continuous",
        "mean": duration,
        "count": successes,
        "errors": errors,
    }
    stats["errors"] = {"type": "count", "count": errors}
    # An LLM judge's own calls: tokens and cost from its traces (none for other kinds).
    stats["tokens"] = {"type": "continuous", "sum": tokens, "mean": tokens_mean, "errors": errors}
    stats["costs"] = {"type": "continuous", "sum": cost, "mean": cost_mean, "errors": errors}
    for spec, extra in zip(specs, extra_values, strict=True):
        entry = stats[spec.key]
        if spec.numeric and entry["count"]:
            entry["histogram"] = _bins(entry, extra)
        elif spec.type == "categorical":
            entry["frequencies"] = [{"value": v, "count": c} for v, c in (extra or [])]
    return stats


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


def _invocation_step_stats(run_id: int, step_key: str, where: str = "", params=()) -> dict:
    percentiles = ",".join(str(p / 100) for p in PERCENTILES)
    sql = f"""
        SELECT count(*) FILTER (WHERE r.status = 'error'), count(*) FILTER (WHERE r.status = 'success'),
               avg(coalesce(t.duration_ms, r.duration_ms)) FILTER (WHERE r.status = 'success'), min(coalesce(t.duration_ms, r.duration_ms)) FILTER (WHERE r.status = 'success'),
               max(coalesce(t.duration_ms, r.duration_ms)) FILTER (WHERE r.status = 'success'),
               percentile_cont(ARRAY[{percentiles}]) WITHIN GROUP (ORDER BY coalesce(t.duration_ms, r.duration_ms)) FILTER (WHERE r.status = 'success'),
               sum(t.tokens) FILTER (WHERE r.status = 'success'), avg(t.tokens) FILTER (WHERE r.status = 'success'), sum(t.cost) FILTER (WHERE r.status = 'success'), avg(t.cost) FILTER (WHERE r.status = 'success')
        FROM runs_result r LEFT JOIN runs_trace t ON t.id = r.trace_id
        WHERE r.run_id = %s AND r.step_key = %s {where}
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, step_key, *params])
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


def run_stats(run, where: str = "", params=(), *, fresh: bool = False) -> dict[str, dict]:
    """Statistics of every step of a run (optionally restricted by an extra SQL condition)."""
    data: dict[str, dict] = {}
    specs = step_specs(run, fresh=fresh)
    for step in run.steps.order_by("position", "id"):
        if step.type == "invocation":
            data[step.key] = _invocation_step_stats(run.pk, step.key, where, params)
        elif step.type == "annotation":
            data[step.key] = _annotation_step_stats(
                run.pk, step.key, specs.get(step.key, []), where, params
            )
    return data


@transaction.atomic
def run_refresh(*, run, scenario_ids: list[int] | None = None) -> dict:
    """Recompute and store the run-wide statistics (and buckets for online runs). Idempotent;
    concurrent refreshes of one run serialise on an advisory lock (not the run's row, which cell
    writes update) and the last one wins with the same answer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [REFRESH_LOCK, run.pk])
    data = run_stats(run, fresh=True)  # re-infers schemas first when outputs were added
    mappings_refresh_deferred(run)
    now = timezone.now()
    RunMetrics.objects.update_or_create(
        run=run, scenario=None, bucket_start=None, defaults={"data": data, "refreshed_at": now}
    )
    if run.is_online:
        buckets_refresh(run=run, scenario_ids=scenario_ids)
    Run.objects.filter(pk=run.pk).update(metrics_refreshed_at=now)
    return data


def scenarios_refresh(*, run, scenario_ids: list[int] | None) -> None:
    """Per-scenario statistics of the given scenarios of the run (all of them with None), one
    query per step and batch."""
    ids = Scenario.objects.filter(run=run).values_list("pk", flat=True)
    if scenario_ids is not None:
        ids = ids.filter(pk__in=scenario_ids)
    ids = list(ids.order_by("pk"))
    if not ids:
        return
    mappings_refresh_deferred(run)
    specs = step_specs(run)
    for start in range(0, len(ids), REFRESH_BATCH):
        _scenarios_refresh(run, specs, ids[start : start + REFRESH_BATCH])


def _scenarios_refresh(run, specs: dict, ids: list[int]) -> None:
    per: dict[int, dict] = {pk: {} for pk in ids}
    for step_key, step_specs_ in specs.items():
        for scenario_id, values in _per_scenario(run.pk, step_key, step_specs_, ids).items():
            per[scenario_id][step_key] = values
    # One upsert from two arrays: no model instances for thousands of rows.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO runs_runmetrics (run_id, scenario_id, bucket_start, data, refreshed_at)
            SELECT %s, u.id, NULL, u.data::jsonb, %s FROM unnest(%s::bigint[], %s::text[]) AS u(id, data)
            ON CONFLICT (run_id, scenario_id, bucket_start)
            DO UPDATE SET data = EXCLUDED.data, refreshed_at = EXCLUDED.refreshed_at
            """,
            [run.pk, timezone.now(), list(per), [json.dumps(d) for d in per.values()]],
        )
    _values_refresh(run, specs, per)


def _values_refresh(run, specs: dict, per: dict[int, dict]) -> None:
    """The read model of these scenarios (``ScenarioValue``): one row per scenario and numeric
    or boolean metric, upserted from arrays; keys the schema no longer has are removed."""
    columns: tuple[list, ...] = ([], [], [], [], [])
    for scenario_id, steps in per.items():
        for step_key, step_specs_ in specs.items():
            found = steps.get(step_key)
            if found is None:
                continue  # no cell of this step yet
            for spec in step_specs_:
                if spec.numeric or spec.type == "binary":
                    for column, value in zip(
                        columns,
                        (scenario_id, step_key, spec.key, found.get(spec.key), found["errors"]),
                        strict=True,
                    ):
                        column.append(value)
    kept = [(step_key, spec.key) for step_key, ss in specs.items() for spec in ss]
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM runs_scenariovalue WHERE run_id = %s AND scenario_id = ANY(%s) "
            "AND (step_key, key) NOT IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            [run.pk, list(per), [k[0] for k in kept], [k[1] for k in kept]],
        )
        cursor.execute(
            """
            INSERT INTO runs_scenariovalue (run_id, scenario_id, index, step_key, key, value, errors)
            SELECT %s, u.id, s.index, u.step_key, u.key, u.value, u.errors
            FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::float8[], %s::int[])
                 AS u(id, step_key, key, value, errors)
            JOIN runs_scenario s ON s.id = u.id
            ON CONFLICT (run_id, step_key, key, index)
            DO UPDATE SET value = EXCLUDED.value, errors = EXCLUDED.errors
            WHERE (runs_scenariovalue.value, runs_scenariovalue.errors)
                  IS DISTINCT FROM (EXCLUDED.value, EXCLUDED.errors)
            """,
            [run.pk, *columns],
        )


def _per_scenario(
    run_id: int, step_key: str, specs: list[MetricSpec], scenario_ids: list[int]
) -> dict[int, dict]:
    values = ", ".join(f"{_value_sql(s)} AS v{i}" for i, s in enumerate(specs)) or "NULL AS v0"
    columns = []
    for i, spec in enumerate(specs):
        if spec.numeric:
            columns.append(f"avg(v{i})")
        elif spec.type == "binary":
            columns.append(f"avg(v{i}::int)::float8")
        else:
            columns.append(f"(array_agg(v{i}))[1]")
    select = ", ".join(["r.scenario_id", "count(*) FILTER (WHERE r.status = 'error')", *columns])
    sql = f"""
        SELECT {select} FROM runs_result r LEFT JOIN runs_annotation a ON a.id = r.annotation_id
        CROSS JOIN LATERAL (SELECT {values}) vals
        WHERE r.run_id = %s AND r.step_key = %s AND r.scenario_id = ANY(%s)
        GROUP BY r.scenario_id
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, step_key, scenario_ids])
        rows = cursor.fetchall()
    out = {}
    for scenario_id, errors, *vals in rows:
        out[scenario_id] = {
            "errors": errors,
            **{spec.key: v for spec, v in zip(specs, vals, strict=True)},
        }
    return out


_BUCKETS_SQL = (
    "SELECT DISTINCT to_timestamp(floor(extract(epoch FROM created_at) / %s) * %s) "
    "FROM runs_scenario WHERE run_id = %s"
)
_BUCKET_WHERE = (
    "AND r.scenario_id IN (SELECT id FROM runs_scenario WHERE run_id = %s AND created_at >= %s "
    "AND created_at < %s + make_interval(secs => %s))"
)


def buckets_refresh(*, run, scenario_ids: list[int] | None = None) -> None:
    """Online runs: statistics per time bucket of the evaluated traces; with ``scenario_ids``
    only the buckets those scenarios fall in (not every bucket the run ever had)."""
    seconds = getattr(getattr(run, "online_rule", None), "bucket_seconds", 3600) or 3600
    sql, params = _BUCKETS_SQL, [seconds, seconds, run.pk]
    if scenario_ids is not None:
        sql, params = sql + " AND id = ANY(%s)", [*params, list(scenario_ids)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        starts = [row[0] for row in cursor.fetchall()]
    now = timezone.now()
    for start in starts:
        data = run_stats(run, _BUCKET_WHERE, (run.pk, start, start, seconds))
        RunMetrics.objects.update_or_create(
            run=run, bucket_start=start, scenario=None, defaults={"data": data, "refreshed_at": now}
        )
