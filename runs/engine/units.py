"""Leased work units. A run is cut into units (scenarios ``first..last`` of one lane). A worker
claims the next queued unit of a run's lane with one conditional UPDATE that sets an owner and a
lease expiry (PostgreSQL's clock, so hosts' clocks do not matter), renews the lease while it
computes, and writes cells only while it still holds it. The sweeper, on beat every few seconds,
re-queues units whose lease expired (their worker died), fails units that keep killing their
worker, and re-sends messages that a broker lost. A duplicated or redelivered message claims
nothing that someone holds or that is done, so it calls no application and no model."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Greatest, Now
from django.utils import timezone

from runs import conf, queue
from runs.engine.steps import steps_by_lane
from runs.models import Lane, Run, RunStatus, Scenario, ScenarioStatus, UnitStatus, WorkUnit

logger = logging.getLogger(__name__)

OPEN = (UnitStatus.WAITING, UnitStatus.QUEUED, UnitStatus.LEASED)


def owner_new() -> str:
    """A fresh owner name per claim: the same process claiming twice is two owners."""
    # The pid is read now: pool processes fork from a parent that imported this module.
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def units_plan(*, run: Run, send: bool = True) -> dict[str, int]:
    """Cut the run's unfinished scenarios into units, one per chunk and lane. The runs lane
    (inputs, invocations, cheap evaluators) is queued; other lanes wait for it, since their
    evaluators read the invocations. Returns how many units each lane has queued now."""
    indexes = list(
        Scenario.objects.filter(run=run)
        .exclude(status__in=(ScenarioStatus.SUCCESS, ScenarioStatus.ERRORS))
        .order_by("index")
        .values_list("index", flat=True)
    )
    size = conf.chunk_size()
    lanes = steps_by_lane(list(run.steps.select_related("revision")))
    now = timezone.now()
    units = []
    for i in range(0, len(indexes), size):
        first, last = indexes[i], indexes[min(i + size, len(indexes)) - 1]
        for lane, keys in lanes.items():
            status = UnitStatus.QUEUED if lane == Lane.RUNS else UnitStatus.WAITING
            units.append(
                WorkUnit(
                    run=run,
                    lane=lane,
                    first=first,
                    last=last,
                    step_keys=keys,
                    status=status,
                    sent_at=now if status == UnitStatus.QUEUED else None,
                )
            )
    WorkUnit.objects.bulk_create(units, batch_size=1000)
    queued = sum(1 for u in units if u.status == UnitStatus.QUEUED)
    if send:
        queue.units_work(run.pk, Lane.RUNS, queued)
    return {Lane.RUNS: queued}


_CLAIM = """
UPDATE runs_workunit SET status = 'leased', owner = %(owner)s, attempts = attempts + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
WHERE id = (
    SELECT id FROM runs_workunit
    WHERE run_id = %(run)s AND lane = %(lane)s AND attempts < %(max)s
      AND (status = 'queued' OR (status = 'leased' AND lease_expires_at < now()))
    ORDER BY first LIMIT 1 FOR UPDATE SKIP LOCKED
)
RETURNING id
"""


def unit_claim(*, run_id: int, lane: str, owner: str) -> WorkUnit | None:
    """Take the next unit of the run's lane nobody holds, or None."""
    params = {
        "owner": owner,
        "lease": conf.lease_seconds(),
        "run": run_id,
        "lane": lane,
        "max": conf.unit_max_attempts(),
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CLAIM, params)
        row = cursor.fetchone()
    return WorkUnit.objects.get(pk=row[0]) if row else None


def unit_renew(*, unit: WorkUnit, owner: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_workunit SET lease_expires_at = now() + make_interval(secs => %s),"
            " updated_at = now() WHERE id = %s AND owner = %s AND status = 'leased'",
            [conf.lease_seconds(), unit.pk, owner],
        )
        return cursor.rowcount == 1


def unit_hold(*, unit: WorkUnit, owner: str) -> bool:
    """Inside a write's transaction: lock the unit's row if ``owner`` still holds it. A sweeper
    that re-queues it waits for this transaction, and a later claim sees the new owner."""
    return (
        WorkUnit.objects.select_for_update()
        .filter(pk=unit.pk, owner=owner, status=UnitStatus.LEASED)
        .exists()
    )


@transaction.atomic
def unit_complete(*, unit: WorkUnit, owner: str, status: str = UnitStatus.DONE) -> bool:
    """Mark a held unit done (or cancelled) and release the units waiting for it."""
    done = WorkUnit.objects.filter(pk=unit.pk, owner=owner, status=UnitStatus.LEASED).update(
        status=status, lease_expires_at=None, updated_at=timezone.now()
    )
    if done and unit.lane == Lane.RUNS and status == UnitStatus.DONE:
        _release_waiting(unit.run_id, unit.first)
    return bool(done)


def _release_waiting(run_id: int, first: int) -> None:
    # Inline execution (no Celery) claims every lane itself; a message then finds nothing.
    waiting = WorkUnit.objects.filter(run_id=run_id, first=first, status=UnitStatus.WAITING)
    lanes = list(waiting.values_list("lane", flat=True))
    waiting.update(status=UnitStatus.QUEUED, sent_at=timezone.now(), updated_at=timezone.now())
    for lane in lanes:
        queue.units_work(run_id, lane)


def unit_release(*, unit: WorkUnit, owner: str) -> None:
    """Give a unit back after a transient failure (the database went away): queued again, and
    the attempt not counted (it is the database's fault, not the unit's)."""
    WorkUnit.objects.filter(pk=unit.pk, owner=owner, status=UnitStatus.LEASED).update(
        status=UnitStatus.QUEUED,
        owner="",
        lease_expires_at=None,
        sent_at=timezone.now(),
        attempts=Greatest(F("attempts") - 1, 0),
    )
    queue.units_work(unit.run_id, unit.lane, countdown=2)


def unit_mark_failed(*, unit: WorkUnit, error: dict) -> None:
    WorkUnit.objects.filter(pk=unit.pk).exclude(status=UnitStatus.DONE).update(
        status=UnitStatus.FAILED, error=error, lease_expires_at=None, updated_at=timezone.now()
    )


def units_cancel(*, run_id: int) -> int:
    return WorkUnit.objects.filter(
        run_id=run_id, status__in=(UnitStatus.WAITING, UnitStatus.QUEUED)
    ).update(status=UnitStatus.CANCELLED, updated_at=timezone.now())


def units_requeue_cancelled(*, run_id: int) -> int:
    """Queue a run's cancelled units again (an online rule resumed), a message each."""
    cancelled = WorkUnit.objects.filter(run_id=run_id, status=UnitStatus.CANCELLED)
    lanes = list(cancelled.values_list("lane", flat=True))
    cancelled.update(status=UnitStatus.QUEUED, owner="", sent_at=timezone.now())
    for lane in lanes:
        queue.units_work(run_id, lane)
    return len(lanes)


def units_reset(*, run_id: int) -> None:
    """Forget a finished run's units before it is planned again (retry, added evaluators)."""
    WorkUnit.objects.filter(run_id=run_id).exclude(status=UnitStatus.LEASED).delete()


class Heartbeat:
    """Renews a unit's lease every third of it from a thread, while the unit computes."""

    def __init__(self, unit: WorkUnit, owner: str):
        self.unit, self.owner = unit, owner
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"lease-{unit.pk}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        try:
            while not self.stopped.wait(conf.lease_seconds() / 3):
                if not unit_renew(unit=self.unit, owner=self.owner):
                    logger.warning("lost the lease of unit %s", self.unit.pk)
                    return
        except Exception:  # the write re-checks the lease; a failed renewal only logs
            logger.exception("could not renew the lease of unit %s", self.unit.pk)
        finally:
            connection.close()


# --- the sweeper --------------------------------------------------------------------------------


def units_expired() -> list[WorkUnit]:
    return list(WorkUnit.objects.filter(status=UnitStatus.LEASED, lease_expires_at__lt=Now()))


def units_requeue_expired() -> tuple[list[WorkUnit], list[WorkUnit]]:
    """Expired leases: queued again (a message sent), or, after too many attempts, returned for
    the caller to fail. Returns (re-queued, to fail)."""
    requeued, exhausted = [], []
    for unit in units_expired():
        if unit.attempts >= conf.unit_max_attempts():
            exhausted.append(unit)
            continue
        updated = WorkUnit.objects.filter(
            pk=unit.pk, status=UnitStatus.LEASED, lease_expires_at__lt=Now()
        ).update(status=UnitStatus.QUEUED, owner="", lease_expires_at=None, sent_at=timezone.now())
        if updated:
            logger.warning("unit %s (%s) lost its worker; queued again", unit.pk, unit)
            queue.units_work(unit.run_id, unit.lane)
            requeued.append(unit)
    return requeued, exhausted


_STALE_LANES = """
SELECT u.run_id, u.lane, count(*) FROM runs_workunit u
JOIN runs_run r ON r.id = u.run_id AND r.status = 'running'
WHERE u.status = 'queued' AND u.sent_at < now() - make_interval(secs => %(after)s)
  AND NOT EXISTS (
      SELECT 1 FROM runs_workunit o WHERE o.run_id = u.run_id AND o.lane = u.lane
        AND o.status IN ('leased', 'done') AND o.updated_at > now() - make_interval(secs => %(after)s)
  )
GROUP BY u.run_id, u.lane
"""

RESEND_MAX = 50


def units_resend_lost() -> int:
    """Queued units of a lane where nothing was claimed for a while: their messages were lost
    (a broker restarted empty) or are stuck behind other work. Send again, a bounded number at a
    time; a message with nothing left to claim does nothing."""
    with connection.cursor() as cursor:
        cursor.execute(_STALE_LANES, {"after": conf.resend_seconds()})
        rows = cursor.fetchall()
    sent = 0
    for run_id, lane, count in rows:
        WorkUnit.objects.filter(run_id=run_id, lane=lane, status=UnitStatus.QUEUED).update(
            sent_at=timezone.now()
        )
        logger.warning(
            "run %s: no %s unit claimed lately; sending %s messages", run_id, lane, count
        )
        queue.units_work(run_id, lane, min(count, RESEND_MAX))
        sent += min(count, RESEND_MAX)
    return sent


def runs_undispatched() -> list[int]:
    """Queued runs whose dispatch message was lost (no unit planned for a while)."""
    before = timezone.now() - timedelta(seconds=conf.resend_seconds())
    runs = Run.objects.filter(status=RunStatus.QUEUED, progressed_at__lt=before, is_online=False)
    ids = list(runs.values_list("pk", flat=True))
    for run_id in ids:
        Run.objects.filter(pk=run_id).update(progressed_at=timezone.now())
        queue.run_dispatch(run_id)
    return ids
