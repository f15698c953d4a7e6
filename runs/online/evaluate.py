"""Online evaluation: matching freshly ingested traces against live rules, evaluating them (or a
session rule's sessions) in batches, and the rule's bucketed metrics."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, QuerySet
from django.utils import timezone

from evalsite.errors import InvalidInput
from evaluators.models import ModelConnection
from evaluators.services import (
    Evaluation,
    evaluations_invoke_many,
    session_evaluations_invoke_many,
)
from runs import conf, engine, queue
from runs.models import (
    Lane,
    OnlineRule,
    Result,
    ResultStatus,
    RuleTarget,
    Run,
    RunMetrics,
    RunStatus,
    Scenario,
    SessionRuleState,
    StepType,
    Trace,
    UnitStatus,
    WorkUnit,
)
from runs.online.rules import FINAL_SCENARIO, online_rule_pause, rule_candidates
from runs.traces import trace_dict, trace_spans
from runs.traces.sessions import messages as session_messages
from runs.traces.sessions import session_dict, session_traces_until, spans_stored_bytes

logger = logging.getLogger(__name__)


def _rules_live(project_id: int) -> QuerySet[OnlineRule]:
    """The project's live trace rules (session rules wait for their sessions to go idle)."""
    return OnlineRule.objects.filter(
        project_id=project_id, active=True, run__status=RunStatus.RUNNING, target=RuleTarget.TRACE
    ).select_related("project", "run", "revision__evaluator")


def online_dispatch(*, project_id: int, trace_ids: list[int]) -> int:
    """Match freshly ingested traces against the project's active rules and queue their
    evaluation in chunks. Returns how many (rule, trace) evaluations were queued."""
    traces = Trace.objects.filter(project_id=project_id, pk__in=trace_ids)
    queued = 0
    for rule in _rules_live(project_id):
        queued += units_send(online_units_plan(rule=rule, traces=traces))
    return queued


def units_send(units: list[WorkUnit]) -> int:
    """A message per unit (after the commit); returns how many scenarios they cover."""
    for unit in units:
        queue.units_work(unit.run_id, unit.lane)
    return sum(unit.last - unit.first + 1 for unit in units)


def evaluations_queue(rule: OnlineRule, ids: list[int]) -> None:
    size = conf.online_chunk_size()
    for start in range(0, len(ids), size):
        queue.online_evaluate(rule.pk, ids[start : start + size])


def online_evaluate_ids(*, rule_id: int, trace_ids: list[int]) -> int:
    """A backfill chunk: units for the traces, sent to the workers of their lane."""
    rule = rule_live(rule_id)
    if rule is None or rule.for_sessions:
        return 0
    return units_send(online_units_plan(rule=rule, traces=Trace.objects.filter(pk__in=trace_ids)))


def online_evaluate_traces(*, rule: OnlineRule, traces) -> int:
    """Evaluate those of ``traces`` the rule takes (its project, filter and sample) and has not
    evaluated yet: their scenarios and work units are made, then the units are claimed and
    computed here like any worker would (a unit someone else holds is left to them). Returns
    the number of cells written. A paused rule evaluates nothing."""
    rule = rule_live(rule.pk)
    if rule is None or _pause_if_connection_failing(rule):
        return 0
    online_units_plan(rule=rule, traces=traces)
    return units_work_here(rule)


def units_work_here(rule: OnlineRule) -> int:
    """Claim and compute the rule's queued units in this process, like a worker would (a unit
    someone else holds is left to them). Returns the cells written."""
    written = 0
    process = online_unit_process
    while (
        cells := engine.unit_work(run_id=rule.run_id, lane=_lane(rule), process=process)
    ) is not None:
        written += cells
    return written


def online_units_plan(*, rule: OnlineRule, traces) -> list[WorkUnit]:
    """Scenarios for the traces the rule takes that have none yet, and one queued work unit per
    chunk of them (on the llm lane for model judges, else ingest). A trace that already has a
    scenario is its unit's business: duplicated dispatches make nothing twice."""
    if rule.for_sessions:
        return []
    ids = [t.pk for t in traces]
    found = list(
        rule_candidates(rule, Trace.objects.filter(pk__in=ids)).order_by("start_time", "pk")
    )
    if not found:
        return []
    return _scenarios_ensure(rule, found, _root_attributes(found))


def rule_live(rule_id: int) -> OnlineRule | None:
    """The rule, when it is active and its live run is running (else None: do nothing)."""
    rule = (
        OnlineRule.objects.select_related("project", "run", "revision__evaluator")
        .filter(pk=rule_id)
        .first()
    )
    if rule is None or not rule.active or rule.run is None or rule.run.status != RunStatus.RUNNING:
        return None
    return rule


def online_unit_process(*, unit: WorkUnit, owner: str) -> int:
    """Compute a claimed unit of an online run: the rule's evaluator over its scenarios' traces."""
    rule = rule_live(
        OnlineRule.objects.filter(run_id=unit.run_id).values_list("pk", flat=True).first() or 0
    )
    if rule is None or _pause_if_connection_failing(rule):
        engine.unit_complete(unit=unit, owner=owner, status=UnitStatus.CANCELLED)
        return 0
    scenarios = list(
        Scenario.objects.filter(run_id=unit.run_id, index__gte=unit.first, index__lte=unit.last)
        .exclude(status__in=FINAL_SCENARIO)
        .select_related("trace", "session")
        .order_by("index")
    )
    roots = _root_attributes([s.trace for s in scenarios if s.trace is not None])
    cells = _cells(rule, scenarios, roots) if scenarios else []
    written = engine.cells_write(rule.run, scenarios, cells, unit=unit, owner=owner).cells
    engine.unit_complete(unit=unit, owner=owner)
    _pause_if_connection_failing(rule)  # this batch may have found the key revoked
    return written


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
    spans = trace_spans(traces).filter(parent_id="")
    spans = spans.values_list("trace_id", "span_id", "attributes")
    return {pk: attributes for pk, span_id, attributes in spans if (pk, span_id) in wanted}


def _ag_data(attributes: dict | None) -> dict:
    data = ((attributes or {}).get("ag") or {}).get("data") or {}
    return data if isinstance(data, dict) else {}


def _scenarios_ensure(rule: OnlineRule, traces: list[Trace], roots: dict) -> list[WorkUnit]:
    """One scenario per new trace (with its input cell pointing at the trace) and the units
    that evaluate them, created under the run's row lock so indexes never collide and a trace
    never gets two scenarios. Returns the new units (queued; their messages go on commit)."""
    run = rule.run
    with transaction.atomic():
        Run.objects.select_for_update(no_key=True).filter(pk=run.pk).first()
        by_trace = {s.trace_id: s for s in Scenario.objects.filter(run=run, trace__in=traces)}
        missing = [t for t in traces if t.pk not in by_trace]
        now = timezone.now()
        rows = [
            {
                "trace": trace,
                "inputs": _ag_data(roots.get(trace.pk)).get("inputs") or {},
                # Buckets group scenarios by this: when the trace happened, not when it was
                # evaluated, so a backfill fills the past buckets.
                "created_at": trace.start_time or now,
            }
            for trace in missing
        ]
        return scenarios_append(rule, rows)[1]


def scenarios_append(rule: OnlineRule, rows: list[dict]) -> tuple[list[Scenario], list[WorkUnit]]:
    """New scenarios at the end of the rule's live run (``rows``: Scenario fields such as
    ``trace``, ``session``, ``inputs``, ``created_at``), each with its input cell pointing at its
    trace, and the queued units that evaluate them. The caller holds the run's row lock."""
    if not rows:
        return [], []
    run = rule.run
    input_key = run.steps.filter(type=StepType.INPUT).values_list("key", flat=True).first()
    last = run.scenarios.aggregate(last=Max("index"))["last"]
    first = 0 if last is None else last + 1
    now = timezone.now()
    created = Scenario.objects.bulk_create(
        Scenario(project_id=run.project_id, run=run, index=first + i, updated_at=now, **row)
        for i, row in enumerate(rows)
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
    return created, _units_create(rule, [s.index for s in created])


def _lane(rule: OnlineRule) -> str:
    """Model judges wait on the network on the llm lane; the rest runs on ingest."""
    step = rule.run.steps.select_related("revision").get(type=StepType.ANNOTATION)
    return Lane.LLM if engine.step_lane(step) == Lane.LLM else Lane.INGEST


def _units_create(rule: OnlineRule, indexes: list[int]) -> list[WorkUnit]:
    step = rule.run.steps.get(type=StepType.ANNOTATION)
    lane, size, now = _lane(rule), conf.online_chunk_size(), timezone.now()
    units = [
        WorkUnit(
            run=rule.run,
            lane=lane,
            first=indexes[i],
            last=indexes[min(i + size, len(indexes)) - 1],
            step_keys=[step.key],
            sent_at=now,
        )
        for i in range(0, len(indexes), size)
    ]
    WorkUnit.objects.bulk_create(units)
    return units


def _cells(rule: OnlineRule, scenarios: list[Scenario], roots: dict) -> list[engine.Cell]:
    step = rule.run.steps.select_related("revision__evaluator").get(type=StepType.ANNOTATION)
    answers: dict[int, Evaluation] = {}
    if rule.for_sessions:
        invoke = session_evaluations_invoke_many
        cuts = _session_cuts(rule, scenarios)
        items = {}
        for s in scenarios:
            session = _session_as_judged(s, cuts.get(s.pk))
            if isinstance(session, Evaluation):
                answers[s.pk] = session
            else:
                items[s.pk] = (s.inputs, _ag_data(roots.get(s.trace_id)).get("outputs"), session)
    else:
        invoke = evaluations_invoke_many
        items = {
            s.pk: (s.inputs, _ag_data(roots.get(s.trace_id)).get("outputs"), trace_dict(s.trace))
            for s in scenarios
        }
    if items:
        answers.update(zip(items, _invoke(rule, step, invoke, list(items.values())), strict=True))
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
        for scenario, evaluation in ((s, answers[s.pk]) for s in scenarios)
    ]


def _invoke(rule: OnlineRule, step, invoke, items: list) -> list[Evaluation]:
    try:
        return invoke(
            revision=step.revision, items=items, project=rule.project, scope={"rule_id": rule.pk}
        )
    except InvalidInput as exc:
        return [_failed("invalid_parameters", exc)] * len(items)
    except Exception as exc:
        logger.exception("online rule %s: the evaluator failed as a whole", rule.pk)
        return [_failed("engine_error", exc)] * len(items)


def _session_cuts(rule: OnlineRule, scenarios: list[Scenario]) -> dict[int, tuple]:
    """(activity, trace count) each scenario's session had when it was claimed, from the rule's
    state rows that still point at it (one query). A state row the session's next idle period
    has taken over points elsewhere; such a scenario falls back on its ``created_at``, the
    judged ``last_activity`` too."""
    states = SessionRuleState.objects.filter(rule=rule, scenario__in=scenarios)
    rows = states.values_list("scenario_id", "evaluated_activity", "evaluated_traces")
    return {scenario: (activity, count) for scenario, activity, count in rows}


def _session_as_judged(scenario: Scenario, cut: tuple | None) -> dict | Evaluation:
    """The scenario's session as it was claimed (``cut``: its activity and trace count then;
    turns that came after belong to the next time the session goes idle), or an error
    ``session_too_large`` when its spans are larger than evaluators take, found before loading
    them. A session deleted since is judged as its trace alone."""
    if scenario.session is None:
        dicts = [trace_dict(scenario.trace)] if scenario.trace is not None else []
        return {"session_id": "", "traces": dicts, "messages": session_messages(dicts)}
    activity, count = cut or (scenario.created_at, None)
    traces = session_traces_until(scenario.session, activity=activity, count=count)
    stored, limit = spans_stored_bytes(traces), settings.EVALSITE_MAX_BODY_BYTES
    if stored > limit:
        return _failed(
            "session_too_large",
            f"The session's {len(traces):,} turns hold {stored:,} bytes of span attributes "
            f"(as stored, compressed); evaluators take sessions up to {limit:,} bytes "
            "(EVALSITE_MAX_BODY_BYTES). It was not loaded.",
        )
    return session_dict(scenario.session, traces)


def _failed(code: str, reason: BaseException | str) -> Evaluation:
    """An error (never a score), typed by the exception or, for a plain reason, by its code."""
    if isinstance(reason, BaseException):
        kind = type(reason).__name__
    else:
        kind = "".join(part.title() for part in code.split("_"))
    error = {"code": code, "type": kind, "message": str(reason), "stacktrace": ""}
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
