"""Online rules: the filter, deterministic sampling, matching traces, and rule create / update /
pause / resume / delete. A rule targets traces or, with ``target="session"``, whole sessions
(runs/online/sessions.py judges those)."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import (
    BigIntegerField,
    DateTimeField,
    Exists,
    F,
    Func,
    OuterRef,
    QuerySet,
    Value,
)
from django.utils import timezone
from django.utils.text import slugify
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Project
from evaluators.kinds import get_kind
from evaluators.models import EvaluatorRevision
from evaluators.services import revision_session_problem
from runs import engine, metrics
from runs.models import (
    OnlineRule,
    RuleTarget,
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
from runs.traces import trace_list

logger = logging.getLogger(__name__)


# Traces evalsite records itself (run invocations, judge calls) are never production traffic.
ONLINE_SOURCES = ("api", "otlp")


FINAL_SCENARIO = (ScenarioStatus.SUCCESS, ScenarioStatus.ERRORS)


SAMPLE_BITS = 52  # 13 hex digits of md5: exact in a float8 and in a Python float


BUCKET_CHOICES = ((300, "5 minutes"), (3600, "1 hour"), (21600, "6 hours"), (86400, "1 day"))

IDLE_MIN_SECONDS, IDLE_MAX_SECONDS, IDLE_DEFAULT_SECONDS = 10, 7 * 86400, 900
CLOCK = Func(function="clock_timestamp", output_field=DateTimeField())  # the database's, now


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


def online_sampled(trace_id: str, rate: float) -> bool:
    """Whether a trace (or a session, by its session id) is in the sample: md5 of its id, read
    as a number in [0, 1), below rate."""
    if rate >= 1:
        return True
    digest = hashlib.md5(trace_id.encode(), usedforsecurity=False).hexdigest()
    return int(digest[: SAMPLE_BITS // 4], 16) < rate * 2**SAMPLE_BITS


class _SamplePoint(Func):
    """The same number as ``online_sampled`` computes, in SQL (so backfills filter in the
    database): the first 13 hex digits of md5(trace_id) as a 52-bit integer."""

    template = "('x' || substr(md5(%(expressions)s), 1, 13))::bit(52)::bigint"
    output_field = BigIntegerField()


def traces_sampled(traces: QuerySet[Trace], rate: float) -> QuerySet[Trace]:
    return rows_sampled(traces, "trace_id", rate)


def rows_sampled(rows: QuerySet, field: str, rate: float) -> QuerySet:
    """The rows whose ``field`` is in the sample, decided in SQL as ``online_sampled`` does."""
    if rate >= 1:
        return rows
    return rows.alias(sample_point=_SamplePoint(F(field))).filter(
        sample_point__lt=rate * 2**SAMPLE_BITS
    )


def online_rule_matches(*, rule: OnlineRule, traces: QuerySet[Trace] | None = None) -> QuerySet:
    """The rule's project's production traces that match its filter (sampling aside), among
    ``traces`` when given. A trace needs its root span: a child that arrived first waits."""
    return traces_matching(project=rule.project, filter=rule.filter, traces=traces)


def traces_matching(
    *, project: Project, filter: dict | None, traces: QuerySet[Trace] | None = None
) -> QuerySet[Trace]:
    """Production traces of ``project`` matching a rule filter (see ``online_rule_matches``)."""
    found = filter_parse(filter)
    matched = trace_list(
        project=project,
        name=found.name,
        since=found.since,
        until=found.until,
        attributes=found.attribute_values(),
    ).filter(source__in=ONLINE_SOURCES)
    roots = Span.objects.filter(
        trace_id=OuterRef("pk"), trace_time=OuterRef("created_at"), parent_id=""
    )
    matched = matched.filter(Exists(roots))
    if traces is not None:
        matched = matched.filter(pk__in=traces.values("pk"))
    return matched


def rule_candidates(rule: OnlineRule, traces: QuerySet[Trace] | None = None) -> QuerySet[Trace]:
    """Matching, sampled, and not yet evaluated by the rule's live run."""
    done = Scenario.objects.filter(
        run_id=rule.run_id, trace_id=OuterRef("pk"), status__in=FINAL_SCENARIO
    )
    return traces_sampled(online_rule_matches(rule=rule, traces=traces), rule.sampling_rate).filter(
        ~Exists(done)
    )


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


def rule_target_check(revision: EvaluatorRevision | None, target: Any, idle: Any) -> None:
    """A session rule needs an evaluator that judges sessions, and an idle time in bounds
    (the service, the API, the pages and the admin all check with this)."""
    if target not in RuleTarget.values:
        raise InvalidInput({"target": ["Either trace or session."]})
    fields: dict[str, list[str]] = {}
    if (
        not isinstance(idle, int)
        or isinstance(idle, bool)
        or not IDLE_MIN_SECONDS <= idle <= IDLE_MAX_SECONDS
    ):
        fields["idle_seconds"] = ["Between 10 seconds and 7 days (604800 seconds)."]
    if target == RuleTarget.SESSION and revision is None:
        fields["revision"] = ["A session rule needs an evaluator that judges sessions."]
    elif target == RuleTarget.SESSION and (problem := revision_session_problem(revision)):
        fields["revision"] = [problem]
    if fields:
        raise InvalidInput(fields)


def _check_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise InvalidInput({"name": ["A name of 1 to 200 characters is required."]})
    return name


def rule_query(rule: OnlineRule, backfill: dict | None = None) -> dict[str, Any]:
    query = {"rule": rule.pk, "filter": rule.filter, "sampling_rate": rule.sampling_rate}
    if rule.for_sessions:
        query |= {"target": rule.target, "idle_seconds": rule.idle_seconds}
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
    target: str = RuleTarget.TRACE,
    idle_seconds: int = IDLE_DEFAULT_SECONDS,
    author=None,
) -> OnlineRule:
    """Create a rule and its live run. Human and feedback evaluators are refused (they do not
    run), and so is a session rule whose evaluator cannot judge sessions. New matching traces
    (sessions that go idle) are evaluated from now on; ``online_backfill`` does the past."""
    name = _check_name(name)
    _check(project, revision, sampling_rate, bucket_seconds)
    rule_target_check(revision, target, idle_seconds)
    stored = filter_parse(filter).stored()
    person = author if getattr(author, "pk", None) else None
    rule = OnlineRule.objects.create(
        project=project,
        name=name,
        revision=revision,
        filter=stored,
        sampling_rate=float(sampling_rate),
        bucket_seconds=bucket_seconds,
        target=target,
        idle_seconds=idle_seconds,
        active=active,
        paused_reason="" if active else "Created paused.",
        created_by=person,
    )
    if rule.for_sessions:
        # Sessions are stamped by the database's clock: the first window (what goes idle from
        # now on) starts on it too, whatever the clock of this app server says.
        idle = Value(timedelta(seconds=idle_seconds))
        OnlineRule.objects.filter(pk=rule.pk).update(sessions_swept_until=CLOCK - idle)
        rule.refresh_from_db(fields=["sessions_swept_until"])
    now = timezone.now()
    each = "session each time it went idle" if rule.for_sessions else "evaluated trace"
    run = Run.objects.create(
        project=project,
        name=f"Online: {name}",
        description=f"Live run of the online rule {name!r}: one scenario per {each}.",
        status=RunStatus.RUNNING,
        is_online=True,
        query=rule_query(rule),
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
            engine.annotation_step(run, revision, 1),
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
    idle_seconds: int | None = None,
) -> OnlineRule:
    """Change what a rule matches from now on (traces already evaluated stay). The evaluator and
    the target are fixed: a rule for another revision is a new rule with its own live run."""
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
    if idle_seconds is not None:
        rule.idle_seconds = idle_seconds
    _check(rule.project, rule.revision, rule.sampling_rate, rule.bucket_seconds)
    rule_target_check(rule.revision, rule.target, rule.idle_seconds)
    rule.sampling_rate = float(rule.sampling_rate)
    rule.save(update_fields=["name", "filter", "sampling_rate", "bucket_seconds", "idle_seconds"])
    if rule.run_id:
        backfill = (rule.run.query or {}).get("backfill")
        Run.objects.filter(pk=rule.run_id).update(
            name=f"Online: {rule.name}", query=rule_query(rule, backfill)
        )
        if rebucket:
            RunMetrics.objects.filter(run_id=rule.run_id, bucket_start__isnull=False).delete()
            transaction.on_commit(lambda: metrics.run_refresh(run=Run.objects.get(pk=rule.run_id)))
    return rule


def online_rule_pause(*, rule: OnlineRule, reason: str = "") -> OnlineRule:
    """Stop evaluating: a unit claimed meanwhile finds the rule paused and is cancelled (resuming
    queues it again)."""
    reason = (reason or "").strip()[:500] or "Paused."
    OnlineRule.objects.filter(pk=rule.pk).update(active=False, paused_reason=reason)
    rule.refresh_from_db()
    return rule


@transaction.atomic
def online_rule_resume(*, rule: OnlineRule) -> OnlineRule:
    """Evaluate new traces again (traces that arrived while paused need a backfill; sessions
    that went idle meanwhile are judged by the next sweeps). A live run cancelled from the run
    page is reopened."""
    OnlineRule.objects.filter(pk=rule.pk).update(active=True, paused_reason="")
    if rule.run_id:
        Run.objects.filter(pk=rule.run_id).exclude(status=RunStatus.RUNNING).update(
            status=RunStatus.RUNNING, finished_at=None, closed=False, progressed_at=timezone.now()
        )
        # Batches that met the pause are evaluated now: their traces have scenarios already,
        # so neither a dispatch nor a backfill would take them again.
        engine.units_requeue_cancelled(run_id=rule.run_id)
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
