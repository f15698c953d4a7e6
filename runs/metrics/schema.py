"""From outputs schemas to metric keys, and schemas inferred in SQL from stored outputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from evalsite.jsonpaths import dig
from evaluators.kinds import REGISTRY
from evaluators.models import EvaluatorRevision
from runs.models import Annotation, InferredSchema

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
