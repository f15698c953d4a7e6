"""Time partitions of the spans table, and retention (docs/traces.md, "Partitions and retention").

``runs_span`` is partitioned by ``trace_time`` (its trace's ``created_at``: when the trace's first
span arrived) into one table per UTC day, ``runs_span_pYYYYMMDD``, plus ``runs_span_default``.

Why daily: retention is counted in whole days and cut at UTC midnight, so every cutoff falls on
a partition boundary and old spans leave by dropping whole tables: no DELETE, no bloat, no
vacuum. A year of retention is about 370 tables, which PostgreSQL prunes before it plans. Weekly
tables would keep spans up to six days longer than promised, or delete them row by row.

The beat creates partitions ahead (``partitions_ensure``). The default partition takes a span
whose day has no table yet (beat down longer than EVALSITE_PARTITIONS_AHEAD days) instead of
refusing it. Nothing moves rows out of it: a day whose spans already sit there gets no table of
its own (PostgreSQL would refuse to create one); those spans stay readable, unpruned, and
retention deletes them row by row. ``default_rows`` shows that it stays empty.

Retention covers production traces only (``source`` api or otlp, ``PRODUCTION``): a project
keeps them for ``Project.trace_retention_effective_days`` whole days plus today. Traces that runs
record (``invocation``, ``judge``: the application and judge calls behind run results) are never
deleted by it, so an old run keeps its evaluator outputs. A partition is detached and dropped
when no project keeps production traces in it and it holds no span of a run's trace; then each
project's production traces older than its cutoff are deleted in batches, their spans first
(pruned to their days), the rows pointing at them as their models' ``on_delete`` says, in SQL
(never loaded), and the sessions they belonged to refreshed (without looking newly active to
session rules) or removed. Advisory locks make two beats running it at once harmless: DDL is
serialised, and a second retention run finds the first one busy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, models, transaction
from django.db.models import Count, Min, Q, Sum
from django.db.models.deletion import get_candidate_relations_to_delete
from django.db.models.functions import Coalesce
from django.utils import timezone

from evalsite.models import Project
from runs import conf
from runs.models import Session, Span, Trace
from runs.traces.sessions import sessions_refresh
from runs.traces.spans import iso

logger = logging.getLogger(__name__)

PARENT = "runs_span"
DEFAULT = "runs_span_default"
PREFIX = "runs_span_p"
# pg_advisory locks: DDL on the spans table (transaction-scoped, waited for), and one retention
# run at a time (session-scoped, tried: a second host skips rather than queues).
DDL_LOCK = 0x7370_616E_0001
RETENTION_LOCK = 0x7370_616E_0002
LOCK_TIMEOUT = "5s"  # DDL waits no longer than this for readers, so ingestion never queues behind
BATCH = 500  # traces deleted per transaction
# The sources of production traces (sent by applications): the only traces retention deletes.
# The others (invocation, judge) are recorded by runs and belong to them.
PRODUCTION = ("api", "otlp")
BOUNDS = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")


@dataclass(frozen=True)
class Partition:
    name: str
    start: datetime | None  # None: the default partition
    end: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start": iso(self.start), "end": iso(self.end)}


def day_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def partitions_list() -> list[Partition]:
    """The spans table's partitions, oldest first, the default one last."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [PARENT],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = BOUNDS.search(bound)
        start, end = (
            (datetime.fromisoformat(match[1]), datetime.fromisoformat(match[2]))
            if match
            else (None, None)
        )
        found.append(Partition(name, start, end))
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(found, key=lambda p: p.start or far)


def partition_create(day: datetime) -> str:
    """Create the partition of ``day``'s UTC day; the caller holds ``DDL_LOCK``."""
    start = day_start(day)
    name = f"{PREFIX}{start:%Y%m%d}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {name} PARTITION OF {PARENT} FOR VALUES FROM (%s) TO (%s)",
            [start, start + timedelta(days=1)],
        )
    return name


@dataclass(frozen=True)
class Ensured:
    created: list[str]
    blocked: list[str]  # days whose spans already sit in the default partition


def partitions_ensure(*, now: datetime | None = None, ahead: int | None = None) -> Ensured:
    """Create the partitions of today and of the next ``ahead`` days that do not exist yet.
    Idempotent; two hosts calling it at once create each table once (``DDL_LOCK``)."""
    today = day_start(now or timezone.now())
    ahead = conf.partitions_ahead() if ahead is None else ahead
    created, blocked = [], []
    with transaction.atomic(), _ddl_lock():
        existing = [p for p in partitions_list() if p.start is not None]
        for offset in range(ahead + 1):
            start = today + timedelta(days=offset)
            end = start + timedelta(days=1)
            if any(p.start < end and start < p.end for p in existing):
                continue
            if _default_holds(start, end):
                logger.warning(
                    "Spans of %s are in %s; its partition is not created", start, DEFAULT
                )
                blocked.append(f"{PREFIX}{start:%Y%m%d}")
                continue
            created.append(partition_create(start))
    return Ensured(created, blocked)


def default_rows() -> int:
    """Spans in the default partition: 0 unless the beat fell behind."""
    return _default_query("SELECT count(*) FROM runs_span_default", []) or 0


def _default_holds(start: datetime, end: datetime) -> bool:
    sql = (
        "SELECT EXISTS (SELECT 1 FROM runs_span_default WHERE trace_time >= %s AND trace_time < %s)"
    )
    return bool(_default_query(sql, [start, end]))


def _default_query(sql: str, params: list) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [DEFAULT])
        if not cursor.fetchone()[0]:
            return None
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


@contextmanager
def _ddl_lock() -> Iterator[None]:
    """Inside a transaction: one host at a time alters the table, and a DDL that would wait
    for readers gives up after ``LOCK_TIMEOUT`` (a queued ACCESS EXCLUSIVE lock would stall
    every insert behind it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK])
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])
    yield


# --- retention -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectRetention:
    project_id: int
    slug: str
    days: int | None  # None: kept forever
    cutoff: datetime | None  # production traces that arrived before it go
    traces: int = 0  # those production traces
    spans: int = 0  # their span counts
    oldest_kept: datetime | None = None  # the oldest production trace that stays
    run_traces: int = 0  # traces older than the cutoff that runs recorded: kept with their runs

    def as_dict(self) -> dict[str, Any]:
        return {
            "project": self.slug,
            "retention_days": self.days,
            "cutoff": iso(self.cutoff),
            "traces": self.traces,
            "spans": self.spans,
            "oldest_kept": iso(self.oldest_kept),
            "run_traces": self.run_traces,
        }


@dataclass(frozen=True)
class Retention:
    """What retention would remove (a dry run) or removed."""

    now: datetime
    dry_run: bool
    partitions: list[Partition] = field(default_factory=list)
    projects: list[ProjectRetention] = field(default_factory=list)
    default_rows: int = 0
    skipped: str = ""  # why nothing was done

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": iso(self.now),
            "dry_run": self.dry_run,
            "partitions": [p.as_dict() for p in self.partitions],
            "projects": [p.as_dict() for p in self.projects],
            "default_rows": self.default_rows,
            "skipped": self.skipped,
        }


def retention_cutoff(now: datetime, days: int | None) -> datetime | None:
    """Production traces that arrived before this go: ``days`` whole UTC days kept, plus today."""
    return None if days is None else day_start(now) - timedelta(days=days)


def retention_plan(*, now: datetime | None = None, project: Project | None = None) -> Retention:
    """A dry run: the partitions that would be dropped and the production traces (with their
    spans) each project would lose, changing nothing. With ``project``, only that project's
    rows and the partitions that hold some of them."""
    now = now or timezone.now()
    cutoffs = _cutoffs(now)
    projects = Project.objects.order_by("slug")
    if project is not None:
        projects = projects.filter(pk=project.pk)
    return Retention(
        now=now,
        dry_run=True,
        partitions=_droppable(cutoffs, project),
        projects=[_project_plan(p, now) for p in projects],
        default_rows=default_rows(),
    )


def retention_apply(
    *, now: datetime | None = None, project: Project | None = None, batch: int = BATCH
) -> Retention:
    """Do what ``retention_plan`` says and report what was done, in the same shape. Batches
    commit one by one: a run cut short leaves consistent data, and the next one goes on."""
    now = now or timezone.now()
    with _session_lock(RETENTION_LOCK) as held:
        if not held:
            return Retention(now=now, dry_run=False, skipped="another retention run is going on")
        plan = retention_plan(now=now, project=project)
        cutoffs = _cutoffs(now)
        dropped = [p for p in plan.partitions if _drop(p, cutoffs)]
        done = [_project_delete(p, batch) for p in plan.projects]
        return replace(plan, dry_run=False, partitions=dropped, projects=done)


def _cutoffs(now: datetime) -> dict[int, datetime]:
    """Every project that has a retention, with its cutoff."""
    return {
        p.pk: cutoff
        for p in Project.objects.only("pk", "trace_retention_days")
        if (cutoff := retention_cutoff(now, p.trace_retention_effective_days)) is not None
    }


def _droppable(cutoffs: dict[int, datetime], project: Project | None) -> list[Partition]:
    if not cutoffs:
        return []
    horizon = max(cutoffs.values())  # younger partitions hold rows somebody keeps, or none
    return [
        p
        for p in partitions_list()
        if p.end is not None
        and p.end <= horizon
        and not _keeps_any(p, cutoffs)
        and (project is None or _holds(p, project.pk))
        and not _holds_run_spans(p)
    ]


KEEPS_SQL = """
SELECT EXISTS (
    SELECT 1 FROM evalsite_project p
    LEFT JOIN unnest(%s::bigint[], %s::timestamptz[]) AS c (project_id, cutoff)
        ON c.project_id = p.id
    WHERE EXISTS (
        SELECT 1 FROM runs_trace t WHERE t.project_id = p.id
        AND t.created_at >= greatest(%s, coalesce(c.cutoff, '-infinity'::timestamptz))
        AND t.created_at < %s
    )
)
"""


def _keeps_any(partition: Partition, cutoffs: dict[int, datetime]) -> bool:
    """Whether some project keeps a trace of the partition's days (a span's trace_time is its
    trace's created_at, so the traces tell, through their (project, created_at) index)."""
    with connection.cursor() as cursor:
        cursor.execute(
            KEEPS_SQL, [list(cutoffs), list(cutoffs.values()), partition.start, partition.end]
        )
        return cursor.fetchone()[0]


def _holds(partition: Partition, project_id: int) -> bool:
    return (
        _production(project_id)
        .filter(created_at__gte=partition.start, created_at__lt=partition.end)
        .exists()
    )


def _holds_run_spans(partition: Partition) -> bool:
    """Whether the partition holds a span of a trace that a run recorded (kept whatever its age).
    Stops at the first one: a partition kept for them is looked at again every run, and once
    its production rows are deleted its first row is one (200,000 production spans: 0.1 s)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {partition.name} s "  # noqa: S608 (a partition's name)
            "JOIN runs_trace t ON t.id = s.trace_id WHERE t.source <> ALL(%s))",
            [list(PRODUCTION)],
        )
        return cursor.fetchone()[0]


def _production(project_id: int) -> models.QuerySet[Trace]:
    return Trace.objects.filter(project_id=project_id, source__in=PRODUCTION).order_by()


def _project_plan(project: Project, now: datetime) -> ProjectRetention:
    days = project.trace_retention_effective_days
    cutoff = retention_cutoff(now, days)
    counted = {"n": 0, "spans": 0, "runs": 0}
    if cutoff is not None:
        production = Q(source__in=PRODUCTION)
        counted = (
            Trace.objects.filter(project=project, created_at__lt=cutoff)
            .order_by()
            .aggregate(
                n=Count("pk", filter=production),
                spans=Coalesce(Sum("span_count", filter=production), 0),
                runs=Count("pk", filter=~production),
            )
        )
    return ProjectRetention(
        project_id=project.pk,
        slug=project.slug,
        days=days,
        cutoff=cutoff,
        traces=counted["n"],
        spans=counted["spans"],
        oldest_kept=_oldest_kept(project.pk, cutoff),
        run_traces=counted["runs"],
    )


def _oldest_kept(project_id: int, cutoff: datetime | None) -> datetime | None:
    kept = _production(project_id)
    if cutoff is not None:
        kept = kept.filter(created_at__gte=cutoff)
    return kept.aggregate(oldest=Min("created_at"))["oldest"]


def _drop(partition: Partition, cutoffs: dict[int, datetime]) -> bool:
    """Detach and drop a partition nobody keeps anything in (checked again under the lock)."""
    try:
        with transaction.atomic(), _ddl_lock(), connection.cursor() as cursor:
            if _keeps_any(partition, cutoffs) or _holds_run_spans(partition):
                return False
            cursor.execute(f"ALTER TABLE {PARENT} DETACH PARTITION {partition.name}")
            cursor.execute(f"DROP TABLE {partition.name}")
    except DatabaseError as exc:  # a lock not granted in time: the next run tries again
        logger.warning("Partition %s not dropped: %s", partition.name, exc)
        return False
    return True


def _project_delete(plan: ProjectRetention, batch: int) -> ProjectRetention:
    traces = spans = 0
    while plan.cutoff is not None:
        deleted, deleted_spans = _delete_batch(plan.project_id, plan.cutoff, batch)
        if not deleted:
            break
        traces, spans = traces + deleted, spans + deleted_spans
    return replace(
        plan, traces=traces, spans=spans, oldest_kept=_oldest_kept(plan.project_id, plan.cutoff)
    )


@transaction.atomic
def _delete_batch(project_id: int, cutoff: datetime, size: int) -> tuple[int, int]:
    """Delete up to ``size`` of the project's production traces older than ``cutoff``:
    (traces, spans). Traces locked by an ingest are left for the next batch or run."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, created_at, session_id, span_count FROM runs_trace "
            "WHERE project_id = %s AND created_at < %s AND source = ANY(%s) "
            "ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
            [project_id, cutoff, list(PRODUCTION), size],
        )
        rows = cursor.fetchall()
        if not rows:
            return 0, 0
        # The judge calls behind online judgements of these traces go with them: their
        # annotations are deleted below, and nothing else reads a judge trace.
        cursor.execute(
            "SELECT t.id, t.created_at, 0, t.span_count FROM runs_trace t WHERE t.id IN "
            "(SELECT judge_trace_id FROM runs_annotation WHERE trace_id = ANY(%s)) "
            "AND t.source = 'judge'",
            [[row[0] for row in rows]],
        )
        judged = cursor.fetchall()
        ids = [row[0] for row in [*rows, *judged]]
        # Span.trace has no foreign key in the database: its spans go first, by hand; naming
        # their days prunes the DELETE to their partitions.
        cursor.execute(
            "DELETE FROM runs_span WHERE trace_time = ANY(%s) AND trace_id = ANY(%s)",
            [sorted({row[1] for row in [*rows, *judged]}), ids],
        )
        _on_delete(cursor, Trace, "SELECT unnest(%s::bigint[])", [ids], skip=(Span,))
        cursor.execute("DELETE FROM runs_trace WHERE id = ANY(%s)", [ids])
    sessions = {row[2] for row in rows if row[2]}
    # Trimmed, not active: session rules take updated_at as the arrival of the latest turn.
    sessions_refresh(project_id, sessions, touch=False)
    _sessions_delete_empty(project_id, sessions)
    return len(rows), sum(row[3] for row in [*rows, *judged])


def _sessions_delete_empty(project_id: int, session_ids: set[str]) -> None:
    if not session_ids:
        return
    empty = (
        "SELECT s.id FROM runs_session s WHERE s.project_id = %s AND s.session_id = ANY(%s) "
        "AND NOT EXISTS (SELECT 1 FROM runs_trace t "
        "WHERE t.project_id = s.project_id AND t.session_id = s.session_id)"
    )
    params = [project_id, sorted(session_ids)]
    with connection.cursor() as cursor:
        _on_delete(cursor, Session, empty, params)
        cursor.execute(f"DELETE FROM runs_session WHERE id IN ({empty})", params)  # noqa: S608


def _on_delete(
    cursor, model: type[models.Model], doomed: str, params: list, skip=(), depth: int = 0
) -> None:
    """Before ``model``'s rows whose ids ``doomed`` selects are deleted: delete, or set to NULL,
    the rows that point at them, as each pointing field's ``on_delete`` says, all the way down
    (what Django's collector does in Python, as a few statements whatever the row count)."""
    if depth > 8:
        raise RuntimeError(f"on_delete chain from {model.__name__} deeper than 8 models")
    for relation in get_candidate_relations_to_delete(model._meta):
        fk, related = relation.field, relation.related_model
        if related in skip or relation.on_delete is models.DO_NOTHING:
            continue
        if fk.target_field != model._meta.pk:
            raise NotImplementedError(f"{fk} points at a field other than the primary key")
        # Table and column names come from the models, never from input.
        table, column = related._meta.db_table, fk.column
        pointing = f"{column} IN ({doomed})"
        if relation.on_delete is models.SET_NULL:
            cursor.execute(f"UPDATE {table} SET {column} = NULL WHERE {pointing}", params)  # noqa: S608
        elif relation.on_delete is models.CASCADE:
            pk = related._meta.pk.column
            nested = f"SELECT {pk} FROM {table} WHERE {pointing}"  # noqa: S608
            _on_delete(cursor, related, nested, params, (), depth + 1)
            cursor.execute(f"DELETE FROM {table} WHERE {pointing}", params)  # noqa: S608
        else:
            raise NotImplementedError(f"{fk}: {relation.on_delete.__name__} is not done in SQL")


@contextmanager
def _session_lock(key: int) -> Iterator[bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        held = cursor.fetchone()[0]
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
