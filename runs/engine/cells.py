"""Writing cells: traces, annotations and results in one transaction, idempotent on the cell's key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from evaluators.models import EvaluatorRevision
from evaluators.services import Evaluation
from runs import queue
from runs.bulk import copy_rows, ids_reserve
from runs.engine.progress import run_finish
from runs.engine.steps import PEOPLE_KINDS
from runs.engine.units import unit_hold
from runs.models import (
    FINAL_RESULT_STATUSES,
    Annotation,
    Channel,
    Origin,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    Scenario,
    StepType,
)
from runs.traces import traces_store


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


class LeaseLost(Exception):
    """The unit's lease went to another worker: what this one computed is dropped."""


@dataclass
class Written:
    cells: int = 0
    errors: int = 0
    traces: dict = field(default_factory=dict)  # (scenario id, repeat) -> stored invocation Trace
    run_done: bool = False


def cells_write(
    run: Run,
    scenarios: list[Scenario],
    cells: list[Cell],
    *,
    unit=None,
    owner: str = "",
    statuses: bool = True,
) -> Written:
    """Write cells in one transaction: traces, annotations, results (one upsert on the cell's
    key), scenario statuses and the run's counters (incremented, never recounted). Cells that
    became final meanwhile are dropped, so a retried or duplicated computation changes nothing.
    With a ``unit``, the write happens only while ``owner`` holds its lease (else ``LeaseLost``).
    After the commit the read model is refreshed (debounced) and a complete run is finished."""
    with transaction.atomic():
        if unit is not None and not unit_hold(unit=unit, owner=owner):
            raise LeaseLost(f"unit {unit.pk} is no longer held by {owner}")
        written = _write(run, scenarios, cells, statuses)
    touched = [s.pk for s in scenarios]
    queue.read_model_refresh(run.pk, touched)
    if written.run_done:
        run_finish(run=Run.objects.select_related("application").get(pk=run.pk))
    return written


def scenarios_locked(scenario_ids: list[int]) -> list[int]:
    """Lock the scenarios whose cells are about to be written, in primary key order, until the
    transaction ends; their ids. Two writers of one scenario's cells wait for each other.

    ``FOR NO KEY UPDATE``, not ``FOR UPDATE``: rows that only point at a scenario (the read
    model's statistics, inserted by a refresh) check their foreign key at commit with a key-share
    lock, which ``FOR UPDATE`` blocks. A refresh holding the run's row and committing such rows
    would wait for this writer, which waits for the run's row to add its counters: a deadlock,
    seen when a judge's cells landed during a refresh."""
    return list(
        Scenario.objects.select_for_update(no_key=True)
        .filter(pk__in=scenario_ids)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _write(run: Run, scenarios: list[Scenario], cells: list[Cell], statuses: bool) -> Written:
    locked = scenarios_locked([s.pk for s in scenarios])
    done = set(
        Result.objects.filter(scenario_id__in=locked, status__in=FINAL_RESULT_STATUSES).values_list(
            "scenario_id", "step_key", "repeat_idx"
        )
    )
    cells = [c for c in cells if (c.scenario.pk, c.step_key, c.repeat_idx) not in done]
    invoked = [c for c in cells if c.trace_dict is not None]
    traces = traces_store(run.project, [c.trace_dict for c in invoked])
    trace_of = {
        (c.scenario.pk, c.repeat_idx): trace for c, trace in zip(invoked, traces, strict=True)
    }
    annotations = _annotations_for(run, cells, trace_of)
    now = timezone.now()
    results = (
        (
            run.project_id,
            run.pk,
            cell.scenario.pk,
            cell.step_key,
            cell.repeat_idx,
            cell.status,
            trace_of[(cell.scenario.pk, cell.repeat_idx)].pk if cell.trace_dict else None,
            annotations.get(id(cell)),
            cell.scenario.testcase_id
            if cell.repeat_idx == 0 and not cell.trace_dict and not cell.revision
            else None,
            cell.error,
            cell.duration_ms,
            now,
            now,
        )
        for cell in cells
    )
    # Under the scenarios' locks no one else writes these cells, and final ones were dropped
    # above: clearing any non-final row of the same key lets one COPY insert them all.
    Result.objects.filter(scenario_id__in=locked).exclude(status__in=FINAL_RESULT_STATUSES).filter(
        step_key__in={c.step_key for c in cells}
    ).delete()
    copy_rows(Result, RESULT_COLUMNS, results)
    if statuses:
        scenario_statuses_update(run, locked)
    errors = sum(1 for c in cells if c.status == ResultStatus.ERROR)
    # Last, so the run row is locked only for the moment before the commit.
    done_cells, total, status = run_counters_add(run_id=run.pk, done=len(cells), errors=errors)
    run_done = bool(cells) and status == RunStatus.RUNNING and total and done_cells >= total
    return Written(len(cells), errors, trace_of, run_done and not run.is_online)


def run_counters_add(*, run_id: int, done: int, errors: int) -> tuple[int, int, str]:
    """Add to a run's cell counters; returns (done, total, status) after the addition."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_run SET done_cells = GREATEST(done_cells + %s, 0),"
            " error_cells = GREATEST(error_cells + %s, 0), progressed_at = %s"
            " WHERE id = %s RETURNING done_cells, total_cells, status",
            [done, errors, timezone.now(), run_id],
        )
        return cursor.fetchone()


def _annotations_for(run: Run, cells: list[Cell], trace_of: dict) -> dict[int, int]:
    """Annotations of the successful evaluations, inserted with one COPY: cell -> annotation id."""
    judged = [c for c in cells if c.evaluation is not None and c.evaluation.status == "success"]
    ids = ids_reserve(Annotation, len(judged))
    now = timezone.now()
    rows = []
    for cell, pk in zip(judged, ids, strict=True):
        revision = cell.revision
        # The judge's own trace holds the full prompt; the annotation keeps a link, not a copy.
        details = {k: v for k, v in cell.evaluation.details.items() if k != "rendered_prompt"}
        trace = _annotated_trace(cell, trace_of)
        rows.append(
            (
                pk,
                run.project_id,
                trace.pk if trace else None,
                "",
                cell.evaluation.outputs,
                revision.evaluator_id,
                revision.evaluator.slug,
                revision.pk,
                Origin.AUTO,
                Channel.API,
                details.get("judge_trace_id"),
                {k: v for k, v in (("logs", cell.evaluation.logs), ("details", details)) if v},
                [],
                now,
                now,
            )
        )
    copy_rows(Annotation, ANNOTATION_COLUMNS, rows)
    return {id(cell): pk for cell, pk in zip(judged, ids, strict=True)}


RESULT_COLUMNS = (
    "project_id", "run_id", "scenario_id", "step_key", "repeat_idx", "status", "trace_id",
    "annotation_id", "testcase_id", "error", "duration_ms", "created_at", "updated_at",
)  # fmt: skip
ANNOTATION_COLUMNS = (
    "id", "project_id", "trace_id", "span_id", "outputs", "evaluator_id", "evaluator_slug",
    "revision_id", "origin", "channel", "judge_trace_id", "details", "history", "created_at",
    "updated_at",
)  # fmt: skip


def _annotated_trace(cell: Cell, trace_of: dict):
    return (
        trace_of.get((cell.scenario.pk, cell.repeat_idx))  # invoked in this chunk
        or cell.invocation_trace  # invoked earlier (an evaluator added to a finished run)
        or cell.scenario.trace  # online runs: the evaluated trace itself
    )


_STATUSES_SQL = """
UPDATE runs_scenario s SET updated_at = %(now)s, status = CASE
        WHEN coalesce(c.final, 0) < %(per)s THEN 'running'
        WHEN c.errors > 0 THEN 'errors' ELSE 'success' END
FROM unnest(%(ids)s::bigint[]) AS i(id)
LEFT JOIN (
    SELECT scenario_id, count(*) FILTER (WHERE status = ANY(%(final)s)) AS final,
           count(*) FILTER (WHERE status = 'error') AS errors
    FROM runs_result WHERE scenario_id = ANY(%(ids)s) GROUP BY scenario_id
) c ON c.scenario_id = i.id
WHERE s.id = i.id
"""


def scenario_statuses_update(run: Run, scenarios: list[Scenario] | list[int]) -> None:
    """Each scenario's status from its cells, in one statement: running until every computed
    cell is final, then errors or success. Cells people fill in (human and logged feedback)
    are never waited for."""
    computed = [
        s
        for s in run.steps.exclude(type=StepType.INPUT).select_related("revision")
        if s.revision is None or s.revision.kind not in PEOPLE_KINDS
    ]
    params = {
        "now": timezone.now(),
        "per": run.repeats * len(computed) + 1,
        "ids": [getattr(s, "pk", s) for s in scenarios],
        "final": list(FINAL_RESULT_STATUSES),
    }
    with connection.cursor() as cursor:
        cursor.execute(_STATUSES_SQL, params)


def cells_replace_counted(run: Run, results: list[Result], write) -> None:
    """Run ``write()`` (which upserts ``results``) and move the run's counters by what changed:
    a cell logged again replaces the old one, so only the difference counts."""
    keys = {(r.scenario_id, r.step_key, r.repeat_idx) for r in results}
    before = [
        status
        for *key, status in Result.objects.filter(
            run=run, scenario_id__in={k[0] for k in keys}
        ).values_list("scenario_id", "step_key", "repeat_idx", "status")
        if tuple(key) in keys
    ]
    write()
    final = set(FINAL_RESULT_STATUSES)
    after = [
        r.status for r in {(r.scenario_id, r.step_key, r.repeat_idx): r for r in results}.values()
    ]
    done = sum(s in final for s in after) - sum(s in final for s in before)
    errors = after.count(ResultStatus.ERROR) - before.count(ResultStatus.ERROR)
    run_counters_add(run_id=run.pk, done=done, errors=errors)
    queue.read_model_refresh(run.pk, sorted({r.scenario_id for r in results}))
