"""Schema backfill for revisions saved without an outputs schema: candidates, apply once,
refresh the affected runs, list the outputs that disagree."""

from __future__ import annotations

from typing import Any

import jsonschema
import referencing
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project
from evaluators.kinds import REGISTRY
from evaluators.models import EvaluatorRevision
from runs import queue
from runs.metrics.mappings import mappings_build
from runs.metrics.schema import schema_metrics
from runs.metrics.stats import refresh_lock, run_refresh, scenarios_refresh
from runs.models import Annotation, Run


def backfill_candidates(*, project: Project) -> list[EvaluatorRevision]:
    """Revisions with no outputs schema of their own or of their kind, most used first."""
    fixed_kinds = [key for key, kind in REGISTRY.items() if kind.outputs is not None]
    revisions = (
        EvaluatorRevision.objects.filter(project=project)
        .exclude(kind__in=fixed_kinds)
        .filter(Q(schemas__outputs__isnull=True) | Q(schema_inferred_at__isnull=False))
        .select_related("evaluator", "schema_inferred_by")
        .annotate(
            annotation_count=Count("annotations", distinct=True),
            run_count=Count("run_steps__run", distinct=True),
        )
        .order_by("-annotation_count", "slug")
    )
    return list(revisions)


def affected_runs(revision: EvaluatorRevision):
    return Run.objects.filter(steps__revision=revision).distinct()


def backfill_progress(revision: EvaluatorRevision) -> dict[str, int]:
    """How many affected runs have been refreshed since the schema was applied."""
    runs = affected_runs(revision)
    total = runs.count()
    if revision.schema_inferred_at is None:
        return {"total": total, "done": 0}
    done = runs.filter(metrics_refreshed_at__gte=revision.schema_inferred_at).count()
    return {"total": total, "done": done}


def schema_validate(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidInput(
            {"schema": ['An outputs schema is a JSON Schema with "type": "object".']}
        )
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidInput({"schema": [f"Not a valid JSON Schema: {exc.message}"]})
    if not schema_metrics(schema):
        raise InvalidInput({"schema": ["The schema names no property that makes a metric."]})
    return schema


@transaction.atomic
def schema_backfill_apply(
    *, revision: EvaluatorRevision, schema: dict, author=None
) -> EvaluatorRevision:
    """Record ``schema`` as the revision's outputs schema and refresh every affected run.

    Applying the same schema again changes nothing; a revision is backfilled once (DOMAIN.md),
    and a schema saved with the revision is never replaced."""
    schema = schema_validate(schema)
    revision = EvaluatorRevision.objects.select_for_update().get(pk=revision.pk)
    current = (revision.schemas or {}).get("outputs")
    if current == schema:
        return revision
    if current is not None and revision.schema_inferred_at is None:
        message = f"{revision.slug} was saved with its own outputs schema; it cannot be replaced."
        raise InvalidInput({"schema": [message]})
    if current is not None:
        # A revision is immutable but for one backfill; a different schema means a new revision.
        message = (
            f"{revision.slug} was already backfilled; edit the evaluator to make a new revision."
        )
        raise InvalidInput({"schema": [message]})
    revision.schemas = {**(revision.schemas or {}), "outputs": schema}
    revision.schema_inferred_at = timezone.now()
    revision.schema_inferred_by = author if getattr(author, "pk", None) else None
    revision.save(update_fields=["schemas", "schema_inferred_at", "schema_inferred_by"])
    run_ids = list(affected_runs(revision).values_list("pk", flat=True))
    queue.runs_mappings_refresh(run_ids)
    return revision


def run_mappings_and_metrics_refresh(*, run_id: int) -> None:
    with transaction.atomic():
        refresh_lock(run_id)  # before the run's row, as every refresh of a run
        run = Run.objects.select_related("testset_version", "application").get(pk=run_id)
        Run.objects.filter(pk=run_id).update(mappings=mappings_build(run))
        run.refresh_from_db()
        scenarios_refresh(run=run, scenario_ids=None)  # the schema's keys are new columns
        run_refresh(run=run)
        queue.values_pack(run_id)


def disagreeing_outputs(
    *, revision: EvaluatorRevision, schema: dict | None = None, limit: int = 50
) -> dict[str, Any]:
    """Stored outputs that the schema refuses: the first ``limit`` with the reason, and a count."""
    schema = schema or revision.outputs_schema
    if not schema:
        return {"count": 0, "checked": 0, "examples": []}
    validator = jsonschema.Draft202012Validator(schema, registry=referencing.Registry())
    count = checked = 0
    examples = []
    rows = Annotation.objects.filter(revision=revision).values_list(
        "pk", "outputs", "trace__trace_id"
    )
    for pk, outputs, trace_id in rows.iterator(chunk_size=5000):
        checked += 1
        error = jsonschema.exceptions.best_match(validator.iter_errors(outputs))
        if error is None:
            continue
        count += 1
        if len(examples) < limit:
            where = ".".join(str(p) for p in error.absolute_path) or "(the outputs)"
            examples.append(
                {
                    "annotation": pk,
                    "trace_id": trace_id,
                    "outputs": outputs,
                    "where": where,
                    "reason": error.message,
                }
            )
    return {"count": count, "checked": checked, "examples": examples}
