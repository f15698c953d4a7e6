"""Annotations: judgements attached to traces, by evaluators, people, or the user's own code.

Every annotation carries its evaluator's id AND slug (and the revision), so a lookup by either
finds it; the bug of seed 002 (stored by id, looked up by slug) cannot happen here.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project
from evaluators.models import Evaluator, EvaluatorRevision
from evaluators.normalize import EvaluationError, normalize
from evaluators.services import evaluator_create, schema_check
from runs.models import Annotation, Channel, Origin, Trace


def evaluator_for_annotation(*, project: Project, ref: str | int, author=None) -> Evaluator:
    """Find an evaluator by id or slug; an unknown slug registers a feedback evaluator (its
    outputs schema is then inferred from the annotations that arrive)."""
    evaluator = Evaluator.objects.for_project(project).by_ref(ref).select_related("head").first()
    if evaluator is not None:
        return evaluator
    if isinstance(ref, int) or str(ref).isdigit():
        raise InvalidInput({"evaluator": [f"No evaluator with id {ref} in this project."]})
    return evaluator_create(
        project=project,
        kind="feedback",
        name=str(ref),
        slug=str(ref),
        author=author,
        message="Registered by the first annotation",
    )


def revision_for_annotation(evaluator: Evaluator, ref: str | int | None) -> EvaluatorRevision:
    if ref in (None, ""):
        return evaluator.head
    revisions = evaluator.revisions.all()
    text = str(ref)
    found = revisions.filter(slug=text).first() or (
        revisions.filter(version=int(text)).first() or revisions.filter(pk=int(text)).first()
        if text.isdigit()
        else None
    )
    if found is None:
        raise InvalidInput({"revision": [f"No revision {ref!r} of evaluator {evaluator.slug}."]})
    return found


def outputs_validate(outputs: Any, revision: EvaluatorRevision) -> dict[str, Any]:
    """Normalise like any evaluator return value, then check the revision's outputs schema
    (422 naming the field when the data is well-formed but the schema refuses it)."""
    try:
        value = normalize(outputs)
    except EvaluationError as exc:
        raise InvalidInput({"outputs": [exc.message.replace("evaluate() returned", "got")]})
    if revision.outputs_schema:
        try:
            schema_check(value, revision.outputs_schema)
        except EvaluationError as exc:
            raise InvalidInput({"outputs": [exc.message]}, status=422)
    return value


@transaction.atomic
def annotation_create(
    *,
    project: Project,
    evaluator: str | int,
    outputs: Any,
    revision: str | int | None = None,
    trace_id: str = "",
    span_id: str = "",
    origin: str = Origin.CUSTOM,
    channel: str = Channel.API,
    author=None,
    trace: Trace | None = None,
) -> Annotation:
    evaluator_obj = evaluator_for_annotation(project=project, ref=evaluator, author=author)
    revision_obj = revision_for_annotation(evaluator_obj, revision)
    value = outputs_validate(outputs, revision_obj)
    if trace is None and trace_id:
        trace = Trace.objects.filter(project=project, trace_id=trace_id).first()
        if trace is None:
            raise InvalidInput(
                {
                    "trace_id": [
                        f"No trace {trace_id!r} in this project; send it to /api/v1/traces first."
                    ]
                }
            )
    return Annotation.objects.create(
        project=project,
        trace=trace,
        span_id=span_id or (trace.root_span_id if trace else ""),
        outputs=value,
        evaluator=evaluator_obj,
        evaluator_slug=evaluator_obj.slug,
        revision=revision_obj,
        origin=origin,
        channel=channel,
        created_by=author if getattr(author, "pk", None) else None,
    )


@transaction.atomic
def annotation_update(*, annotation: Annotation, outputs: Any, author=None) -> Annotation:
    """Correct an annotation; the previous value is kept in its history (who, when, what)."""
    annotation = Annotation.objects.select_for_update().get(pk=annotation.pk)
    value = outputs_validate(outputs, annotation.revision)
    if value == annotation.outputs:
        return annotation
    previous_by = annotation.updated_by or annotation.created_by
    annotation.history = [
        *annotation.history,
        {
            "outputs": annotation.outputs,
            "origin": annotation.origin,
            "by": previous_by.username if previous_by else None,
            "at": annotation.updated_at.isoformat(),
        },
    ]
    annotation.outputs = value
    annotation.origin = Origin.HUMAN
    annotation.updated_by = author if getattr(author, "pk", None) else None
    annotation.updated_at = timezone.now()
    annotation.save(update_fields=["history", "outputs", "origin", "updated_by", "updated_at"])
    return annotation


@transaction.atomic
def scenario_annotate(
    *, run, scenario, revision: EvaluatorRevision, outputs: Any, author=None
) -> Annotation:
    """A person's judgement of one scenario: a human evaluator's form, or a correction of any
    evaluator's result. The annotation is linked to the scenario's trace; the cell's result
    points at it; an earlier value is kept in the annotation's history."""
    from runs import metrics
    from runs.models import Result, ResultStatus, Run, RunStep
    from runs.services import (
        _annotation_step,
        _check_open,
        _scenario_statuses_update,
        step_key_for_revision,
    )

    run = Run.objects.select_for_update().get(pk=run.pk)
    _check_open(run)
    key = step_key_for_revision(revision)
    if not run.steps.filter(key=key).exists():
        RunStep.objects.bulk_create([_annotation_step(run, revision, run.steps.count())])
        Run.objects.filter(pk=run.pk).update(mappings=metrics.mappings_build(run))
    result = (
        Result.objects.filter(run=run, scenario=scenario, step_key=key, repeat_idx=0)
        .select_related("annotation")
        .first()
    )
    if result is not None and result.annotation is not None:
        annotation = annotation_update(annotation=result.annotation, outputs=outputs, author=author)
    else:
        trace = (
            Result.objects.filter(scenario=scenario, repeat_idx=0, trace__isnull=False)
            .select_related("trace")
            .first()
        )
        annotation = annotation_create(
            project=run.project,
            evaluator=revision.evaluator_id,
            revision=revision.pk,
            outputs=outputs,
            trace=trace.trace if trace else scenario.trace,
            origin=Origin.HUMAN,
            channel=Channel.WEB,
            author=author,
        )
    Result.objects.update_or_create(
        run=run,
        scenario=scenario,
        step_key=key,
        repeat_idx=0,
        defaults={
            "project_id": run.project_id,
            "status": ResultStatus.SUCCESS,
            "annotation": annotation,
            "error": None,
            "updated_at": timezone.now(),
        },
    )
    _scenario_statuses_update(run, [scenario])
    # The run-wide statistics are stale now; pages and the API refresh them when they next look.
    Run.objects.filter(pk=run.pk).update(progressed_at=timezone.now())
    return annotation
