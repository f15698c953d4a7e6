"""Metrics that never come out empty (seed 002): metric keys from schemas, statistics in SQL,
schema inference from stored outputs, and the run's scenario-table mappings.

Where a step's metric keys come from, in order: the revision's ``schemas.outputs``; else the
kind's declared outputs schema for its parameters; else a schema inferred from every output
stored for that revision. Statistics are computed by PostgreSQL (aggregates, percentile_cont,
width_bucket) and stored in ``RunMetrics``: run-wide, per scenario, and per time bucket.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from evaluators.kinds import REGISTRY
from evaluators.models import EvaluatorRevision
from runs.selectors import dig

PERCENTILES = (5, 25, 50, 75, 90, 95, 99)
HISTOGRAM_BINS = 10
OUTPUTS_PREFIX = "attributes.ag.data.outputs"


@dataclass(frozen=True)
class MetricSpec:
    key: str  # dotted path inside the outputs: "score", "details.tokens"
    type: str  # binary | continuous | discrete | categorical | string
    values: tuple = ()  # categorical: the enum

    @property
    def path(self) -> list[str]:
        return self.key.split(".")

    @property
    def numeric(self) -> bool:
        return self.type in ("continuous", "discrete")


# --- schema -> metric keys ----------------------------------------------------------------------


def schema_metrics(schema: dict | None, prefix: str = "") -> list[MetricSpec]:
    """Metric keys of an outputs schema: boolean -> binary, number -> continuous, integer ->
    discrete, string enum -> categorical, string -> count only, object -> its properties as
    dotted paths; a nullable union counts as its non-null type."""
    if not schema:
        return []
    specs: list[MetricSpec] = []
    for name, prop in (schema.get("properties") or {}).items():
        key = f"{prefix}.{name}" if prefix else name
        kind = _non_null_type(prop)
        if kind == "object":
            specs += schema_metrics(prop, key)
        elif kind == "boolean":
            specs.append(MetricSpec(key, "binary"))
        elif kind == "number":
            specs.append(MetricSpec(key, "continuous"))
        elif kind == "integer":
            specs.append(MetricSpec(key, "discrete"))
        elif kind == "string" and prop.get("enum"):
            specs.append(
                MetricSpec(key, "categorical", tuple(v for v in prop["enum"] if v is not None))
            )
        elif kind == "string":
            specs.append(MetricSpec(key, "string"))
    return specs


def _non_null_type(prop: dict) -> str | None:
    kind = prop.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        return rest[0] if len(rest) == 1 else None
    for union in ("anyOf", "oneOf"):
        if union in prop:
            rest = [p for p in prop[union] if p.get("type") != "null"]
            if len(rest) == 1:
                return _non_null_type({**rest[0], **{k: v for k, v in prop.items() if k != union}})
    if kind is None and "enum" in prop:
        return "string"
    return kind


def revision_outputs_schema(
    revision: EvaluatorRevision, *, fresh: bool = False
) -> tuple[dict | None, str]:
    """The outputs schema to read a revision's metrics with, and where it came from:
    ``revision``, ``kind``, ``inferred`` or ``none`` (no schema and no outputs yet).

    An inferred schema comes from every stored output. It is cached per revision; ``fresh``
    re-infers it when outputs were added since (run-wide refreshes ask for that)."""
    if revision.outputs_schema:
        return revision.outputs_schema, "revision"
    kind = REGISTRY.get(revision.kind)
    if kind is not None and kind.outputs is not None and not callable(kind.outputs):
        return kind.outputs, "kind"
    if kind is not None and callable(kind.outputs):
        return kind.outputs_schema(kind.parse(revision.parameters)), "kind"
    schema = inferred_schema(revision, fresh=fresh)
    return (schema, "inferred") if schema.get("properties") else (None, "none")


def inferred_schema(revision: EvaluatorRevision, *, fresh: bool = False) -> dict:
    from runs.models import Annotation, InferredSchema

    cached = InferredSchema.objects.filter(revision=revision).first()
    if cached is not None and cached.schema.get("properties"):
        if not fresh:
            return cached.schema
        if Annotation.objects.filter(revision=revision).count() == cached.total:
            return cached.schema  # nothing new since: the same outputs give the same schema
    inferred = schema_infer(revision_id=revision.pk)
    InferredSchema.objects.update_or_create(
        revision=revision,
        defaults={
            "schema": inferred["schema"],
            "fields": inferred["fields"],
            "total": inferred["total"],
            "inferred_at": timezone.now(),
        },
    )
    return inferred["schema"]


# --- inference in SQL -----------------------------------------------------------------------------

_INFER_SQL = """
WITH RECURSIVE flat(path, value) AS (
    SELECT ARRAY[e.key], e.value
    FROM runs_annotation a, jsonb_each(a.outputs) e
    WHERE a.revision_id = %(revision)s AND jsonb_typeof(a.outputs) = 'object'
  UNION ALL
    SELECT f.path || e.key, e.value
    FROM flat f, jsonb_each(f.value) e
    WHERE jsonb_typeof(f.value) = 'object'
)
SELECT path, jsonb_typeof(value) AS type,
       CASE WHEN jsonb_typeof(value) = 'string' THEN value #>> '{}' END AS text,
       count(*) AS n,
       bool_and(jsonb_typeof(value) <> 'number' OR value::text ~ '^-?[0-9]+$') AS integral
FROM flat
GROUP BY 1, 2, 3
"""

ENUM_MAX = 12


def schema_infer(*, revision_id: int) -> dict[str, Any]:
    """Infer an outputs schema from EVERY output stored for a revision, in one SQL pass.

    Returns ``{"schema", "total", "fields": [{path, types, count, agree, examples, schema}]}``: a
    string field with few distinct values becomes an enum (categorical metric), numbers that are
    all whole become integers, a field missing or null in some outputs becomes nullable.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM runs_annotation WHERE revision_id = %s", [revision_id])
        total = cursor.fetchone()[0]
        cursor.execute(_INFER_SQL, {"revision": revision_id})
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT outputs FROM runs_annotation WHERE revision_id = %s ORDER BY id LIMIT 3",
            [revision_id],
        )
        # A raw cursor hands jsonb over as text.
        samples = [
            json.loads(row[0]) if isinstance(row[0], str) else row[0] for row in cursor.fetchall()
        ]
    by_path: dict[tuple, dict] = {}
    for path, json_type, text, n, integral in rows:
        field = by_path.setdefault(tuple(path), {"types": {}, "strings": set(), "integral": True})
        field["types"][json_type] = field["types"].get(json_type, 0) + n
        if json_type == "string" and len(field["strings"]) <= ENUM_MAX:
            field["strings"].add(text)
        if json_type == "number":
            field["integral"] = bool(integral)
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    fields = []
    for path, field in sorted(by_path.items()):
        prop = _prop_for(field, total)
        if prop is None:
            continue
        _place(schema, list(path), prop)
        count = sum(field["types"].values())
        # Outputs whose value has the schema's type (nulls agree with a nullable field).
        kind = _non_null_type(prop)
        agree = field["types"].get("number" if kind in ("number", "integer") else kind, 0)
        if isinstance(prop.get("type"), list):
            agree += field["types"].get("null", 0)
        examples = [dig(sample, list(path)) for sample in samples]
        fields.append(
            {
                "path": ".".join(path),
                "types": field["types"],
                "count": count,
                "agree": agree,
                "examples": [json.dumps(e) for e in examples if e is not None][:3],
                "schema": prop,
            }
        )
    return {"schema": schema, "total": total, "fields": fields}


def _prop_for(field: dict, total: int) -> dict | None:
    types = {t for t in field["types"] if t != "null"}
    nullable = "null" in field["types"] or sum(field["types"].values()) < total
    if types == {"object"}:
        return None  # its children carry the metrics; _place creates the object
    if len(types) != 1:
        # Mixed types: the majority wins; outputs of the other types will be listed as disagreeing.
        if not types:
            return None
        majority = max(types, key=lambda t: field["types"][t])
        types = {majority}
    (json_type,) = types
    if json_type == "number":
        prop: dict[str, Any] = {"type": "integer" if field["integral"] else "number"}
    elif json_type == "string" and field["strings"] and len(field["strings"]) <= ENUM_MAX:
        prop = {"type": "string", "enum": sorted(field["strings"])}
    elif json_type == "array":
        prop = {"type": "array"}
    else:
        prop = {"type": json_type}
    if nullable:
        prop["type"] = [prop["type"], "null"]
        if "enum" in prop:
            prop["enum"] = [*prop["enum"], None]
    return prop


def _place(schema: dict, path: list[str], prop: dict) -> None:
    node = schema
    for part in path[:-1]:
        node = node["properties"].setdefault(part, {"type": "object", "properties": {}})
        node.setdefault("properties", {})
    node["properties"][path[-1]] = prop


# --- mappings -----------------------------------------------------------------------------------


def mappings_build(run) -> list[dict]:
    """The scenario table's columns. Every path points inside what its step produces: a testcase
    column, the application's outputs, or a key of the evaluator's outputs schema (a revision
    without one gets columns once its first outputs exist and a schema can be inferred)."""
    mappings: list[dict] = []
    # A column application's outputs column is shown once, as the outputs.
    app = run.application
    outputs_column = (
        app.config.get("outputs_column") if app is not None and app.kind == "column" else None
    )
    steps = list(run.steps.select_related("revision__evaluator").order_by("position", "id"))
    evaluators = Counter(step.revision.evaluator_id for step in steps if step.revision is not None)
    for step in steps:
        if step.type == "input" and run.testset_version_id:
            for column in run.testset_version.columns:
                if column != outputs_column:
                    mappings.append(_mapping("input", column, step.key, f"data.{column}"))
        elif step.type == "input":
            mappings.append(_mapping("input", "inputs", step.key, "attributes.ag.data.inputs"))
        elif step.type == "invocation":
            mappings.append(_mapping("outputs", "outputs", step.key, OUTPUTS_PREFIX))
        elif step.revision is not None:
            schema, _ = revision_outputs_schema(step.revision)
            # Two revisions of one evaluator in a run: name the columns by revision.
            prefix = (
                step.revision.slug
                if evaluators[step.revision.evaluator_id] > 1
                else step.revision.evaluator.slug
            )
            for spec in schema_metrics(schema):
                name = f"{prefix}.{spec.key}"
                mappings.append(
                    _mapping(
                        "annotation", name, step.key, f"{OUTPUTS_PREFIX}.{spec.key}", spec.type
                    )
                )
    return mappings


def _mapping(kind: str, name: str, step_key: str, path: str, metric_type: str = "") -> dict:
    mapping = {"column": {"kind": kind, "name": name}, "step": {"key": step_key, "path": path}}
    if metric_type:
        mapping["column"]["type"] = metric_type
    return mapping


def mappings_refresh_deferred(run) -> bool:
    """First-scenario deferral: rebuild mappings when an annotation step has none yet."""
    steps_with_columns = {
        m["step"]["key"] for m in run.mappings if m["column"]["kind"] == "annotation"
    }
    deferred = run.steps.filter(type="annotation").exclude(key__in=steps_with_columns).exists()
    if not deferred:
        return False
    mappings = mappings_build(run)
    if mappings != run.mappings:
        type(run).objects.filter(pk=run.pk).update(mappings=mappings)
        run.mappings = mappings
        return True
    return False


# --- statistics -----------------------------------------------------------------------------------


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
def run_refresh(*, run) -> dict:
    """Recompute and store the run-wide statistics (and buckets for online runs). Idempotent;
    concurrent refreshes serialise on the run row and the last one wins with the same answer."""
    from runs.models import Run, RunMetrics

    Run.objects.select_for_update().filter(pk=run.pk).first()
    data = run_stats(run, fresh=True)  # re-infers schemas first when outputs were added
    mappings_refresh_deferred(run)
    now = timezone.now()
    RunMetrics.objects.update_or_create(
        run=run, scenario=None, bucket_start=None, defaults={"data": data, "refreshed_at": now}
    )
    if run.is_online:
        buckets_refresh(run=run)
    Run.objects.filter(pk=run.pk).update(metrics_refreshed_at=now)
    return data


def scenarios_refresh(*, run, scenarios: list) -> None:
    """Per-scenario statistics for scenarios whose results just landed (one query per step)."""
    from runs.models import RunMetrics

    if not scenarios:
        return
    mappings_refresh_deferred(run)
    ids = [s.pk for s in scenarios]
    specs = step_specs(run)
    per: dict[int, dict] = {pk: {} for pk in ids}
    for step_key, step_specs_ in specs.items():
        for scenario_id, values in _per_scenario(run.pk, step_key, step_specs_, ids).items():
            per[scenario_id][step_key] = values
    now = timezone.now()
    RunMetrics.objects.bulk_create(
        [
            RunMetrics(run=run, scenario_id=pk, data=data, refreshed_at=now)
            for pk, data in per.items()
        ],
        update_conflicts=True,
        unique_fields=["run", "scenario", "bucket_start"],
        update_fields=["data", "refreshed_at"],
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


def buckets_refresh(*, run) -> None:
    """Online runs: statistics per time bucket of the evaluated traces."""
    from runs.models import RunMetrics

    seconds = getattr(getattr(run, "online_rule", None), "bucket_seconds", 3600) or 3600
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT to_timestamp(floor(extract(epoch FROM s.created_at) / %s) * %s) FROM runs_scenario s WHERE s.run_id = %s",
            [seconds, seconds, run.pk],
        )
        starts = [row[0] for row in cursor.fetchall()]
    now = timezone.now()
    for start in starts:
        where = "AND r.scenario_id IN (SELECT id FROM runs_scenario WHERE run_id = %s AND created_at >= %s AND created_at < %s + make_interval(secs => %s))"
        data = run_stats(run, where, (run.pk, start, start, seconds))
        RunMetrics.objects.update_or_create(
            run=run, bucket_start=start, scenario=None, defaults={"data": data, "refreshed_at": now}
        )


def run_metrics_stale(run) -> bool:
    if run.metrics_refreshed_at is None:
        return run.done_cells > 0
    return bool(run.progressed_at and run.progressed_at > run.metrics_refreshed_at)
