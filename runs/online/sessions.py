"""Session rules: a rule with ``target="session"`` judges a whole session once it has been idle
for the rule's ``idle_seconds``, and again each time it resumes and goes idle again.

A beat task sweeps every live session rule (``online_sessions_sweep``). A session is idle when
nothing of it arrived for ``idle_seconds`` (``Session.updated_at``, set by the database at every
ingest that touches it: the server's clock, so client clocks, batch exports and replayed history
cannot make a session look idle while its turns are still arriving). What was judged is kept per
(rule, session) in ``SessionRuleState``: the session's ``last_activity`` and ``trace_count``
then. A session is judged again only when it has a later activity or more traces, and the state
row is claimed with one conditional upsert, so two sweeps (two beat hosts, a sweep and a
backfill) never judge one idle period twice.

Each sweep of a rule looks at the sessions that arrived since its watermark
(``OnlineRule.sessions_swept_until``, less a margin for ingests still committing) and judges at
most ``EVALSITE_SESSION_SWEEP_LIMIT`` of them, oldest first; the rest wait for the next sweep.
How often the beat runs changes how soon after its idle time a session is judged, never whether.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, QuerySet, Value
from django.db.models.functions import Coalesce, Greatest

from evalsite.models import Project
from runs import conf, queue
from runs.models import (
    OnlineRule,
    RuleTarget,
    Run,
    RunStatus,
    Session,
    SessionRuleState,
    Trace,
)
from runs.online.evaluate import rule_live, scenarios_append, units_send, units_work_here
from runs.online.rules import rows_sampled, traces_matching
from runs.traces import trace_roots

logger = logging.getLogger(__name__)

# An ingest that began before a sweep may commit after it: sessions stamped this long before
# the watermark are looked at again (the state rows keep them from being judged twice).
MARGIN = timedelta(minutes=5)


def sessions_matching(
    *, project: Project, filter: dict | None, sessions: QuerySet[Session] | None = None
) -> QuerySet[Session]:
    """Sessions of ``project`` (among ``sessions`` when given) with at least one production trace
    the filter matches, as a trace rule would take it (root name, attributes, start time)."""
    traces = traces_matching(project=project, filter=filter).filter(
        session_id=OuterRef("session_id")
    )
    found = Session.objects.filter(project=project) if sessions is None else sessions
    return found.filter(project=project).filter(Exists(traces))


def sessions_sampled(sessions: QuerySet[Session], rate: float) -> QuerySet[Session]:
    """In the sample by session id, as traces are by trace id (``online_sampled``)."""
    return rows_sampled(sessions, "session_id", rate)


def session_candidates(
    rule: OnlineRule, sessions: QuerySet[Session] | None = None
) -> QuerySet[Session]:
    """Matching, sampled sessions that have changed since the rule last judged them (or that it
    never judged). Idleness aside: the callers bound that."""
    judged = SessionRuleState.objects.filter(
        rule=rule,
        session=OuterRef("pk"),
        evaluated_activity__gte=OuterRef("last_activity"),
        evaluated_traces__gte=OuterRef("trace_count"),
    )
    matched = sessions_matching(project=rule.project, filter=rule.filter, sessions=sessions)
    return (
        sessions_sampled(matched, rule.sampling_rate)
        .filter(last_activity__isnull=False)
        .exclude(Exists(judged))
    )


def online_sessions_sweep() -> dict[str, int]:
    """One sweep (beat, every ``EVALSITE_SESSION_SWEEP_SECONDS``): each live session rule judges
    the sessions that went idle. One rule failing never stops the others."""
    ids = OnlineRule.objects.filter(
        target=RuleTarget.SESSION, active=True, run__status=RunStatus.RUNNING
    ).values_list("pk", flat=True)
    swept = fired = 0
    for rule_id in ids:
        try:
            fired += session_rule_sweep(rule_id=rule_id)
            swept += 1
        except Exception:
            logger.exception("session rule %s: the sweep failed; the next one retries", rule_id)
    return {"rules": swept, "sessions": fired}


def session_rule_sweep(*, rule_id: int, limit: int | None = None) -> int:
    """Judge the rule's sessions that went idle since its last sweep, at most ``limit`` of them
    (oldest first); moves the rule's watermark. Returns how many sessions were queued."""
    rule = rule_live(rule_id)
    if rule is None or not rule.for_sessions:
        return 0
    limit = limit or conf.session_sweep_limit()
    idle = timedelta(seconds=rule.idle_seconds)
    cutoff = db_now() - idle
    # A new rule judges the sessions that go idle after it exists; the past is a backfill.
    # Its first watermark is set on the database's clock when it is made (online_rule_create);
    # ``created_at`` stands in only for rules made otherwise.
    since = (rule.sessions_swept_until or rule.created_at - idle) - MARGIN
    window = Session.objects.filter(
        project=rule.project, updated_at__gt=since, updated_at__lte=cutoff
    )
    found = list(
        session_candidates(rule, window)
        .order_by("updated_at", "pk")
        .values_list("pk", "updated_at")[:limit]
    )
    fired = units_send(sessions_fire(rule=rule, session_ids=[pk for pk, _ in found], idle=idle))
    # Everything that arrived up to ``reached`` is decided; a capped sweep stops at its last.
    reached = found[-1][1] if len(found) >= limit else cutoff
    OnlineRule.objects.filter(pk=rule.pk).update(
        sessions_swept_until=Greatest(
            Coalesce(F("sessions_swept_until"), Value(reached)), Value(reached)
        )
    )
    return fired


def sessions_fire(*, rule: OnlineRule, session_ids: list[int], idle: timedelta) -> list:
    """Claim the sessions that are still idle and changed since the rule last judged them, and
    make their scenarios and work units, in one transaction under the run's lock. A session
    another sweep claimed first (for the same activity) is skipped. Returns the new units
    (their messages go out with ``units_send``)."""
    if not session_ids:
        return []
    with transaction.atomic():
        Run.objects.select_for_update(no_key=True).filter(pk=rule.run_id).first()
        claimed = _claim(rule, session_ids, db_now() - idle)
        sessions = list(Session.objects.filter(pk__in=claimed).order_by("last_activity", "pk"))
        firsts, lasts = _ends(rule.project_id, [s.session_id for s in sessions])
        # The first turn's root inputs only: not its other spans nor the rest of its attributes.
        roots = trace_roots(firsts.values(), "inputs")
        rows = [
            {
                "trace": lasts[session.session_id],
                "session": session,
                "inputs": roots.get(firsts[session.session_id].pk, {}).get("inputs") or {},
                # Buckets group session scenarios by when the judged conversation ended.
                "created_at": session.last_activity,
            }
            for session in sessions
            if session.session_id in lasts
        ]
        scenarios, units = scenarios_append(rule, rows)
        _states_link(rule, scenarios)
    return units


CLAIM_SQL = """
INSERT INTO runs_sessionrulestate AS st
    (rule_id, session_id, evaluated_activity, evaluated_traces, fired_at)
SELECT %(rule)s, s.id, s.last_activity, s.trace_count, now()
FROM runs_session s
WHERE s.id = ANY(%(ids)s) AND s.project_id = %(project)s
  AND s.last_activity IS NOT NULL AND s.updated_at <= %(cutoff)s
ON CONFLICT (rule_id, session_id) DO UPDATE SET
    evaluated_activity = EXCLUDED.evaluated_activity,
    evaluated_traces = EXCLUDED.evaluated_traces,
    fired_at = EXCLUDED.fired_at,
    scenario_id = NULL
WHERE st.evaluated_activity < EXCLUDED.evaluated_activity
   OR st.evaluated_traces < EXCLUDED.evaluated_traces
RETURNING session_id
"""


def _claim(rule: OnlineRule, session_ids: list[int], cutoff: datetime) -> list[int]:
    """The sessions this caller judges: the upsert inserts or advances a state row only where
    the session is idle and changed since; a concurrent claim of the same row waits for the
    first to commit and then finds nothing to advance."""
    params = {"rule": rule.pk, "ids": session_ids, "project": rule.project_id, "cutoff": cutoff}
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_SQL, params)
        return [row[0] for row in cursor.fetchall()]


def _ends(project_id: int, session_ids: list[str]) -> tuple[dict[str, Trace], dict[str, Trace]]:
    """Each session's first and last trace (time order, as ``session_traces``), two queries."""
    traces = Trace.objects.filter(project_id=project_id, session_id__in=session_ids)
    firsts = traces.order_by("session_id", "start_time", "id").distinct("session_id")
    lasts = traces.order_by("session_id", "-start_time", "-id").distinct("session_id")
    return {t.session_id: t for t in firsts}, {t.session_id: t for t in lasts}


def _states_link(rule: OnlineRule, scenarios: list) -> None:
    """Each claimed state row points at the scenario that judges it (shown on the rule's page)."""
    if not scenarios:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_sessionrulestate st SET scenario_id = x.scenario"
            " FROM unnest(%s::bigint[], %s::bigint[]) AS x(session, scenario)"
            " WHERE st.rule_id = %s AND st.session_id = x.session",
            [[s.session_id for s in scenarios], [s.pk for s in scenarios], rule.pk],
        )


def db_now() -> datetime:
    """The database's clock: ``Session.updated_at`` is stamped by it, so idleness is measured
    on one clock whatever the host running the sweep."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def online_evaluate_session_ids(*, rule_id: int, session_ids: list[int]) -> int:
    """A session backfill chunk: the idle, changed sessions among them are judged (units sent to
    the workers of their lane). Returns how many were queued."""
    rule = rule_live(rule_id)
    if rule is None or not rule.for_sessions:
        return 0
    idle = timedelta(seconds=rule.idle_seconds)
    return units_send(sessions_fire(rule=rule, session_ids=session_ids, idle=idle))


def sessions_queue(rule: OnlineRule, ids: list[int]) -> None:
    """Backfill chunks, one task per ``EVALSITE_ONLINE_CHUNK_SIZE`` sessions."""
    size = conf.online_chunk_size()
    for start in range(0, len(ids), size):
        queue.online_evaluate_sessions(rule.pk, ids[start : start + size])


def online_evaluate_sessions(*, rule: OnlineRule, limit: int | None = None) -> int:
    """Sweep the rule now and compute its units in this process, like a worker would. Returns
    the cells written (0 when nothing is idle or the rule is paused)."""
    rule = rule_live(rule.pk)
    if rule is None or not rule.for_sessions:
        return 0
    session_rule_sweep(rule_id=rule.pk, limit=limit)
    return units_work_here(rule)
