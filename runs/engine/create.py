"""Creating and submitting batch runs."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project
from evaluators.models import EvaluatorRevision
from runs import metrics, queue
from runs.applications import application_create
from runs.engine.estimate import estimate_check, run_estimate
from runs.engine.process import unit_work
from runs.engine.progress import run_finish_if_complete
from runs.engine.steps import (
    annotation_step,
    invocation_step,
    scenarios_from_testcases,
    step_key_for_testset,
)
from runs.engine.tags import tags_validate
from runs.engine.units import units_plan
from runs.models import (
    Application,
    Lane,
    Run,
    RunStatus,
    RunStep,
    StepType,
    TestsetVersion,
)


def run_create(
    *,
    project: Project,
    name: str = "",
    testset_version: TestsetVersion | None = None,
    application: Application | None = None,
    revisions: list[EvaluatorRevision] = (),
    repeats: int = 1,
    author=None,
    description: str = "",
    tags: dict[str, str] | None = None,
    max_cost_usd=None,
    cost_checked: bool = False,
) -> Run:
    """Create a batch run with its steps, mappings and one scenario per testcase (not started).
    With a spend cap (the run's ``max_cost_usd`` or the project's ``max_run_cost_usd``) the run
    is estimated first, outside the transaction, and refused, creating nothing, when it is
    projected over the cap (``cost_checked``: the caller did that before opening its own)."""
    revisions = list(revisions)
    _check_run_inputs(project, testset_version, application, revisions, repeats)
    tags = tags_validate(tags)
    if not cost_checked:
        cost_check(project, testset_version, application, revisions, repeats, max_cost_usd)
    with transaction.atomic():
        return _create_rows(
            project,
            name,
            testset_version,
            application,
            revisions,
            repeats,
            author,
            description,
            tags,
            max_cost_usd,
        )


def cost_check(project, testset_version, application, revisions, repeats, max_cost_usd) -> None:
    """Refuse a run projected over its cap. Rendering the judges' prompts takes a moment and a
    slot of the project's interactive quota: never inside a transaction."""
    if max_cost_usd is None and project.max_run_cost_usd is None:
        return
    estimate_check(
        run_estimate(
            project=project,
            testset_version=testset_version,
            application=application,
            revisions=revisions,
            repeats=repeats,
            max_cost_usd=max_cost_usd,
        )
    )


def _create_rows(
    project,
    name,
    testset_version,
    application,
    revisions,
    repeats,
    author,
    description,
    tags,
    max_cost_usd,
) -> Run:
    testset = testset_version.testset
    run = Run.objects.create(
        project=project,
        name=name or f"{testset.name} × {application.name}",
        description=description,
        testset_version=testset_version,
        application=application,
        repeats=repeats,
        tags=tags,
        max_cost_usd=max_cost_usd,
        created_by=author if getattr(author, "pk", None) else None,
    )
    steps = [
        RunStep(
            run=run,
            key=step_key_for_testset(testset),
            type=StepType.INPUT,
            position=0,
            references={
                "testset": {"id": testset.pk, "slug": testset.slug},
                "testset_version": {
                    "id": testset_version.pk,
                    "slug": testset_version.slug,
                    "version": testset_version.version,
                },
            },
        ),
        invocation_step(run, application),
    ]
    steps += [annotation_step(run, revision, 2 + i) for i, revision in enumerate(revisions)]
    RunStep.objects.bulk_create(steps)
    scenarios_from_testcases(run, testset_version)
    run.total_cells = run.scenario_count * (1 + repeats * (1 + len(revisions)))
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["total_cells", "mappings", "scenario_count"])
    return run


def run_update(
    *, run: Run, name: str | None = None, description: str | None = None, tags: Any = None
) -> Run:
    """Rename a run, or replace its description or tags (any run, finished ones too: a pull
    request's number is often known only after the run)."""
    fields: dict[str, Any] = {}
    if name is not None:
        if not name.strip():
            raise InvalidInput({"name": ["must not be blank"]})
        fields["name"] = name.strip()
    if description is not None:
        fields["description"] = description
    if tags is not None:
        fields["tags"] = tags_validate(tags)
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields)
        for key, value in fields.items():
            setattr(run, key, value)
    return run


def _check_run_inputs(project, testset_version, application, revisions, repeats) -> None:
    fields: dict[str, list[str]] = {}
    if testset_version is None or testset_version.project_id != project.pk:
        fields["testset"] = ["Choose a testset of this project."]
    if application is None or application.project_id != project.pk:
        fields["application"] = ["Choose an application of this project."]
    elif application.kind == Application.Kind.LOGGED:
        fields["application"] = [
            "A logged application has no outputs to invoke; log results through the API."
        ]
    elif (
        application.kind == Application.Kind.COLUMN
        and testset_version is not None
        and application.config.get("outputs_column") not in testset_version.columns
    ):
        column = application.config.get("outputs_column")
        fields["application"] = [
            f"The testset has no column {column!r} with outputs (columns: {', '.join(testset_version.columns)})."
        ]
    if any(r.project_id != project.pk for r in revisions):
        fields["evaluators"] = ["Every evaluator must belong to this project."]
    if len({r.pk for r in revisions}) != len(revisions):
        fields["evaluators"] = ["An evaluator revision is listed twice."]
    if not 1 <= repeats <= 20:
        fields["repeats"] = ["Between 1 and 20."]
    if fields:
        raise InvalidInput(fields)


def run_start(*, run: Run) -> Run:
    """Queue a pending run. Idempotent: starting a queued or running run does nothing."""
    queued = Run.objects.filter(pk=run.pk, status=RunStatus.PENDING)
    if queued.update(status=RunStatus.QUEUED, progressed_at=timezone.now()):
        queue.run_dispatch(run.pk)
    run.refresh_from_db()
    return run


def run_submit(
    *,
    project: Project,
    testset_version: TestsetVersion | None,
    revisions: list[EvaluatorRevision] = (),
    application: Application | None = None,
    new_application: dict | None = None,
    name: str = "",
    repeats: int = 1,
    author=None,
    description: str = "",
    tags: dict[str, str] | None = None,
    max_cost_usd=None,
) -> Run:
    """Create and start a batch run in one transaction: what the page and the API both call.
    ``new_application`` (``{name, kind, config}``) creates the application inside that same
    transaction, so a refused run leaves no application behind. The cost is checked first,
    outside it (a column application still to be created is stood in for by an unsaved one)."""
    stand_in = application
    if new_application is not None:
        stand_in = Application(project=project, **new_application)
    revisions = list(revisions)
    _check_run_inputs(project, testset_version, stand_in, revisions, repeats)  # before reading rows
    tags_validate(tags)
    cost_check(project, testset_version, stand_in, revisions, repeats, max_cost_usd)
    with transaction.atomic():
        if new_application is not None:
            application = application_create(project=project, **new_application)
        run = run_create(
            project=project,
            name=name,
            testset_version=testset_version,
            application=application,
            revisions=revisions,
            repeats=repeats,
            author=author,
            description=description,
            tags=tags,
            max_cost_usd=max_cost_usd,
            cost_checked=True,
        )
        return run_start(run=run)


def run_execute_inline(*, run: Run) -> Run:
    """Run every cell in this process, without Celery (demo data, small scripted runs): the same
    units a worker would claim, claimed and computed here one after another."""
    if Run.objects.filter(pk=run.pk, status__in=(RunStatus.PENDING, RunStatus.QUEUED)).update(
        status=RunStatus.QUEUED
    ):
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(
                status=RunStatus.RUNNING, started_at=timezone.now()
            )
            units_plan(run=run, send=False)
    for lane in (Lane.RUNS, Lane.CODE, Lane.LLM):
        while unit_work(run_id=run.pk, lane=lane, heartbeat=False) is not None:
            pass
    run_finish_if_complete(run_id=run.pk)
    run.refresh_from_db()
    return run
