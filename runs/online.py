"""Online evaluation: rules that evaluate production traces as they arrive, and over the past.

A rule is an evaluator revision, a trace filter (root name, attributes, time) and a sampling
rate. Sampling is decided by the trace id alone (a hash mapped to [0, 1)), so a trace is always
in or always out, for every rule with the same rate, in Python and in SQL alike.

Each rule owns a live run (``is_online``, always ``running``): one scenario per evaluated trace,
an input step ``query-<rule slug>`` whose result points at the trace, and one annotation step
``evaluator-<revision slug>``. Ingestion queues ``online_dispatch`` a few seconds after commit;
it matches the new traces against the active rules and queues ``online_evaluate_ids`` per chunk.
A trace is evaluated once per rule: scenarios are unique per (run, trace), a scenario is claimed
with a conditional update before its evaluation, and the engine's cell writes skip cells
already written. docs/online.md is the user-facing description.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import BigIntegerField, Exists, F, Func, Max, OuterRef, Q, QuerySet
from django.utils import timezone
from django.utils.text import slugify
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Project
from evaluators.kinds import get_kind
from evaluators.models import EvaluatorRevision
from evaluators.services import Evaluation, evaluations_invoke_many
from runs import metrics, services
from runs.ingest import trace_dict, trace_list
from runs.models import (
    OnlineRule,
    Result,
    ResultStatus,
    Run,
    RunMetrics,
    RunStatus,
    RunStep,
    Scenario,
    ScenarioStatus,
    Span,
    StepType,
    Trace,
)

logger = logging.getLogger(__name__)

# Traces evalsite records itself (run invocations, judge calls) are never production traffic.
ONLINE_SOURCES = ("api", "otlp")
FINAL_SCENARIO = (ScenarioStatus.SUCCESS, ScenarioStatus.ERRORS)
SAMPLE_BITS = 52  # 13 hex digits of md5: exact in a float8 and in a Python float
BUCKET_CHOICES = ((300, "5 minutes"), (3600, "1 hour"), (21600, "6 hours"), (86400, "1 day"))


def delay_seconds() -> float:
    """How long after ingestion a trace is matched: spans of one trace sent in a few requests
    are all there by then."""
    return float(getattr(settings, "EVALSITE_ONLINE_DELAY_SECONDS", 5.0))


def chunk_size() -> int:
    return int(getattr(settings, "EVALSITE_ONLINE_CHUNK_SIZE", 50))


# --- the filter -------------------------------------------------------------------------------


class RuleFilter(BaseModel):
    """Which traces a rule evaluates. Every condition given must hold."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("", max_length=300, description="The root span's name, exactly.")
    attributes: dict[str, str | bool | int | float] = Field(
        default_factory=dict,
        description="Dotted path -> value; a trace matches when any span has it.",
    )
    since: datetime | None = Field(None, description="Traces that started at or after this.")
    until: datetime | None = Field(None, description="Traces that started before this.")

    @field_validator("attributes")
    @classmethod
    def _paths(cls, value: dict) -> dict:
        if len(value) > 20:
            raise ValueError("at most 20 attribute conditions")
        for path in value:
            if not path.strip() or len(path) > 300 or ".." in path or path.strip(".") != path:
                raise ValueError(f"{path!r} is not a dotted path such as ag.meta.env")
        return value

    @field_validator("since", "until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @model_validator(mode="after")
    def _window(self) -> RuleFilter:
        if self.since and self.until and self.since >= self.until:
            raise ValueError("since must be before until")
        return self

    def stored(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def attribute_values(self) -> dict[str, str]:
        """As ``trace_list`` takes them: text, where "2" and "true" also match the JSON value."""
        return {
            path: value if isinstance(value, str) else _json_text(value)
            for path, value in self.attributes.items()
        }


def _json_text(value: bool | int | float) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def filter_parse(raw: Any) -> RuleFilter:
    if raw is None:
        return RuleFilter()
    if not isinstance(raw, dict):
        raise InvalidInput({"filter": ["must be a JSON object: {name, attributes, since, until}"]})
    try:
        return RuleFilter.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc, prefix="filter"))


def rule_slug(rule: OnlineRule) -> str:
    return slugify(rule.name)[:90] or f"rule-{rule.pk}"


# --- sampling ---------------------------------------------------------------------------------


def online_sampled(trace_id: str, rate: float) -> bool:
    """Whether a trace is in the sample: md5 of its id, read as a number in [0, 1), below rate."""
    if rate >= 1:
        return True
    digest = hashlib.md5(trace_id.encode(), usedforsecurity=False).hexdigest()
    return int(digest[: SAMPLE_BITS // 4], 16) < rate * 2**SAMPLE_BITS


class _SamplePoint(Func):
    """The same number as ``online_sampled`` computes, in SQL (so backfills filter in the
    database): the first 13 hex digits of md5(trace_id) as a 52-bit integer."""

    template = "('x' || substr(md5(%(expressions)s), 1, 13))::bit(52)::bigint"
    output_field = BigIntegerField()


def _sampled(traces: QuerySet[Trace], rate: float) -> QuerySet[Trace]:
    if rate >= 1:
        return traces
    return traces.alias(sample_point=_SamplePoint(F("trace_id"))).filter(
        sample_point__lt=rate * 2**SAMPLE_BITS
    )


# --- matching ---------------------------------------------------------------------------------


def online_rule_matches(*, rule: OnlineRule, traces: QuerySet[Trace] | None = None) -> QuerySet:
    """The rule's project's production traces that match its filter (sampling aside), among
    ``traces`` when given. A trace needs its root span: a child that arrived first waits."""
    found = filter_parse(rule.filter)
    matched = trace_list(
        project=rule.project,
        name=found.name,
        since=found.since,
        until=found.until,
        attributes=found.attribute_values(),
    ).filter(source__in=ONLINE_SOURCES)
    matched = matched.filter(Exists(Span.objects.filter(trace_id=OuterRef("pk"), parent_id="")))
    if traces is not None:
        matched = matched.filter(pk__in=traces.values("pk"))
    return matched


def _candidates(rule: OnlineRule, traces: QuerySet[Trace] | None = None) -> QuerySet[Trace]:
    """Matching, sampled, and not yet evaluated by the rule's live run."""
    done = Scenario.objects.filter(
        run_id=rule.run_id, trace_id=OuterRef("pk"), status__in=FINAL_SCENARIO
    )
    return _sampled(online_rule_matches(rule=rule, traces=traces), rule.sampling_rate).filter(
        ~Exists(done)
    )


# --- rules --------------------------------------------------------------------------------------


def _check(project: Project, revision: EvaluatorRevision | None, rate: Any, bucket: Any) -> None:
    fields: dict[str, list[str]] = {}
    if revision is None or revision.project_id != project.pk:
        fields["evaluator"] = ["Choose an evaluator of this project."]
    else:
        kind = get_kind(revision.kind)
        if not kind.executes:
            fields["evaluator"] = [
                f"{kind.name} evaluators do not run (people annotate), so they cannot be "
                "online rules; choose one that evaluates by itself."
            ]
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate <= 1:
        fields["sampling_rate"] = ["A fraction above 0 and at most 1 (0.1 evaluates 10 %)."]
    if not isinstance(bucket, int) or isinstance(bucket, bool) or not 60 <= bucket <= 7 * 86400:
        fields["bucket_seconds"] = ["Between 60 seconds and 7 days."]
    if fields:
        raise InvalidInput(fields)


def _check_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise InvalidInput({"name": ["A name of 1 to 200 characters is required."]})
    return name


def _query(rule: OnlineRule, backfill: dict | None = None) -> dict[str, Any]:
    query = {"rule": rule.pk, "filter": rule.filter, "sampling_rate": rule.sampling_rate}
    if backfill:
        query["backfill"] = backfill
    return query


@transaction.atomic
def online_rule_create(
    *,
    project: Project,
    name: str,
    revision: EvaluatorRevision | None,
    filter: dict | None = None,
    sampling_rate: float = 1.0,
    bucket_seconds: int = 3600,
    active: bool = True,
    author=None,
) -> OnlineRule:
    """Create a rule and its live run. Human and feedback evaluators are refused (they do not
    run). New matching traces are evaluated from now on; ``online_backfill`` does the past."""
    name = _check_name(name)
    _check(project, revision, sampling_rate, bucket_seconds)
    stored = filter_parse(filter).stored()
    person = author if getattr(author, "pk", None) else None
    rule = OnlineRule.objects.create(
        project=project,
        name=name,
        revision=revision,
        filter=stored,
        sampling_rate=float(sampling_rate),
        bucket_seconds=bucket_seconds,
        active=active,
        paused_reason="" if active else "Created paused.",
        created_by=person,
    )
    now = timezone.now()
    run = Run.objects.create(
        project=project,
        name=f"Online: {name}",
        description=f"Live run of the online rule {name!r}: one scenario per evaluated trace.",
        status=RunStatus.RUNNING,
        is_online=True,
        query=_query(rule),
        started_at=now,
        progressed_at=now,
        created_by=person,
    )
    slug = rule_slug(rule)
    RunStep.objects.bulk_create(
        [
            RunStep(
                run=run,
                key=f"query-{slug}",
                type=StepType.INPUT,
                position=0,
                references={"query": {"id": rule.pk, "slug": slug}},
            ),
            services._annotation_step(run, revision, 1),
        ]
    )
    run.mappings = metrics.mappings_build(run)
    run.save(update_fields=["mappings"])
    rule.run = run
    rule.save(update_fields=["run"])
    return rule


@transaction.atomic
def online_rule_update(
    *,
    rule: OnlineRule,
    name: str | None = None,
    filter: dict | None = None,
    sampling_rate: float | None = None,
    bucket_seconds: int | None = None,
) -> OnlineRule:
    """Change what a rule matches from now on (traces already evaluated stay). The evaluator is
    fixed: a rule for another revision is a new rule with its own live run."""
    rule = OnlineRule.objects.select_for_update().select_related("revision").get(pk=rule.pk)
    if name is not None:
        rule.name = _check_name(name)
    if filter is not None:
        rule.filter = filter_parse(filter).stored()
    if sampling_rate is not None:
        rule.sampling_rate = sampling_rate
    rebucket = bucket_seconds is not None and bucket_seconds != rule.bucket_seconds
    if bucket_seconds is not None:
        rule.bucket_seconds = bucket_seconds
    _check(rule.project, rule.revision, rule.sampling_rate, rule.bucket_seconds)
    rule.sampling_rate = float(rule.sampling_rate)
    rule.save(update_fields=["name", "filter", "sampling_rate", "bucket_seconds"])
    if rule.run_id:
        backfill = (rule.run.query or {}).get("backfill")
        Run.objects.filter(pk=rule.run_id).update(
            name=f"Online: {rule.name}", query=_query(rule, backfill)
        )
        if rebucket:
            RunMetrics.objects.filter(run_id=rule.run_id, bucket_start__isnull=False).delete()
            transaction.on_commit(lambda: metrics.run_refresh(run=Run.objects.get(pk=rule.run_id)))
    return rule


def online_rule_pause(*, rule: OnlineRule, reason: str = "") -> OnlineRule:
    """Stop evaluating: queued work finds the rule paused and does nothing."""
    reason = (reason or "").strip()[:500] or "Paused."
    OnlineRule.objects.filter(pk=rule.pk).update(active=False, paused_reason=reason)
    rule.refresh_from_db()
    return rule


@transaction.atomic
def online_rule_resume(*, rule: OnlineRule) -> OnlineRule:
    """Evaluate new traces again (traces that arrived while paused need a backfill). A live run
    cancelled from the run page is reopened."""
    OnlineRule.objects.filter(pk=rule.pk).update(active=True, paused_reason="")
    if rule.run_id:
        Run.objects.filter(pk=rule.run_id).exclude(status=RunStatus.RUNNING).update(
            status=RunStatus.RUNNING, finished_at=None, closed=False, progressed_at=timezone.now()
        )
    rule.refresh_from_db()
    return rule


@transaction.atomic
def online_rule_delete(*, rule: OnlineRule) -> None:
    """Delete the rule. Its live run is kept as a closed, read-only run with final metrics;
    the annotations stay on their traces."""
    run = rule.run
    if run is not None:
        metrics.run_refresh(run=run)
        run.refresh_from_db()
        status = RunStatus.ERRORS if run.error_cells else RunStatus.SUCCESS
        Run.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now(), closed=True)
    rule.delete()


# --- dispatch -----------------------------------------------------------------------------------


def online_queue(*, project: Project, traces: list[Trace]) -> None:
    """After an ingest commits: when the project has an active rule (one small query), match
    these traces a few seconds later. Never fails the ingest (a missed trace can be
    backfilled)."""
    ids = [trace.pk for trace in traces if trace.pk]
    if not ids:
        return
    from runs.tasks import ingest_online_dispatch

    def send():
        if not OnlineRule.objects.filter(project=project, active=True).exists():
            return
        try:
            ingest_online_dispatch.apply_async((project.pk, ids), countdown=delay_seconds())
        except Exception:
            logger.exception("could not queue online evaluation of %d traces", len(ids))

    transaction.on_commit(send)


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
        ids = list(_candidates(rule, traces).order_by("pk").values_list("pk", flat=True))
        _queue_evaluations(rule, ids)
        queued += len(ids)
    return queued


def _queue_evaluations(rule: OnlineRule, ids: list[int]) -> None:
    from runs.tasks import ingest_online_evaluate

    size = chunk_size()
    for start in range(0, len(ids), size):
        chunk = ids[start : start + size]
        transaction.on_commit(lambda chunk=chunk: ingest_online_evaluate.delay(rule.pk, chunk))


def online_evaluate_ids(*, rule_id: int, trace_ids: list[int]) -> int:
    rule = OnlineRule.objects.filter(pk=rule_id).first()
    if rule is None:
        return 0
    return online_evaluate_traces(rule=rule, traces=Trace.objects.filter(pk__in=trace_ids))


# --- evaluation -------------------------------------------------------------------------------


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
    found = list(_candidates(rule, Trace.objects.filter(pk__in=ids)).order_by("start_time", "pk"))
    if not found:
        return 0
    roots = _root_attributes(found)
    claimed = _claim(_scenarios_ensure(rule, found, roots))
    if not claimed:
        return 0
    try:
        cells = _cells(rule, claimed, roots)
        written = services._cells_write(rule.run, claimed, cells)
    except BaseException:
        _release(claimed)
        raise
    services.run_progress_update(run_id=rule.run_id)
    _metrics_refresh(rule, [s.pk for s in claimed])
    _pause_if_connection_failing(rule)  # this batch may have found the key revoked
    return written


def _pause_if_connection_failing(rule: OnlineRule) -> bool:
    """A rule whose model connection fails authentication stops, with the reason visible,
    instead of recording an error for every new trace until someone notices."""
    from evaluators.models import ModelConnection

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
            by_trace.update({s.trace_id: s for s in created})
    by_pk = {t.pk: t for t in traces}
    scenarios = [by_trace[t.pk] for t in traces]
    for scenario in scenarios:
        scenario.trace = by_pk[scenario.trace_id]
    return scenarios


def _claim(scenarios: list[Scenario]) -> list[Scenario]:
    """Take the scenarios nobody is evaluating: pending ones, or running ones whose worker
    went quiet long ago. Two dispatches of one trace never both call the evaluator."""
    stale = timezone.now() - timedelta(seconds=getattr(settings, "EVALSITE_RUN_STALL_SECONDS", 600))
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


def _cells(rule: OnlineRule, scenarios: list[Scenario], roots: dict) -> list[services.Cell]:
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
        services.Cell(
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


# --- metrics ------------------------------------------------------------------------------------

_BUCKETS_SQL = (
    "SELECT DISTINCT to_timestamp(floor(extract(epoch FROM created_at) / %s) * %s) "
    "FROM runs_scenario WHERE id = ANY(%s)"
)
# The same condition metrics.buckets_refresh uses, so either refresh writes the same rows.
_BUCKET_WHERE = (
    "AND r.scenario_id IN (SELECT id FROM runs_scenario WHERE run_id = %s AND created_at >= %s "
    "AND created_at < %s + make_interval(secs => %s))"
)


@transaction.atomic
def _metrics_refresh(rule: OnlineRule, scenario_ids: list[int]) -> None:
    """Run-wide statistics and those of the buckets these scenarios fall in (not every bucket
    the run ever had). Serialised on the run row like ``metrics.run_refresh``."""
    run = Run.objects.select_for_update().get(pk=rule.run_id)
    metrics.mappings_refresh_deferred(run)
    now = timezone.now()
    RunMetrics.objects.update_or_create(
        run=run,
        scenario=None,
        bucket_start=None,
        defaults={"data": metrics.run_stats(run), "refreshed_at": now},
    )
    seconds = rule.bucket_seconds
    with connection.cursor() as cursor:
        cursor.execute(_BUCKETS_SQL, [seconds, seconds, scenario_ids])
        starts = [row[0] for row in cursor.fetchall()]
    for start in starts:
        data = metrics.run_stats(run, _BUCKET_WHERE, (run.pk, start, start, seconds))
        RunMetrics.objects.update_or_create(
            run=run, scenario=None, bucket_start=start, defaults={"data": data, "refreshed_at": now}
        )
    Run.objects.filter(pk=run.pk).update(metrics_refreshed_at=now)


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


# --- backfill -----------------------------------------------------------------------------------


def online_backfill(*, rule: OnlineRule, since: datetime, until: datetime | None = None) -> dict:
    """Evaluate the matching, sampled past traces that started in [since, until) and are not
    evaluated yet, in chunked tasks. Safe to repeat: what is done is skipped. Returns the
    progress (``online_backfill_progress``)."""
    since, until = _aware(since), _aware(until or timezone.now())
    if since is None or since >= until:
        raise InvalidInput({"since": ["Give a start before the end of the window."]})
    rule = OnlineRule.objects.select_related("project", "run").get(pk=rule.pk)
    if not rule.active:
        raise InvalidInput({"rule": ["This rule is paused; resume it before backfilling."]})
    if rule.run is None or rule.run.status != RunStatus.RUNNING:
        raise InvalidInput({"rule": ["The rule's live run is not running; resume the rule."]})
    window_traces = Trace.objects.filter(
        project=rule.project, start_time__gte=since, start_time__lt=until
    )
    total = _sampled(online_rule_matches(rule=rule, traces=window_traces), rule.sampling_rate)
    todo = list(_candidates(rule, window_traces).order_by("pk").values_list("pk", flat=True))
    backfill = {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "total": total.count(),
        "queued": len(todo),
        "started_at": timezone.now().isoformat(),
    }
    Run.objects.filter(pk=rule.run_id).update(query=_query(rule, backfill))
    _queue_evaluations(rule, todo)
    return online_backfill_progress(rule=rule)


def _aware(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def online_backfill_progress(*, rule: OnlineRule) -> dict | None:
    """The last backfill: its window, how many traces it covers and how many are evaluated."""
    query = Run.objects.filter(pk=rule.run_id).values_list("query", flat=True).first()
    backfill = (query or {}).get("backfill")
    if not backfill:
        return None
    since = datetime.fromisoformat(backfill["since"])
    until = datetime.fromisoformat(backfill["until"])
    evaluated = Scenario.objects.filter(
        run_id=rule.run_id,
        status__in=FINAL_SCENARIO,
        trace__start_time__gte=since,
        trace__start_time__lt=until,
    ).count()
    total = backfill["total"]
    done = min(evaluated, total)
    return {
        **backfill,
        "since": since,
        "until": until,
        "evaluated": done,
        "percent": round(100.0 * done / total, 1) if total else 100.0,
        "finished": done >= total,
    }
