"""A run's mappings: the scenario table's columns, each pointing inside what its step produced."""

from __future__ import annotations

from collections import Counter

from runs.metrics.schema import OUTPUTS_PREFIX, revision_outputs_schema, schema_metrics


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
