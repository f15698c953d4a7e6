"""Online backfill: evaluate a rule over traces (or sessions) that arrived before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import F
from django.utils import timezone

from evalsite.errors import InvalidInput
from runs.models import (
    OnlineRule,
    Run,
    RunStatus,
    Scenario,
    Session,
    SessionRuleState,
    Trace,
)
from runs.online.evaluate import evaluations_queue
from runs.online.rules import (
    FINAL_SCENARIO,
    online_rule_matches,
    rule_candidates,
    rule_query,
    traces_sampled,
)
from runs.online.sessions import (
    db_now,
    session_candidates,
    sessions_matching,
    sessions_queue,
    sessions_sampled,
)


def online_backfill(*, rule: OnlineRule, since: datetime, until: datetime | None = None) -> dict:
    """Evaluate the matching, sampled past traces that started in [since, until) and are not
    evaluated yet, in chunked tasks; for a session rule, the sessions whose last activity is in
    the window, that are idle now and not judged as they are. Safe to repeat: what is done is
    skipped. Returns the progress (``online_backfill_progress``)."""
    since, until = _aware(since), _aware(until or timezone.now())
    if since is None or since >= until:
        raise InvalidInput({"since": ["Give a start before the end of the window."]})
    rule = OnlineRule.objects.select_related("project", "run").get(pk=rule.pk)
    if not rule.active:
        raise InvalidInput({"rule": ["This rule is paused; resume it before backfilling."]})
    if rule.run is None or rule.run.status != RunStatus.RUNNING:
        raise InvalidInput({"rule": ["The rule's live run is not running; resume the rule."]})
    if rule.for_sessions:
        return _sessions_backfill(rule, since, until)
    window_traces = Trace.objects.filter(
        project=rule.project, start_time__gte=since, start_time__lt=until
    )
    total = traces_sampled(online_rule_matches(rule=rule, traces=window_traces), rule.sampling_rate)
    todo = list(rule_candidates(rule, window_traces).order_by("pk").values_list("pk", flat=True))
    _started(rule, since, until, total.count(), len(todo))
    evaluations_queue(rule, todo)
    return online_backfill_progress(rule=rule)


def _sessions_backfill(rule: OnlineRule, since: datetime, until: datetime) -> dict:
    idle = db_now() - timedelta(seconds=rule.idle_seconds)
    window = Session.objects.filter(
        project=rule.project,
        last_activity__gte=since,
        last_activity__lt=until,
        updated_at__lte=idle,
    )
    total = sessions_sampled(
        sessions_matching(project=rule.project, filter=rule.filter, sessions=window),
        rule.sampling_rate,
    )
    todo = list(session_candidates(rule, window).order_by("pk").values_list("pk", flat=True))
    _started(rule, since, until, total.count(), len(todo))
    sessions_queue(rule, todo)
    return online_backfill_progress(rule=rule)


def _started(rule: OnlineRule, since: datetime, until: datetime, total: int, todo: int) -> None:
    backfill = {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "total": total,
        "queued": todo,
        "started_at": timezone.now().isoformat(),
    }
    Run.objects.filter(pk=rule.run_id).update(query=rule_query(rule, backfill))


def _aware(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def online_backfill_progress(*, rule: OnlineRule) -> dict | None:
    """The last backfill: its window, how many traces (sessions) it covers and how many are
    evaluated."""
    query = Run.objects.filter(pk=rule.run_id).values_list("query", flat=True).first()
    backfill = (query or {}).get("backfill")
    if not backfill:
        return None
    since = datetime.fromisoformat(backfill["since"])
    until = datetime.fromisoformat(backfill["until"])
    if rule.for_sessions:
        # Sessions judged as they are now (a session that resumed since is not done again).
        evaluated = SessionRuleState.objects.filter(
            rule=rule,
            session__last_activity__gte=since,
            session__last_activity__lt=until,
            evaluated_activity__gte=F("session__last_activity"),
            scenario__status__in=FINAL_SCENARIO,
        ).count()
    else:
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
