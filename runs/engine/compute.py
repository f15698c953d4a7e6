"""Computing the missing cells of a set of scenarios: invocations, then each evaluator step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalsite.errors import InvalidInput
from evalsite.jsonpaths import dig
from evaluators.services import Evaluation, evaluations_invoke_many
from runs.applications import Invocation, invocation_trace, invoke_many
from runs.engine.cells import Cell
from runs.models import (
    FINAL_RESULT_STATUSES,
    Result,
    ResultStatus,
    Run,
    RunStep,
    Scenario,
    Trace,
)
from runs.traces import OUTPUTS_PATH, trace_dicts


def cells_existing(run: Run, scenarios: list[Scenario]) -> dict[tuple, Result]:
    results = Result.objects.filter(
        run=run, scenario__in=scenarios, status__in=FINAL_RESULT_STATUSES
    )
    return {(r.scenario_id, r.step_key, r.repeat_idx): r for r in results.select_related("trace")}


@dataclass(frozen=True)
class Invoked:
    """What an evaluator of a scenario gets from its invocation (one repeat)."""

    outputs: Any = None
    trace_dict: dict | None = None
    ok: bool = False
    trace: Trace | None = None  # the stored trace, once there is one


NOT_INVOKED = Invoked()


def input_cells(step: RunStep | None, scenarios: list[Scenario], existing: dict) -> list[Cell]:
    if step is None:
        return []
    return [
        Cell(s, step.key, 0, ResultStatus.SUCCESS)
        for s in scenarios
        if (s.pk, step.key, 0) not in existing
    ]


def invocations_compute(
    run: Run,
    step: RunStep | None,
    scenarios: list[Scenario],
    existing: dict,
    repeat: int,
    *,
    invoke: bool = True,
) -> tuple[dict[int, Invoked], list[Cell]]:
    """Per scenario id what its invocation gave, reusing stored invocations (their traces read in
    one query) and, with ``invoke``, calling the application for the missing ones, whose cells
    come back too (without, a missing invocation counts as failed)."""
    found: dict[int, Invoked] = {}
    missing: list[Scenario] = []
    stored: dict[int, Result] = {}
    for scenario in scenarios:
        result = existing.get((scenario.pk, step.key, repeat)) if step else None
        if result is not None and result.status == ResultStatus.SUCCESS and result.trace_id:
            stored[scenario.pk] = result
        elif result is not None:
            found[scenario.pk] = NOT_INVOKED
        else:
            missing.append(scenario)
    dicts = trace_dicts(r.trace for r in stored.values())
    for scenario_id, result in stored.items():
        data = dicts[result.trace_id]
        root = next(iter(data["spans"].values()), {})
        outputs = dig(root, OUTPUTS_PATH)
        found[scenario_id] = Invoked(outputs, data, True, result.trace)
    cells: list[Cell] = []
    if missing and step is not None and invoke:
        invocations = invoke_many(run.application, [s.inputs for s in missing])
        for scenario, invocation in zip(missing, invocations, strict=True):
            data = invocation_trace(invocation, run.application.slug)
            found[scenario.pk] = Invoked(invocation.outputs, data, invocation.ok)
            cells.append(_invocation_cell(scenario, step.key, repeat, invocation, data))
    return found, cells


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


def evaluations_compute(
    run: Run,
    step: RunStep,
    scenarios: list[Scenario],
    invocations: dict[int, Invoked],
    existing: dict,
    repeat: int,
) -> list[Cell]:
    """The missing cells of one evaluator step: skipped where the invocation failed."""
    todo = [s for s in scenarios if (s.pk, step.key, repeat) not in existing]
    ready = [s for s in todo if invocations.get(s.pk, NOT_INVOKED).ok]
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
        if not invocations.get(s.pk, NOT_INVOKED).ok
    ]
    if not ready:
        return cells
    items = [(s.inputs, invocations[s.pk].outputs, invocations[s.pk].trace_dict) for s in ready]
    try:
        evaluations = evaluations_invoke_many(
            revision=step.revision,
            items=items,
            project=run.project,
            scope={"run_id": run.pk, "max_cost_usd": run.spend_cap_usd},
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
                invocation_trace=invocations[scenario.pk].trace,
            )
        )
    return cells
