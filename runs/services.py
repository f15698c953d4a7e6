"""The run engine: create a run with its steps and scenarios, fan it out over Celery in chunks,
process each scenario's missing cells, and finish the run.

Every cell is a ``Result`` keyed by ``(run, scenario, step_key, repeat_idx)``. Processing a chunk
computes only the cells that are missing, does the slow work (application calls, sandboxed
code, judges) outside any transaction, then writes traces, annotations and results in one
transaction after re-checking, under a row lock, which cells are still missing. A retried,
duplicated or resumed chunk therefore changes nothing, and one failing cell never stops the run.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.text import slugify

from evalsite.errors import InvalidInput
from evalsite.models import Project
from evaluators.models import EvaluatorRevision
from evaluators.services import Evaluation, evaluations_invoke_many
from runs import metrics
from runs.applications import Invocation, invocation_trace, invoke_many, traces_store
from runs.models import (
    ACTIVE_RUN_STATUSES,
    FINAL_RESULT_STATUSES,
    Annotation,
    Application,
    Channel,
    Origin,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    RunStep,
    Scenario,
    ScenarioStatus,
    StepType,
    Testcase,
    Testset,
    TestsetVersion,
)

logger = logging.getLogger(__name__)

PEOPLE_KINDS = ("human", "feedback")  # kinds whose cells people (or the user's code) fill in

# --- steps ------------------------------------------------------------------------------------


def step_key_for_testset(testset: Testset) -> str:
    return f"testset-{testset.slug}"


def step_key_for_application(application: Application) -> str:
    return f"application-{application.slug}"


def step_key_for_revision(revision: EvaluatorRevision) -> str:
    return f"evaluator-{revision.slug}"


def _annotation_step(run: Run, revision: EvaluatorRevision, position: int) -> RunStep:
    return RunStep(
        run=run,
        key=step_key_for_revision(revision),
        type=StepType.ANNOTATION,
        position=position,
        revision=revision,
        references={
            "evaluator": {"id": revision.evaluator_id, "slug": revision.evaluator.slug},
            "revision": revision.reference,
        },
    )


# --- create and start -------------------------------------------------------------------------


@transaction.atomic
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
) -> Run:
    """Create a batch run with its steps, mappings and one scenario per testcase (not started)."""
    revisions = list(revisions)
    _check_run_inputs(project, testset_version, application, revisions, repeats)
    testset = testset_version.testset
    run = Run.objects.create(
        project=project,
        name=name or f"{testset.name} × {application.name}",
        description=description,
        testset_version=testset_version,
        application=application,
        repeats=repeats,
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
        RunStep(
            run=run,
            key=step_key_for_application(application),
            type=StepType.INVOCATION,
            position=1,
            references={
                "application": {"id": application.pk, "slug": application.slug, "version": None}
            },
        ),
    ]
    steps += [_annotation_step(run, revision, 2 + i) for i, revision in enumerate(revisions)]
    RunStep.objects.bulk_create(steps)
    _scenarios_from_testcases(run, testset_version)
    run.total_cells = run.scenario_count * (1 + repeats * (1 + len(revisions)))
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["total_cells", "mappings", "scenario_count"])
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


def _scenarios_from_testcases(run: Run, version: TestsetVersion) -> None:
    rows = (
        Testcase.objects.filter(version=version)
        .values_list("pk", "index", "data")
        .order_by("index")
    )
    batch: list[Scenario] = []
    count = 0
    for pk, index, data in rows.iterator(chunk_size=2000):
        batch.append(
            Scenario(project_id=run.project_id, run=run, index=index, testcase_id=pk, inputs=data)
        )
        count += 1
        if len(batch) >= 2000:
            Scenario.objects.bulk_create(batch)
            batch = []
    Scenario.objects.bulk_create(batch)
    run.scenario_count = count


def run_start(*, run: Run) -> Run:
    """Queue a pending run. Idempotent: starting a queued or running run does nothing."""
    queued = Run.objects.filter(pk=run.pk, status=RunStatus.PENDING)
    if queued.update(status=RunStatus.QUEUED, progressed_at=timezone.now()):
        _queue_dispatch(run.pk)
    run.refresh_from_db()
    return run


def _queue_dispatch(run_id: int) -> None:
    from runs.tasks import run_dispatch

    transaction.on_commit(lambda: run_dispatch.delay(run_id))


# --- dispatch and process ---------------------------------------------------------------------


def chunk_size() -> int:
    return getattr(settings, "EVALSITE_RUN_CHUNK_SIZE", 250)


def run_dispatch(*, run_id: int) -> int:
    """Split the unfinished scenarios into chunks and queue one task per chunk. Returns how many."""
    from runs.tasks import run_chunk

    now = timezone.now()
    claimed = Run.objects.filter(
        pk=run_id, status__in=(RunStatus.QUEUED, RunStatus.RUNNING)
    ).update(status=RunStatus.RUNNING, progressed_at=now)
    if not claimed:
        return 0
    Run.objects.filter(pk=run_id, started_at__isnull=True).update(started_at=now)
    indexes = list(
        Scenario.objects.filter(
            run_id=run_id, status__in=(ScenarioStatus.PENDING, ScenarioStatus.RUNNING)
        )
        .order_by("index")
        .values_list("index", flat=True)
    )
    size = chunk_size()
    chunks = [
        (indexes[i], indexes[min(i + size, len(indexes)) - 1]) for i in range(0, len(indexes), size)
    ]
    for first, last in chunks:
        run_chunk.delay(run_id, first, last)
    if not chunks:
        run_progress_update(run_id=run_id)
    return len(chunks)


@dataclass
class Cell:
    scenario: Scenario
    step_key: str
    repeat_idx: int
    status: str
    trace_dict: dict | None = None
    evaluation: Evaluation | None = None
    error: dict | None = None
    duration_ms: float | None = None
    revision: EvaluatorRevision | None = None
    invocation_trace: Any = None  # a stored invocation's Trace: what an annotation links to


def scenarios_process(*, run_id: int, first: int, last: int) -> int:
    """Compute and store the missing cells of scenarios ``first..last``. Returns cells written."""
    run = Run.objects.select_related("application", "project", "testset_version__testset").get(
        pk=run_id
    )
    if run.status != RunStatus.RUNNING:
        return 0
    scenarios = list(
        run.scenarios.filter(index__gte=first, index__lte=last)
        .exclude(
            status__in=(ScenarioStatus.SUCCESS, ScenarioStatus.ERRORS, ScenarioStatus.CANCELLED)
        )
        .order_by("index")
    )
    if not scenarios:
        run_progress_update(run_id=run_id)
        return 0
    steps = list(run.steps.select_related("revision__evaluator"))
    existing = _existing_cells(run, scenarios)
    cells = _compute_cells(run, steps, scenarios, existing)
    written = _cells_write(run, scenarios, cells)
    run_progress_update(run_id=run_id)
    return written


def _existing_cells(run: Run, scenarios: list[Scenario]) -> dict[tuple, Result]:
    results = Result.objects.filter(
        run=run, scenario__in=scenarios, status__in=FINAL_RESULT_STATUSES
    )
    return {(r.scenario_id, r.step_key, r.repeat_idx): r for r in results.select_related("trace")}


def _compute_cells(run, steps, scenarios, existing) -> list[Cell]:
    input_step = next((s for s in steps if s.type == StepType.INPUT), None)
    invocation_step = next((s for s in steps if s.type == StepType.INVOCATION), None)
    annotation_steps = [s for s in steps if s.type == StepType.ANNOTATION]
    cells: list[Cell] = []
    if input_step:
        cells += [
            Cell(s, input_step.key, 0, ResultStatus.SUCCESS)
            for s in scenarios
            if (s.pk, input_step.key, 0) not in existing
        ]
    for repeat in range(run.repeats):
        invocations = _invocations(run, invocation_step, scenarios, existing, repeat, cells)
        for step in annotation_steps:
            cells += _evaluate_step(run, step, scenarios, invocations, existing, repeat)
    return cells


def _invocations(
    run, step, scenarios, existing, repeat, cells
) -> dict[int, tuple[Any, dict | None, bool, Any]]:
    """Per scenario id: (outputs, trace dict, ok, stored trace). Reuses stored invocations (their
    traces read in one query), makes missing ones."""
    from runs.ingest import trace_dicts

    found: dict[int, tuple[Any, dict | None, bool, Any]] = {}
    missing: list[Scenario] = []
    stored: dict[int, Result] = {}
    for scenario in scenarios:
        result = existing.get((scenario.pk, step.key, repeat)) if step else None
        if (
            result is not None
            and result.status == ResultStatus.SUCCESS
            and result.trace is not None
        ):
            stored[scenario.pk] = result
        elif result is not None:
            found[scenario.pk] = (None, None, False, None)
        else:
            missing.append(scenario)
    dicts = trace_dicts(r.trace for r in stored.values())
    for scenario_id, result in stored.items():
        data = dicts[result.trace_id]
        root = next(iter(data["spans"].values()), {})
        outputs = root.get("attributes", {}).get("ag", {}).get("data", {}).get("outputs")
        found[scenario_id] = (outputs, data, True, result.trace)
    if missing and step is not None:
        invocations = invoke_many(run.application, [s.inputs for s in missing])
        for scenario, invocation in zip(missing, invocations, strict=True):
            data = invocation_trace(invocation, run.application.slug)
            found[scenario.pk] = (invocation.outputs, data, invocation.ok, None)
            cells.append(_invocation_cell(scenario, step.key, repeat, invocation, data))
    return found


def _invocation_cell(scenario, step_key, repeat, invocation: Invocation, data) -> Cell:
    status = ResultStatus.SUCCESS if invocation.ok else ResultStatus.ERROR
    return Cell(
        scenario,
        step_key,
        repeat,
        status,
        trace_dict=data,
        error=invocation.error,
        duration_ms=invocation.duration_ms,
    )


def _evaluate_step(run, step, scenarios, invocations, existing, repeat) -> list[Cell]:
    todo = [s for s in scenarios if (s.pk, step.key, repeat) not in existing]
    ready = [s for s in todo if invocations.get(s.pk, (None, None, False, None))[2]]
    cells = [
        Cell(
            s,
            step.key,
            repeat,
            ResultStatus.SKIPPED,
            revision=step.revision,
            error={
                "code": "invocation_failed",
                "type": "skipped",
                "message": "The application invocation failed; there is nothing to evaluate.",
                "stacktrace": "",
            },
        )
        for s in todo
        if s not in ready
    ]
    if not ready:
        return cells
    items = [(s.inputs, invocations[s.pk][0], invocations[s.pk][1]) for s in ready]
    try:
        evaluations = evaluations_invoke_many(
            revision=step.revision, items=items, project=run.project, scope={"run_id": run.pk}
        )
    except InvalidInput as exc:
        # The revision's own parameters are invalid (e.g. a kind changed since): an error per cell.
        evaluations = [
            Evaluation(
                "error",
                error={
                    "code": "invalid_parameters",
                    "type": "InvalidInput",
                    "message": str(exc),
                    "stacktrace": "",
                },
            )
        ] * len(ready)
    for scenario, evaluation in zip(ready, evaluations, strict=True):
        status = {"success": ResultStatus.SUCCESS, "error": ResultStatus.ERROR}.get(
            evaluation.status, ResultStatus.SKIPPED
        )
        cells.append(
            Cell(
                scenario,
                step.key,
                repeat,
                status,
                evaluation=evaluation,
                error=evaluation.error,
                duration_ms=evaluation.duration_ms,
                revision=step.revision,
                invocation_trace=invocations[scenario.pk][3],
            )
        )
    return cells


@transaction.atomic
def _cells_write(run: Run, scenarios: list[Scenario], cells: list[Cell]) -> int:
    locked = list(
        Scenario.objects.select_for_update().filter(pk__in=[s.pk for s in scenarios]).order_by("pk")
    )
    done = set(
        Result.objects.filter(scenario__in=locked, status__in=FINAL_RESULT_STATUSES).values_list(
            "scenario_id", "step_key", "repeat_idx"
        )
    )
    cells = [c for c in cells if (c.scenario.pk, c.step_key, c.repeat_idx) not in done]
    traces = traces_store(run.project, [c.trace_dict for c in cells if c.trace_dict is not None])
    trace_of = {}
    for cell, trace in zip([c for c in cells if c.trace_dict is not None], traces, strict=True):
        trace_of[(cell.scenario.pk, cell.repeat_idx)] = trace
    annotations = _annotations_for(run, cells, trace_of)
    now = timezone.now()
    results = [
        Result(
            project_id=run.project_id,
            run=run,
            scenario=cell.scenario,
            step_key=cell.step_key,
            repeat_idx=cell.repeat_idx,
            status=cell.status,
            trace=trace_of.get((cell.scenario.pk, cell.repeat_idx)) if cell.trace_dict else None,
            annotation=annotations.get(id(cell)),
            testcase_id=cell.scenario.testcase_id
            if cell.repeat_idx == 0 and not cell.trace_dict and not cell.revision
            else None,
            error=cell.error,
            duration_ms=cell.duration_ms,
            updated_at=now,
        )
        for cell in cells
    ]
    Result.objects.bulk_create(
        results,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["run", "scenario", "step_key", "repeat_idx"],
        update_fields=["status", "trace", "annotation", "error", "duration_ms", "updated_at"],
    )
    _scenario_statuses_update(run, locked)
    return len(results)


def _annotations_for(run: Run, cells: list[Cell], trace_of: dict) -> dict[int, Annotation]:
    made: dict[int, Annotation] = {}
    for cell in cells:
        if cell.evaluation is None or cell.evaluation.status != "success":
            continue
        revision = cell.revision
        # The judge's own trace holds the full prompt; the annotation keeps a link, not a copy.
        details = {k: v for k, v in cell.evaluation.details.items() if k != "rendered_prompt"}
        made[id(cell)] = Annotation(
            project_id=run.project_id,
            trace=_annotated_trace(cell, trace_of),
            outputs=cell.evaluation.outputs,
            evaluator_id=revision.evaluator_id,
            evaluator_slug=revision.evaluator.slug,
            revision=revision,
            origin=Origin.AUTO,
            channel=Channel.API,
            judge_trace_id=details.get("judge_trace_id"),
            details={k: v for k, v in (("logs", cell.evaluation.logs), ("details", details)) if v},
        )
    Annotation.objects.bulk_create(made.values(), batch_size=1000)
    return made


def _annotated_trace(cell: Cell, trace_of: dict):
    return (
        trace_of.get((cell.scenario.pk, cell.repeat_idx))  # invoked in this chunk
        or cell.invocation_trace  # invoked earlier (an evaluator added to a finished run)
        or cell.scenario.trace  # online runs: the evaluated trace itself
    )


def _scenario_statuses_update(run: Run, scenarios: list[Scenario]) -> None:
    # Cells people fill in (human and logged feedback) are never waited for.
    computed = [
        s
        for s in run.steps.exclude(type=StepType.INPUT).select_related("revision")
        if s.revision is None or s.revision.kind not in PEOPLE_KINDS
    ]
    per_step = run.repeats * len(computed) + 1
    counts = (
        Result.objects.filter(scenario__in=scenarios)
        .values("scenario_id")
        .annotate(
            final=Count("id", filter=Q(status__in=FINAL_RESULT_STATUSES)),
            errors=Count("id", filter=Q(status=ResultStatus.ERROR)),
        )
    )
    by_id = {row["scenario_id"]: row for row in counts}
    now = timezone.now()
    for scenario in scenarios:
        row = by_id.get(scenario.pk, {"final": 0, "errors": 0})
        if row["errors"]:
            scenario.status = ScenarioStatus.ERRORS
        elif row["final"] >= per_step:
            scenario.status = ScenarioStatus.SUCCESS
        else:
            scenario.status = ScenarioStatus.RUNNING
        scenario.updated_at = now
    Scenario.objects.bulk_update(scenarios, ["status", "updated_at"])
    metrics.scenarios_refresh(run=run, scenarios=scenarios)


def scenarios_fail(*, run_id: int, first: int, last: int, exc: BaseException) -> None:
    """An engine failure on a chunk: record it on every missing cell so the run can still end."""
    run = Run.objects.get(pk=run_id)
    error = {
        "code": "engine_error",
        "type": type(exc).__name__,
        "message": str(exc) or type(exc).__name__,
        "stacktrace": "".join(traceback.format_exception(exc)),
    }
    scenarios = list(run.scenarios.filter(index__gte=first, index__lte=last))
    existing = _existing_cells(run, scenarios)
    steps = list(run.steps.all())
    cells = [
        Cell(s, step.key, repeat, ResultStatus.ERROR, error=error)
        for s in scenarios
        for step in steps
        for repeat in (range(1) if step.type == StepType.INPUT else range(run.repeats))
        if (s.pk, step.key, repeat) not in existing
    ]
    _cells_write(run, scenarios, cells)
    run_progress_update(run_id=run_id)


# --- progress and the end ---------------------------------------------------------------------


def run_progress_update(*, run_id: int) -> Run:
    """Recount cells (counting, not incrementing, so it is right however often it runs) and end
    the run when every cell is final."""
    counts = Result.objects.filter(run_id=run_id).aggregate(
        done=Count("id", filter=Q(status__in=FINAL_RESULT_STATUSES)),
        errors=Count("id", filter=Q(status=ResultStatus.ERROR)),
    )
    Run.objects.filter(pk=run_id).update(
        done_cells=counts["done"], error_cells=counts["errors"], progressed_at=timezone.now()
    )
    run = Run.objects.select_related("application").get(pk=run_id)
    if (
        run.status == RunStatus.RUNNING
        and not _is_logged(run)
        and not run.is_online
        and run.total_cells
        and run.done_cells >= run.total_cells
    ):
        run_finish(run=run)
    return run


def _is_logged(run: Run) -> bool:
    """A run whose cells the client logs ends when the client closes it, never on its own."""
    return run.application is None or run.application.kind == Application.Kind.LOGGED


def _final_status(run: Run) -> str:
    """success; errors when some cells failed; failure when nothing but the inputs succeeded."""
    if not run.error_cells:
        return RunStatus.SUCCESS
    succeeded = Result.objects.filter(run=run, status=ResultStatus.SUCCESS).exclude(
        step_key__in=run.steps.filter(type=StepType.INPUT).values("key")
    )
    return RunStatus.ERRORS if succeeded.exists() else RunStatus.FAILURE


def run_finish(*, run: Run) -> None:
    status = _final_status(run)
    if Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
        status=status, finished_at=timezone.now()
    ):
        run.status = status
        metrics.run_refresh(run=run)


def run_execute_inline(*, run: Run) -> Run:
    """Run every cell in this process, without Celery (demo data, small scripted runs)."""
    Run.objects.filter(pk=run.pk, status__in=(RunStatus.PENDING, RunStatus.QUEUED)).update(
        status=RunStatus.RUNNING, started_at=timezone.now()
    )
    indexes = list(run.scenarios.order_by("index").values_list("index", flat=True))
    size = chunk_size()
    for i in range(0, len(indexes), size):
        chunk = indexes[i : i + size]
        scenarios_process(run_id=run.pk, first=chunk[0], last=chunk[-1])
    run_progress_update(run_id=run.pk)
    run.refresh_from_db()
    return run


def run_mark_failed(*, run_id: int, error: dict) -> None:
    Run.objects.filter(pk=run_id, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.FAILURE, error=error, finished_at=timezone.now()
    )


# --- operations on a run ------------------------------------------------------------------------


def _locked(run: Run) -> Run:
    """The run's current row, locked: status checks must not trust a stale object."""
    return Run.objects.select_for_update().get(pk=run.pk)


def _check_open(run: Run) -> None:
    if run.closed:
        raise InvalidInput({"run": ["This run is closed and read-only."]})


def run_cancel(*, run: Run) -> Run:
    now = timezone.now()
    if Run.objects.filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.CANCELLED, finished_at=now
    ):
        run.scenarios.filter(status=ScenarioStatus.PENDING).update(
            status=ScenarioStatus.CANCELLED, updated_at=now
        )
    run.refresh_from_db()
    return run


@transaction.atomic
def run_retry_failed(*, run: Run) -> int:
    """Forget errored and skipped cells (and what depended on a failed invocation) and run them
    again. Returns how many cells will be recomputed."""
    run = _locked(run)
    _check_open(run)
    if run.is_active:
        raise InvalidInput({"run": ["Wait for the run to end (or cancel it) before retrying."]})
    failed = Result.objects.filter(
        run=run, status__in=(ResultStatus.ERROR, ResultStatus.SKIPPED, ResultStatus.CANCELLED)
    )
    scenario_ids = set(failed.values_list("scenario_id", flat=True))
    cancelled = set(
        run.scenarios.filter(status=ScenarioStatus.CANCELLED).values_list("pk", flat=True)
    )
    count = failed.count()
    failed.delete()
    scenario_ids |= cancelled
    if not scenario_ids:
        return 0
    Scenario.objects.filter(pk__in=scenario_ids).update(
        status=ScenarioStatus.PENDING, updated_at=timezone.now()
    )
    _requeue(run)
    return count


@transaction.atomic
def run_add_evaluators(*, run: Run, revisions: list[EvaluatorRevision]) -> Run:
    """Add annotation steps to a run; only the new cells are computed (outputs are reused)."""
    run = _locked(run)
    _check_open(run)
    if run.is_active:
        raise InvalidInput({"run": ["Wait for the run to end before adding evaluators."]})
    keys = set(run.steps.values_list("key", flat=True))
    new = [r for r in revisions if step_key_for_revision(r) not in keys]
    if any(r.project_id != run.project_id for r in new):
        raise InvalidInput({"evaluators": ["Every evaluator must belong to this project."]})
    if not new:
        raise InvalidInput({"evaluators": ["These evaluators are already in the run."]})
    position = run.steps.count()
    RunStep.objects.bulk_create([_annotation_step(run, r, position + i) for i, r in enumerate(new)])
    run.total_cells += run.scenario_count * run.repeats * len(new)
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["total_cells", "mappings"])
    run.scenarios.update(status=ScenarioStatus.PENDING, updated_at=timezone.now())
    _requeue(run)
    return run


def _requeue(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.QUEUED, finished_at=None, error=None, progressed_at=timezone.now()
    )
    _queue_dispatch(run.pk)


@transaction.atomic
def run_close(*, run: Run) -> Run:
    """Close a run: read-only from now on. A logged (SDK) run ends here, with its metrics."""
    run = _locked(run)
    logged = _is_logged(run)
    if run.is_active and not logged:
        raise InvalidInput({"run": ["A running run cannot be closed; cancel it first."]})
    if run.is_active:
        run = run_progress_update(run_id=run.pk)
        Run.objects.filter(pk=run.pk).update(status=_final_status(run), finished_at=timezone.now())
        run.refresh_from_db()
        metrics.run_refresh(run=run)
    Run.objects.filter(pk=run.pk).update(closed=True)
    run.refresh_from_db()
    return run


def runs_resume_stalled() -> list[int]:
    """Re-dispatch running runs that have not progressed for a while (a lost message, a broker
    that restarted empty, a worker killed before it acknowledged). Safe: chunks are idempotent."""
    stale_before = timezone.now() - timedelta(
        seconds=getattr(settings, "EVALSITE_RUN_STALL_SECONDS", 600)
    )
    stalled = list(
        Run.objects.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING), is_online=False)
        .filter(
            Q(progressed_at__lt=stale_before)
            | Q(progressed_at__isnull=True, created_at__lt=stale_before)
        )
        .values_list("pk", flat=True)
    )
    for run_id in stalled:
        logger.warning(
            "run %s has not progressed since before %s; dispatching it again", run_id, stale_before
        )
        Run.objects.filter(pk=run_id).update(progressed_at=timezone.now())
        _queue_dispatch(run_id)
    return stalled


def run_slug_name(name: str) -> str:
    return slugify(name)[:100]


# --- runs driven by the user's own code (SDK style) -------------------------------------------


@transaction.atomic
def run_create_logged(
    *,
    project: Project,
    name: str,
    testset_version: TestsetVersion | None = None,
    application: Application | None = None,
    revisions: list[EvaluatorRevision] = (),
    author=None,
    description: str = "",
) -> Run:
    """A run whose cells the client logs itself (SDK style). It is running at once; scenarios
    come from the testset when one is given, or are added through ``scenarios_add``."""
    revisions = list(revisions)
    if testset_version is not None and testset_version.project_id != project.pk:
        raise InvalidInput({"testset": ["Choose a testset of this project."]})
    if application is not None and application.project_id != project.pk:
        raise InvalidInput({"application": ["Choose an application of this project."]})
    if any(r.project_id != project.pk for r in revisions):
        raise InvalidInput({"evaluators": ["Every evaluator must belong to this project."]})
    now = timezone.now()
    run = Run.objects.create(
        project=project,
        name=name or "Logged run",
        description=description,
        testset_version=testset_version,
        application=application,
        status=RunStatus.RUNNING,
        started_at=now,
        progressed_at=now,
        created_by=author if getattr(author, "pk", None) else None,
    )
    input_key = step_key_for_testset(testset_version.testset) if testset_version else "inputs"
    references = (
        {"testset": {"id": testset_version.testset_id, "slug": testset_version.testset.slug}}
        if testset_version
        else {}
    )
    steps = [
        RunStep(run=run, key=input_key, type=StepType.INPUT, position=0, references=references)
    ]
    if application is not None:
        steps.append(
            RunStep(
                run=run,
                key=step_key_for_application(application),
                type=StepType.INVOCATION,
                position=1,
                references={
                    "application": {"id": application.pk, "slug": application.slug, "version": None}
                },
            )
        )
    steps += [_annotation_step(run, r, 2 + i) for i, r in enumerate(revisions)]
    RunStep.objects.bulk_create(steps)
    if testset_version is not None:
        _scenarios_from_testcases(run, testset_version)
    run.total_cells = run.scenario_count * len(steps)
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["total_cells", "mappings", "scenario_count"])
    return run


@transaction.atomic
def scenarios_add(*, run: Run, rows: list[dict[str, Any]]) -> list[Scenario]:
    """Add scenarios (``{"inputs": {...}}`` each) to a logged run."""
    run = _locked(run)
    _check_open(run)
    if not run.is_active:
        raise InvalidInput({"run": ["The run has ended; create a new one."]})
    for i, row in enumerate(rows):
        if not isinstance(row.get("inputs", {}), dict):
            raise InvalidInput({f"scenarios.{i}.inputs": ["must be a JSON object"]})
    start = (run.scenarios.order_by("-index").values_list("index", flat=True).first() or -1) + 1
    scenarios = Scenario.objects.bulk_create(
        Scenario(
            project_id=run.project_id, run=run, index=start + i, inputs=row.get("inputs") or {}
        )
        for i, row in enumerate(rows)
    )
    steps = run.steps.count()
    Run.objects.filter(pk=run.pk).update(
        scenario_count=run.scenario_count + len(rows),
        total_cells=run.total_cells + steps * len(rows),
    )
    return scenarios


@transaction.atomic
def results_log(
    *, run: Run, entries: list[dict[str, Any]], author=None, channel: str = Channel.SDK
) -> list[Result]:
    """Log cells of a run: ``{scenario, step_key, repeat_idx, trace_id | outputs | error}`` each.

    The input step needs nothing more; the invocation step takes a trace already sent to
    /api/v1/traces or plain outputs (recorded as a trace); an annotation step takes the
    evaluator's outputs (an annotation is made, checked against the revision's schema) or an
    error. Logging the same cell again replaces it (upsert on the cell's key).
    """
    from runs.annotations import annotation_create

    run = _locked(run)
    _check_open(run)
    steps = {s.key: s for s in run.steps.select_related("revision__evaluator")}
    by_index = {s.index: s for s in run.scenarios.all()} if entries else {}
    results: list[Result] = []
    invoked: dict[tuple[int, int], Any] = {}  # traces logged in this very request
    order = {StepType.INPUT: 0, StepType.INVOCATION: 1, StepType.ANNOTATION: 2}
    # Invocations first, so an annotation logged in the same request finds its trace.
    ranked = sorted(
        enumerate(entries),
        key=lambda e: order.get(getattr(steps.get(e[1].get("step_key")), "type", ""), 3),
    )
    for i, entry in ranked:
        scenario = by_index.get(entry.get("scenario"))
        step = steps.get(entry.get("step_key"))
        if scenario is None:
            raise InvalidInput(
                {
                    f"results.{i}.scenario": [
                        f"No scenario with index {entry.get('scenario')!r} in this run."
                    ]
                }
            )
        if step is None:
            raise InvalidInput(
                {f"results.{i}.step_key": [f"Unknown step; this run has: {', '.join(steps)}."]}
            )
        result = _result_from_entry(
            run, scenario, step, entry, i, author, channel, annotation_create, invoked
        )
        if result.trace is not None and step.type == StepType.INVOCATION:
            invoked[(scenario.pk, result.repeat_idx)] = result.trace
        results.append(result)
    Result.objects.bulk_create(
        results,
        update_conflicts=True,
        unique_fields=["run", "scenario", "step_key", "repeat_idx"],
        update_fields=[
            "status",
            "trace",
            "annotation",
            "error",
            "duration_ms",
            "updated_at",
            "testcase",
        ],
    )
    touched = list({r.scenario_id: r.scenario for r in results}.values())
    _scenario_statuses_update(run, touched)
    transaction.on_commit(lambda: run_progress_update(run_id=run.pk))
    return results


def _result_from_entry(
    run, scenario, step, entry, i, author, channel, annotation_create, invoked
) -> Result:
    from runs.models import Trace

    repeat = int(entry.get("repeat_idx") or 0)
    result = Result(
        project_id=run.project_id,
        run=run,
        scenario=scenario,
        step_key=step.key,
        repeat_idx=repeat,
        status=ResultStatus.SUCCESS,
        duration_ms=entry.get("duration_ms"),
        updated_at=timezone.now(),
    )
    if entry.get("error"):
        error = (
            entry["error"] if isinstance(entry["error"], dict) else {"message": str(entry["error"])}
        )
        result.status = ResultStatus.ERROR
        result.error = {
            "code": error.get("code", "logged_error"),
            "type": error.get("type", "logged_error"),
            "message": error.get("message", ""),
            "stacktrace": error.get("stacktrace", ""),
        }
        return result
    if step.type == StepType.INPUT:
        result.testcase_id = scenario.testcase_id
        return result
    trace = None
    if entry.get("trace_id"):
        trace = Trace.objects.filter(project_id=run.project_id, trace_id=entry["trace_id"]).first()
        if trace is None:
            raise InvalidInput(
                {
                    f"results.{i}.trace_id": [
                        f"No trace {entry['trace_id']!r}; send it to /api/v1/traces first."
                    ]
                }
            )
    if step.type == StepType.INVOCATION:
        if trace is None:
            if "outputs" not in entry:
                raise InvalidInput(
                    {f"results.{i}.outputs": ["Give the invocation's trace_id or its outputs."]}
                )
            invocation = Invocation(
                scenario.inputs,
                outputs=entry["outputs"],
                duration_ms=float(entry.get("duration_ms") or 0),
            )
            trace = traces_store(
                run.project, [invocation_trace(invocation, step.key.removeprefix("application-"))]
            )[0]
        result.trace = trace
        return result
    if "outputs" not in entry:
        raise InvalidInput(
            {f"results.{i}.outputs": ["Give the evaluator's outputs (or an error)."]}
        )
    annotated = (
        trace or invoked.get((scenario.pk, repeat)) or _scenario_invocation_trace(scenario, repeat)
    )
    try:
        result.annotation = annotation_create(
            project=run.project,
            evaluator=step.revision.evaluator_id,
            revision=step.revision.pk,
            outputs=entry["outputs"],
            trace=annotated,
            origin=Origin.CUSTOM,
            channel=channel,
            author=author,
        )
    except InvalidInput as exc:
        raise InvalidInput(
            {f"results.{i}.{k}": v for k, v in exc.fields.items()}, status=exc.status
        )
    return result


def _scenario_invocation_trace(scenario: Scenario, repeat: int):
    result = (
        Result.objects.filter(scenario=scenario, repeat_idx=repeat, trace__isnull=False)
        .select_related("trace")
        .first()
    )
    return result.trace if result else None
