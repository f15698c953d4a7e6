"""Dispatching a run into units, processing a claimed unit, failing a unit for good, and the
sweeper's round. Slow work (application calls, sandboxed code, model calls) happens outside any
transaction; each write re-checks the lease inside its own."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from evaluators.sandbox import runner_here
from runs.engine.cells import Cell, LeaseLost, cells_write
from runs.engine.compute import (
    cells_existing,
    evaluations_compute,
    input_cells,
    invocations_compute,
)
from runs.engine.progress import run_finish_if_complete, runs_unfinished_finish
from runs.engine.units import (
    Heartbeat,
    owner_new,
    runs_undispatched,
    unit_claim,
    unit_complete,
    unit_mark_failed,
    unit_release,
    units_plan,
    units_requeue_expired,
    units_resend_lost,
)
from runs.models import (
    Lane,
    ResultStatus,
    Run,
    RunStatus,
    Scenario,
    ScenarioStatus,
    StepType,
    UnitStatus,
    WorkUnit,
)

logger = logging.getLogger(__name__)
TRANSIENT = (OperationalError, InterfaceError)


def run_dispatch(*, run_id: int) -> int:
    """Claim a queued run (``queued`` -> ``running``, once) and plan its units. A second message
    for the same run finds it running and does nothing. Returns how many units were queued."""
    with transaction.atomic():
        now = timezone.now()
        claimed = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING, progressed_at=now
        )
        if not claimed:
            return 0
        Run.objects.filter(pk=run_id, started_at__isnull=True).update(started_at=now)
        run = Run.objects.get(pk=run_id)
        queued = units_plan(run=run)[Lane.RUNS]
    if not queued:
        run_finish_if_complete(run_id=run_id)
    return queued


def unit_work(
    *, run_id: int, lane: str, heartbeat: bool = True, process: Callable | None = None
) -> int | None:
    """Claim the next unit of the run's lane and compute it (with ``process``, by default the
    batch engine's ``unit_process``). Returns the cells written, or None when there was nothing
    to claim (someone holds every unit, or all are done)."""
    owner = owner_new()
    unit = unit_claim(run_id=run_id, lane=lane, owner=owner)
    if unit is None:
        return None
    process = process or unit_process
    try:
        # A code unit runs on a code worker: its sandbox is here, not another task away.
        with (
            Heartbeat(unit, owner) if heartbeat else nullcontext(),
            runner_here() if lane == Lane.CODE else nullcontext(),
        ):
            written = process(unit=unit, owner=owner)
    except LeaseLost:
        logger.warning("unit %s: the lease was lost; its work is left to the new holder", unit.pk)
        return 0
    except TRANSIENT:
        unit_release(unit=unit, owner=owner)
        raise
    except Exception as exc:
        # A bug, not a blip: record it on the unit's missing cells so the run still ends.
        logger.exception("unit %s failed", unit)
        unit_fail(unit=unit, exc=exc)
        return 0
    return written


def unit_process(*, unit: WorkUnit, owner: str) -> int:
    run = Run.objects.select_related("application", "project").get(pk=unit.run_id)
    if run.status != RunStatus.RUNNING:
        unit_complete(unit=unit, owner=owner, status=UnitStatus.CANCELLED)
        return 0
    scenarios = _unit_scenarios(unit)
    steps = list(run.steps.select_related("revision__evaluator").order_by("position", "id"))
    invocation_step = next((s for s in steps if s.type == StepType.INVOCATION), None)
    mine = set(unit.step_keys)
    evaluator_steps = [s for s in steps if s.key in mine]
    existing = cells_existing(run, scenarios)
    written = 0
    invoked = {}
    if unit.lane == Lane.RUNS:
        # Inputs and invocations are written first, on their own: a unit redone after its worker
        # died reuses them instead of calling the application again.
        input_step = next((s for s in steps if s.type == StepType.INPUT), None)
        cells = input_cells(input_step, scenarios, existing)
        for repeat in range(run.repeats):
            invoked[repeat], made = invocations_compute(
                run, invocation_step, scenarios, existing, repeat
            )
            cells += made
        # Statuses wait for the evaluators' write below: until then every scenario is running.
        result = cells_write(run, scenarios, cells, unit=unit, owner=owner, statuses=False)
        written += result.cells
        _with_stored_traces(invoked, result.traces)
    else:  # the runs lane invoked them: read what it stored, never call the application
        for repeat in range(run.repeats):
            invoked[repeat], _ = invocations_compute(
                run, invocation_step, scenarios, existing, repeat, invoke=False
            )
    cells = []
    for step in evaluator_steps:
        for repeat in range(run.repeats):
            cells += evaluations_compute(run, step, scenarios, invoked[repeat], existing, repeat)
    if cells or unit.lane == Lane.RUNS:  # the runs lane also sets the scenarios' statuses here
        written += cells_write(run, scenarios, cells, unit=unit, owner=owner).cells
    unit_complete(unit=unit, owner=owner)
    return written


def _unit_scenarios(unit: WorkUnit) -> list[Scenario]:
    return list(
        Scenario.objects.filter(run_id=unit.run_id, index__gte=unit.first, index__lte=unit.last)
        .exclude(status=ScenarioStatus.CANCELLED)
        .select_related("trace")
        .order_by("index")
    )


def _with_stored_traces(invoked: dict, traces: dict) -> None:
    """Annotations link to the invocation's stored trace, which exists once it is written."""
    for repeat, by_scenario in invoked.items():
        for scenario_id, item in list(by_scenario.items()):
            trace = traces.get((scenario_id, repeat))
            if trace is not None and item.trace is None:
                by_scenario[scenario_id] = replace(item, trace=trace)


def unit_fail(*, unit: WorkUnit, exc: BaseException | None = None, error: dict | None = None):
    """A unit that cannot be computed: ``engine_error`` on each of its missing cells, so the run
    still ends, and the unit marked failed with the reason."""
    error = error or {
        "code": "engine_error",
        "type": type(exc).__name__,
        "message": str(exc) or type(exc).__name__,
        "stacktrace": "".join(traceback.format_exception(exc)),
    }
    run = Run.objects.get(pk=unit.run_id)
    scenarios = _unit_scenarios(unit)
    existing = cells_existing(run, scenarios)
    steps = list(run.steps.all())
    if unit.lane == Lane.RUNS:
        keys = {s.key for s in steps if s.type != StepType.ANNOTATION} | set(unit.step_keys)
    else:
        keys = set(unit.step_keys)
    cells = [
        Cell(s, step.key, repeat, ResultStatus.ERROR, error=error)
        for s in scenarios
        for step in steps
        if step.key in keys
        for repeat in (range(1) if step.type == StepType.INPUT else range(run.repeats))
        if (s.pk, step.key, repeat) not in existing
    ]
    unit_mark_failed(unit=unit, error=error)
    cells_write(run, scenarios, cells)
    if unit.lane == Lane.RUNS:  # the units that waited for its invocations fail with it
        for waiting in WorkUnit.objects.filter(
            run_id=unit.run_id, first=unit.first, status=UnitStatus.WAITING
        ):
            unit_fail(unit=waiting, error=error)


def units_sweep() -> dict[str, int]:
    """One round of the sweeper (beat, every ``EVALSITE_UNIT_SWEEP_SECONDS``)."""
    requeued, exhausted = units_requeue_expired()
    for unit in exhausted:
        logger.error("unit %s killed its worker %s times; failing it", unit, unit.attempts)
        unit_fail(
            unit=unit,
            error={
                "code": "engine_error",
                "type": "WorkerLost",
                "message": f"The worker computing these scenarios died {unit.attempts} times "
                "(killed, out of memory, or its host vanished); they were given up.",
                "stacktrace": "",
            },
        )
    return {
        "requeued": len(requeued),
        "failed": len(exhausted),
        "resent": units_resend_lost(),
        "dispatched": len(runs_undispatched()),
        "finished": len(runs_unfinished_finish()),
    }
