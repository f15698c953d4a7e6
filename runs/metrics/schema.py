"""From outputs schemas to metric keys, and schemas inferred in SQL from stored outputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from evalsite.jsonpaths import dig
from evaluators.kinds import REGISTRY
from evaluators.models import EvaluatorRevision
from runs.models import InferredSchema

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


def schema_metrics(schema: dict | None, prefix: str = "") -> list[MetricSpec]:
    """Metric keys of an outputs schema: boolean -> binary, number -> continuous, integer ->
    discrete, string enum -> categorical, string -> count only, object -> its properties as
    dotted paths; a nullable union counts as its non-null type."""
    if not schema:
        return []
    specs: list[MetricSpec] = []
    for name, prop in (schema.get("properties") or {}).items():
        key = f"{prefix}.{name}" if prefix else name
        kind = non_null_type(prop)
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


def non_null_type(prop: dict) -> str | None:
    kind = prop.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        return rest[0] if len(rest) == 1 else None
    for union in ("anyOf", "oneOf"):
        if union in prop:
            rest = [p for p in prop[union] if p.get("type") != "null"]
            if len(rest) == 1:
                return non_null_type({**rest[0], **{k: v for k, v in prop.items() if k != union}})
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
    return revision_outputs_schemas([revision], fresh=fresh)[revision.pk]


def revision_outputs_schemas(
    revisions: list[EvaluatorRevision], *, fresh: bool = False
) -> dict[int, tuple[dict | None, str]]:
    """``revision_outputs_schema`` of several revisions, with one read of the cached inferred
    schemas and one count of their outputs (a run-wide refresh asks for all its steps)."""
    found: dict[int, tuple[dict | None, str]] = {}
    inferred = []
    for revision in revisions:
        fixed = _fixed_schema(revision)
        if fixed is not None:
            found[revision.pk] = fixed
        else:
            inferred.append(revision)
    schemas = _inferred_schemas(inferred, fresh=fresh) if inferred else {}
    for revision in inferred:
        schema = schemas[revision.pk]
        found[revision.pk] = (schema, "inferred") if schema.get("properties") else (None, "none")
    return found


def _fixed_schema(revision: EvaluatorRevision) -> tuple[dict, str] | None:
    if revision.outputs_schema:
        return revision.outputs_schema, "revision"
    kind = REGISTRY.get(revision.kind)
    if kind is not None and kind.outputs is not None and not callable(kind.outputs):
        return kind.outputs, "kind"
    if kind is not None and callable(kind.outputs):
        return kind.outputs_schema(kind.parse(revision.parameters)), "kind"
    return None


def inferred_schema(revision: EvaluatorRevision, *, fresh: bool = False) -> dict:
    return _inferred_schemas([revision], fresh=fresh)[revision.pk]


def _inferred_schemas(revisions: list[EvaluatorRevision], *, fresh: bool) -> dict[int, dict]:
    """Cached inferred schemas; inferred again when the cache has no properties yet or, with
    ``fresh``, when a revision's number of stored outputs differs from the cached one's."""
    cached = {
        c.revision_id: c
        for c in InferredSchema.objects.filter(revision__in=revisions)
        if c.schema.get("properties")
    }
    stale = {r.pk: r for r in revisions if r.pk not in cached}
    if fresh and cached:
        counts = _outputs_counts(list(cached))
        stale |= {
            r.pk: r
            for r in revisions
            if r.pk in cached and counts.get(r.pk, 0) != cached[r.pk].total
        }
    schemas = {pk: c.schema for pk, c in cached.items()}
    for pk in stale:
        inferred = schema_infer(revision_id=pk)
        InferredSchema.objects.update_or_create(
            revision_id=pk,
            defaults={
                "schema": inferred["schema"],
                "fields": inferred["fields"],
                "total": inferred["total"],
                "inferred_at": timezone.now(),
            },
        )
        schemas[pk] = inferred["schema"]
    return schemas


def _outputs_counts(revision_ids: list[int]) -> dict[int, int]:
    """How many outputs each revision has: one count per revision, each read from the
    revision's index alone (a count of several at once would read the whole table)."""
    sql = " UNION ALL ".join(
        ["SELECT %s, count(*) FROM runs_annotation WHERE revision_id = %s"] * len(revision_ids)
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [v for pk in revision_ids for v in (pk, pk)])
        return dict(cursor.fetchall())


def jit_off(cursor) -> None:
    """These statements take well under a second: compiling them (PostgreSQL's JIT, which a
    large row estimate turns on) would cost more than running them. For this transaction."""
    cursor.execute("SELECT set_config('jit', 'off', true)")


# The keys of the objects found at one path of a revision's outputs ({node}: the outputs
# themselves, or what is at %(path)s inside them), each with its JSON type, how many outputs have
# it with that type, whether all its numbers are whole (no digits after the point), and its
# distinct strings (the first %(strings)s in order, and how many).
_INFER_LEVEL_SQL = """
SELECT key, type, sum(n)::bigint, bool_and(integral), count(text),
       (array_agg(text ORDER BY text) FILTER (WHERE text IS NOT NULL))[1:%(strings)s]
FROM (
    SELECT key, jsonb_typeof(value) AS type,
           CASE WHEN jsonb_typeof(value) = 'string' THEN value #>> '{{}}' END AS text,
           count(*) AS n,
           bool_and(CASE WHEN jsonb_typeof(value) = 'number' THEN scale(value::numeric) = 0 END)
               AS integral
    FROM (
        SELECT key, node -> key AS value
        FROM (SELECT {node} AS node FROM runs_annotation WHERE revision_id = %(revision)s) o,
             jsonb_object_keys(CASE WHEN jsonb_typeof(node) = 'object' THEN node END) key
    ) pairs
    GROUP BY 1, 2, 3
) typed
GROUP BY 1, 2
"""

# How many outputs, and the first three (by id) as examples, in one read of the revision's rows
# (walking the primary key until three of this revision turn up could read the whole table).
_INFER_SAMPLES_SQL = """
WITH found AS (
    SELECT count(*) AS total, (array_agg(id ORDER BY id))[1:3] AS first
    FROM runs_annotation WHERE revision_id = %s
)
SELECT total, ARRAY(SELECT outputs FROM runs_annotation WHERE id = ANY(first) ORDER BY id)
FROM found
"""


ENUM_MAX = 12


def schema_infer(*, revision_id: int) -> dict[str, Any]:
    """Infer an outputs schema from EVERY output stored for a revision, in SQL: one statement
    aggregates the JSON types of the top-level keys, one more per path that holds objects.

    Returns ``{"schema", "total", "fields": [{path, types, count, agree, examples, schema}]}``: a
    string field with few distinct values becomes an enum (categorical metric), numbers that are
    all whole become integers, a field missing or null in some outputs becomes nullable.
    """
    by_path: dict[tuple, dict] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        jit_off(cursor)
        # The grouping sorts every key of every output: in memory, not in temporary files.
        cursor.execute("SELECT set_config('work_mem', '64MB', true)")
        cursor.execute(_INFER_SAMPLES_SQL, [revision_id])
        total, samples = cursor.fetchone()
        paths: list[tuple] = [()]
        while paths:
            path = paths.pop()
            node = "outputs #> %(path)s" if path else "outputs"
            cursor.execute(
                _INFER_LEVEL_SQL.format(node=node),
                {"revision": revision_id, "path": list(path), "strings": ENUM_MAX + 1},
            )
            for key, json_type, n, integral, _distinct, strings in cursor.fetchall():
                field = by_path.setdefault(
                    (*path, key), {"types": {}, "strings": set(), "integral": True}
                )
                field["types"][json_type] = n
                if json_type == "string":
                    field["strings"] = set(strings)
                elif json_type == "number":
                    field["integral"] = bool(integral)
                elif json_type == "object":
                    paths.append((*path, key))
    # A raw cursor hands jsonb over as text.
    samples = [json.loads(s) if isinstance(s, str) else s for s in samples or []]
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    fields = []
    for path, field in sorted(by_path.items()):
        prop = _prop_for(field, total)
        if prop is None:
            continue
        _place(schema, list(path), prop)
        count = sum(field["types"].values())
        # Outputs whose value has the schema's type (nulls agree with a nullable field).
        kind = non_null_type(prop)
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
