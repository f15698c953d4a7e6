"""Runs driven by the user's own code (SDK style): open, add scenarios, log cells."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project
from evaluators.models import EvaluatorRevision
from runs import metrics
from runs.annotations import annotation_create
from runs.applications import Invocation, invocation_trace
from runs.engine.cells import cells_replace_counted, scenario_statuses_update
from runs.engine.locks import run_check_open, run_locked
from runs.engine.steps import (
    annotation_step,
    invocation_step,
    scenarios_from_testcases,
    step_key_for_testset,
)
from runs.engine.tags import tags_validate
from runs.models import (
    Application,
    Channel,
    Origin,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    RunStep,
    Scenario,
    StepType,
    TestsetVersion,
    Trace,
)
from runs.traces import scenario_invocation_trace, traces_store


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
    tags: dict[str, str] | None = None,
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
    tags = tags_validate(tags)
    now = timezone.now()
    run = Run.objects.create(
        project=project,
        tags=tags,
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
        steps.append(invocation_step(run, application))
    steps += [annotation_step(run, r, 2 + i) for i, r in enumerate(revisions)]
    RunStep.objects.bulk_create(steps)
    if testset_version is not None:
        scenarios_from_testcases(run, testset_version)
    run.total_cells = run.scenario_count * len(steps)
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["total_cells", "mappings", "scenario_count"])
    return run


@transaction.atomic
def scenarios_add(*, run: Run, rows: list[dict[str, Any]]) -> list[Scenario]:
    """Add scenarios (``{"inputs": {...}}`` each) to a logged run."""
    run = run_locked(run)
    run_check_open(run)
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

    run = run_locked(run)
    run_check_open(run)
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
    cells_replace_counted(
        run,
        results,
        lambda: Result.objects.bulk_create(
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
        ),
    )
    touched = list({r.scenario_id: r.scenario for r in results}.values())
    scenario_statuses_update(run, touched)
    return results


def _result_from_entry(
    run, scenario, step, entry, i, author, channel, annotation_create, invoked
) -> Result:

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
        trace or invoked.get((scenario.pk, repeat)) or scenario_invocation_trace(scenario, repeat)
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
