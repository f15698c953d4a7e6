"""Online evaluation: matching freshly ingested traces against live rules, evaluating them in
batches, and the rule's bucketed metrics."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q, QuerySet
from django.utils import timezone

from evalsite.errors import InvalidInput
from evaluators.models import ModelConnection
from evaluators.services import Evaluation, evaluations_invoke_many
from runs import conf, engine, queue
from runs.models import (
    OnlineRule,
    Result,
    ResultStatus,
    Run,
    RunMetrics,
    RunStatus,
    Scenario,
    ScenarioStatus,
    Span,
    StepType,
    Trace,
)
from runs.online.rules import online_rule_pause, rule_candidates
from runs.traces import trace_dict

logger = logging.getLogger(__name__)


def _rules_live(project_id: int) -> QuerySet[OnlineRule]:
    return OnlineRule.objects.filter(
        project_id=project_id, active=True, run__status=RunStatus.RUNNING
    ).select_related("project", "run", "revision__evaluator")


def online_dispatch(*, project_id: int, trace_ids: list[int]) -> int:
    """Match freshly ingested traces against the project's active rules and queue their
    evaluation in chunks. Returns how many (rule, trace) evaluations were queued."""
    traces = Trace.objects.filter(project_id=project_id, pk__in=trace_ids)
    queued = 0
    for rule in _rules_live(project_id):
        ids = list(rule_candidates(rule, traces).order_by("pk").values_list("pk", flat=True))
        evaluations_queue(rule, ids)
        queued += len(ids)
    return queued


def evaluations_queue(rule: OnlineRule, ids: list[int]) -> None:
    size = conf.online_chunk_size()
    for start in range(0, len(ids), size):
        queue.online_evaluate(rule.pk, ids[start : start + size])


def online_evaluate_ids(*, rule_id: int, trace_ids: list[int]) -> int:
    rule = OnlineRule.objects.filter(pk=rule_id).first()
    if rule is None:
        return 0
    return online_evaluate_traces(rule=rule, traces=Trace.objects.filter(pk__in=trace_ids))


def online_evaluate_traces(*, rule: OnlineRule, traces) -> int:
    """Evaluate those of ``traces`` the rule takes (its project, filter and sample) and has not
    evaluated yet. Returns the number of cells written. A paused rule evaluates nothing."""
    rule = (
        OnlineRule.objects.select_related("project", "run", "revision__evaluator")
        .filter(pk=rule.pk)
        .first()
    )
    if rule is None or not rule.active or rule.run is None or rule.run.status != RunStatus.RUNNING:
        return 0
    if _pause_if_connection_failing(rule):
        return 0
    ids = [t.pk for t in traces]
    found = list(
        rule_candidates(rule, Trace.objects.filter(pk__in=ids)).order_by("start_time", "pk")
    )
    if not found:
        return 0
    roots = _root_attributes(found)
    claimed = _claim(_scenarios_ensure(rule, found, roots))
    if not claimed:
        return 0
    try:
        cells = _cells(rule, claimed, roots)
        written = engine.cells_write(rule.run, claimed, cells)  # counters, debounced metrics
    except BaseException:
        _release(claimed)
        raise
    _pause_if_connection_failing(rule)  # this batch may have found the key revoked
    return written.cells


def _pause_if_connection_failing(rule: OnlineRule) -> bool:
    """A rule whose model connection fails authentication stops, with the reason visible,
    instead of recording an error for every new trace until someone notices."""
    ref = (rule.revision.parameters or {}).get("connection")
    if not ref:
        return False
    connection = ModelConnection.objects.for_project(rule.project).by_ref(ref).first()
    if connection is None or not connection.is_failing:
        return False
    online_rule_pause(
        rule=rule,
        reason=f"Model connection {connection.name} is failing: {connection.failing_reason}",
    )
    return True


def _root_attributes(traces: list[Trace]) -> dict[int, dict]:
    """The attributes of each trace's root span (one query)."""
    wanted = {(t.pk, t.root_span_id) for t in traces}
    spans = Span.objects.filter(trace_id__in=[t.pk for t in traces], parent_id="").values_list(
        "trace_id", "span_id", "attributes"
    )
    return {pk: attributes for pk, span_id, attributes in spans if (pk, span_id) in wanted}


def _ag_data(attributes: dict | None) -> dict:
    data = ((attributes or {}).get("ag") or {}).get("data") or {}
    return data if isinstance(data, dict) else {}


def _scenarios_ensure(rule: OnlineRule, traces: list[Trace], roots: dict) -> list[Scenario]:
    """One scenario per trace (with its input cell pointing at the trace), created under the
    run's row lock so indexes never collide and a trace never gets two."""
    run = rule.run
    input_key = run.steps.filter(type=StepType.INPUT).values_list("key", flat=True).first()
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()
        by_trace = {s.trace_id: s for s in Scenario.objects.filter(run=run, trace__in=traces)}
        missing = [t for t in traces if t.pk not in by_trace]
        if missing:
            last = run.scenarios.aggregate(last=Max("index"))["last"]
            first = 0 if last is None else last + 1
            now = timezone.now()
            created = Scenario.objects.bulk_create(
                Scenario(
                    project_id=run.project_id,
                    run=run,
                    index=first + i,
                    trace=trace,
                    inputs=_ag_data(roots.get(trace.pk)).get("inputs") or {},
                    # Buckets group scenarios by this: when the trace happened, not when it was
                    # evaluated, so a backfill fills the past buckets.
                    created_at=trace.start_time or now,
                    updated_at=now,
                )
                for i, trace in enumerate(missing)
            )
            Result.objects.bulk_create(
                Result(
                    project_id=run.project_id,
                    run=run,
                    scenario=scenario,
                    step_key=input_key,
                    status=ResultStatus.SUCCESS,
                    trace=scenario.trace,
                    updated_at=now,
                )
                for scenario in created
            )
            Run.objects.filter(pk=run.pk).update(
                scenario_count=F("scenario_count") + len(created),
                total_cells=F("total_cells") + 2 * len(created),
            )
            engine.run_counters_add(run_id=run.pk, done=len(created), errors=0)  # input cells
            by_trace.update({s.trace_id: s for s in created})
    by_pk = {t.pk: t for t in traces}
    scenarios = [by_trace[t.pk] for t in traces]
    for scenario in scenarios:
        scenario.trace = by_pk[scenario.trace_id]
    return scenarios


def _claim(scenarios: list[Scenario]) -> list[Scenario]:
    """Take the scenarios nobody is evaluating: pending ones, or running ones whose worker
    went quiet longer than a task may live (so it is surely dead). Two dispatches of one trace
    never both call the evaluator."""
    stale = timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT + 30)
    with transaction.atomic():
        free = set(
            Scenario.objects.select_for_update(skip_locked=True)
            .filter(pk__in=[s.pk for s in scenarios])
            .filter(
                Q(status=ScenarioStatus.PENDING)
                | Q(status=ScenarioStatus.RUNNING, updated_at__lt=stale)
            )
            .values_list("pk", flat=True)
        )
        Scenario.objects.filter(pk__in=free).update(
            status=ScenarioStatus.RUNNING, updated_at=timezone.now()
        )
    return [s for s in scenarios if s.pk in free]


def _release(scenarios: list[Scenario]) -> None:
    Scenario.objects.filter(pk__in=[s.pk for s in scenarios], status=ScenarioStatus.RUNNING).update(
        status=ScenarioStatus.PENDING, updated_at=timezone.now()
    )


def _cells(rule: OnlineRule, scenarios: list[Scenario], roots: dict) -> list[engine.Cell]:
    step = rule.run.steps.select_related("revision__evaluator").get(type=StepType.ANNOTATION)
    items = [
        (s.inputs, _ag_data(roots.get(s.trace_id)).get("outputs"), trace_dict(s.trace))
        for s in scenarios
    ]
    try:
        evaluations = evaluations_invoke_many(
            revision=step.revision, items=items, project=rule.project, scope={"rule_id": rule.pk}
        )
    except InvalidInput as exc:
        evaluations = [_failed("invalid_parameters", exc)] * len(items)
    except Exception as exc:
        logger.exception("online rule %s: the evaluator failed as a whole", rule.pk)
        evaluations = [_failed("engine_error", exc)] * len(items)
    statuses = {"success": ResultStatus.SUCCESS, "error": ResultStatus.ERROR}
    return [
        engine.Cell(
            scenario,
            step.key,
            0,
            statuses.get(evaluation.status, ResultStatus.SKIPPED),
            evaluation=evaluation,
            error=evaluation.error,
            duration_ms=evaluation.duration_ms,
            revision=step.revision,
        )
        for scenario, evaluation in zip(scenarios, evaluations, strict=True)
    ]


def _failed(code: str, exc: BaseException) -> Evaluation:
    error = {"code": code, "type": type(exc).__name__, "message": str(exc), "stacktrace": ""}
    return Evaluation("error", error=error)


def online_buckets(*, rule: OnlineRule, limit: int = 48) -> list[dict]:
    """The newest buckets, oldest first: ``{start, end, data}`` (data as in RunMetrics)."""
    rows = RunMetrics.objects.filter(run_id=rule.run_id, bucket_start__isnull=False).order_by(
        "-bucket_start"
    )[:limit]
    step = timedelta(seconds=rule.bucket_seconds)
    return [
        {"start": row.bucket_start, "end": row.bucket_start + step, "data": row.data}
        for row in reversed(rows)
    ]
