"""A person's judgement of one scenario of a run (a human form, or a correction)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from evaluators.models import EvaluatorRevision
from runs import metrics
from runs.annotations import annotation_create, annotation_update
from runs.engine.cells import cells_replace_counted, scenario_statuses_update
from runs.engine.locks import run_check_open, run_locked
from runs.engine.steps import annotation_step, step_key_for_revision
from runs.models import Annotation, Channel, Origin, Result, ResultStatus, Run, RunStep
from runs.traces import scenario_invocation_trace


@transaction.atomic
def scenario_annotate(
    *, run, scenario, revision: EvaluatorRevision, outputs: Any, author=None
) -> Annotation:
    """A person's judgement of one scenario: a human evaluator's form, or a correction of any
    evaluator's result. The annotation is linked to the scenario's trace; the cell's result
    points at it; an earlier value is kept in the annotation's history."""
    run = run_locked(run)
    run_check_open(run)
    key = step_key_for_revision(revision)
    if not run.steps.filter(key=key).exists():
        RunStep.objects.bulk_create([annotation_step(run, revision, run.steps.count())])
        Run.objects.filter(pk=run.pk).update(mappings=metrics.mappings_build(run))
    result = (
        Result.objects.filter(run=run, scenario=scenario, step_key=key, repeat_idx=0)
        .select_related("annotation")
        .first()
    )
    if result is not None and result.annotation is not None:
        annotation = annotation_update(annotation=result.annotation, outputs=outputs, author=author)
    else:
        annotation = annotation_create(
            project=run.project,
            evaluator=revision.evaluator_id,
            revision=revision.pk,
            outputs=outputs,
            trace=scenario_invocation_trace(scenario),
            origin=Origin.HUMAN,
            channel=Channel.WEB,
            author=author,
        )
    cell = Result(
        project_id=run.project_id,
        run=run,
        scenario=scenario,
        step_key=key,
        repeat_idx=0,
        status=ResultStatus.SUCCESS,
        annotation=annotation,
        updated_at=timezone.now(),
    )
    cells_replace_counted(
        run,
        [cell],
        lambda: Result.objects.bulk_create(
            [cell],
            update_conflicts=True,
            unique_fields=["run", "scenario", "step_key", "repeat_idx"],
            update_fields=["status", "annotation", "error", "updated_at"],
        ),
    )
    scenario_statuses_update(run, [scenario])
    return annotation
