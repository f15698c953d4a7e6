"""Online backfill: evaluate a rule over traces that arrived before it."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone

from evalsite.errors import InvalidInput
from runs.models import (
    OnlineRule,
    Run,
    RunStatus,
    Scenario,
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
    total = traces_sampled(online_rule_matches(rule=rule, traces=window_traces), rule.sampling_rate)
    todo = list(rule_candidates(rule, window_traces).order_by("pk").values_list("pk", flat=True))
    backfill = {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "total": total.count(),
        "queued": len(todo),
        "started_at": timezone.now().isoformat(),
    }
    Run.objects.filter(pk=rule.run_id).update(query=rule_query(rule, backfill))
    evaluations_queue(rule, todo)
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
