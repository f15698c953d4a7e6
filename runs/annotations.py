"""Annotations: an evaluator's judgement of a trace, created or corrected with history."""

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
    if isinstance(ref, int) or str(ref).isdecimal():
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
        if text.isdecimal()
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
