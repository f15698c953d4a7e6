"""Queueing the runs app's Celery work. Services call these instead of importing tasks: a task
is looked up by name in the Celery app (registered when the worker or the web process loads the
app's tasks), so services never import ``runs.tasks`` and tasks may import every service.

Everything is sent after the current transaction commits, so a worker never looks for rows that
are not there yet."""

from __future__ import annotations

import logging
import threading

from django.db import connection, transaction

from evalsite.celery import app as celery_app
from evalsite.redis_client import client as redis_client
from evalsite.redis_client import site_key
from runs import conf

logger = logging.getLogger(__name__)
_IMPORTING = threading.Lock()

# Keys carry the database's name: two sites (or a test run) sharing one Redis never mix runs.
REFRESH_KEY = "evalsite:{db}:runs:refresh:{run_id}"
DIRTY_KEY = "evalsite:{db}:runs:dirty:{run_id}"  # scenarios whose cells landed since the refresh


def _key(template: str, run_id: int) -> str:
    return template.format(db=connection.settings_dict["NAME"], run_id=run_id)


def send(name: str, args: tuple | list = (), **options) -> None:
    """Queue task ``name`` once the transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send_now(name, args, **options))


def send_now(name: str, args: tuple | list = (), **options) -> None:
    # Our app, not celery.current_app: that one is per thread, and a thread the app was never
    # made current in (a threaded web server, a thread pool) gets Celery's empty default app.
    if name not in celery_app.tasks:
        # A web process has not loaded the apps' task modules yet: autodiscovery does, once,
        # under a lock (threads sending at once would each see half-registered modules).
        with _IMPORTING:
            if name not in celery_app.tasks:
                celery_app.loader.import_default_modules()
    # The registered task honours task_always_eager (tests) and its own options.
    celery_app.tasks[name].apply_async(tuple(args), **options)


def run_dispatch(run_id: int) -> None:
    send("runs.tasks.run_dispatch", (run_id,))


def units_work(run_id: int, lane: str, count: int = 1, countdown: float | None = None) -> None:
    """One message per unit to claim: each claims whichever queued unit of the run's lane comes
    next, so a message lost or doubled never loses or doubles work."""
    for _ in range(count):
        send("runs.tasks.unit_work", (run_id, lane), queue=lane, countdown=countdown)


def read_model_refresh(run_id: int, scenario_ids: list[int] = ()) -> None:
    """Debounced refresh of a run's metrics, mappings and inferred schemas. The scenarios whose
    cells land are added to a set in the shared Redis (now, and again after the commit, so a
    refresh that took the set in between misses none); the first request after a refresh sets a
    key and queues the task a moment later, the others ride along. The task deletes the key
    when it starts, so cells that land during a refresh queue the next one: the read model
    trails the last cell by a few seconds."""
    ids = list(scenario_ids)
    _dirty_add(run_id, ids)

    def queue() -> None:
        if _dirty_add(run_id, ids, debounce=True):
            send_now(
                "runs.tasks.run_read_model_refresh",
                (run_id,),
                countdown=conf.refresh_delay_seconds(),
            )

    transaction.on_commit(queue)


def read_model_refresh_now(run_id: int) -> None:
    """A refresh of every scenario (which ones changed went with a transaction that failed),
    after the commit, not debounced: a run ended without its final refresh must not wait on a
    debounce key whose message may be gone."""
    send("runs.tasks.run_read_model_refresh", (run_id, True))


def _dirty_add(run_id: int, ids: list[int], debounce: bool = False) -> bool:
    """Returns whether a refresh should be queued (always, when Redis cannot be reached)."""
    try:
        pipe = redis_client().pipeline()
        if ids:
            pipe.sadd(_key(DIRTY_KEY, run_id), *ids)
            pipe.expire(_key(DIRTY_KEY, run_id), 86400)
        if debounce:
            pipe.set(_key(REFRESH_KEY, run_id), 1, nx=True, ex=300)
        results = pipe.execute()
    except Exception:  # no Redis: refresh every time rather than never
        logger.warning("no Redis for the refresh debounce of run %s", run_id, exc_info=True)
        return True
    return bool(results[-1]) if debounce else False


def read_model_refresh_started(run_id: int) -> list[int] | None:
    """Called by the refresh as it starts: later cells queue another one. Returns the scenarios
    whose cells landed since the last refresh, or None when that is unknown (refresh them all)."""
    key = _key(DIRTY_KEY, run_id)
    try:
        pipe = redis_client().pipeline()
        pipe.delete(_key(REFRESH_KEY, run_id))
        pipe.smembers(key)
        pipe.delete(key)
        _, members, _ = pipe.execute()
    except Exception:
        logger.warning("no Redis for the refresh debounce of run %s", run_id, exc_info=True)
        return None
    return sorted(int(m) for m in members)


def run_finished(run_id: int) -> None:
    """Once, when a run ends (after the commit): the features that wait for it."""
    send("runs.tasks.run_finished", (run_id,))


def values_pack(run_id: int) -> None:
    """Pack a finished run's read model for comparisons once this refresh commits, on a worker:
    ~0.9 s a 100,000 scenarios that neither the refresh nor a request (closing a logged run)
    waits for. Comparisons read the rows until the pack lands. A task finding the run already
    packed at its last refresh does nothing, so refreshes that end before their tasks run are
    packed once; the beat's ``values_pack_sweep`` queues another for a task that was lost."""
    send("runs.tasks.run_values_pack", (run_id,))


def runs_mappings_refresh(run_ids: list[int]) -> None:
    """Rebuild runs' mappings and metrics (an evaluator revision got its outputs schema)."""
    for run_id in run_ids:
        send("runs.tasks.run_mappings_and_metrics_refresh", (run_id,))


def online_dispatch(project_id: int, trace_ids: list[int]) -> None:
    """After an ingest commits: match these traces a few seconds later. The ingest calls this
    only when the project has an active trace rule or an annotation queue's feed (it asks in
    its own first statement). Never fails the ingest (a missed trace can be backfilled).

    The ids join the project's pending set in the shared Redis; the first ingest after a
    dispatch started queues the next one, the others ride along: a message every few seconds,
    not one per ingest (publishing one cost a tenth of an ingest's CPU). Without Redis, each
    ingest queues its traces in a message of their own, as before."""
    if not trace_ids:
        return

    def queue() -> None:
        try:
            pipe = redis_client().pipeline(transaction=False)
            pipe.sadd(_online_key(project_id), *trace_ids)
            pipe.expire(_online_key(project_id), 86400)
            pipe.set(_online_key(project_id, "queued"), 1, nx=True, ex=ONLINE_QUEUED_SECONDS)
            first, args = pipe.execute()[-1], (project_id,)
        except Exception:
            logger.warning(
                "no Redis for the online dispatch of project %s", project_id, exc_info=True
            )
            first, args = True, (project_id, trace_ids)
        if not first:
            return
        try:
            send_now(
                "runs.tasks.ingest_online_dispatch", args, countdown=conf.online_delay_seconds()
            )
        except Exception:
            logger.exception("could not queue online evaluation of %d traces", len(trace_ids))

    transaction.on_commit(queue)


# A dispatch message that is lost holds the next one back this long at most; one that waits
# longer in a busy queue only lets a second be queued, which finds little or nothing to do.
ONLINE_QUEUED_SECONDS = 60


def _online_key(project_id: int, *rest: str) -> str:
    return site_key("online", "pending", str(project_id), *rest)


def online_dispatch_started(project_id: int) -> list[int]:
    """Called by the dispatch as it starts: ingests from now on queue the next one. Takes (and
    empties) the project's pending traces, in one transaction of Redis's: two dispatches on two
    hosts never take the same trace."""
    pipe = redis_client().pipeline()
    pipe.delete(_online_key(project_id, "queued"))
    pipe.smembers(_online_key(project_id))
    pipe.delete(_online_key(project_id))
    _, members, _ = pipe.execute()
    return sorted(int(member) for member in members)


def online_dispatch_pending(project_id: int) -> bool:
    """Whether traces of the project wait for a dispatch, or a dispatch is queued for them."""
    pipe = redis_client().pipeline()
    pipe.exists(_online_key(project_id), _online_key(project_id, "queued"))
    return bool(pipe.execute()[0])


def online_dispatch_unfinished(project_id: int, trace_ids: list[int]) -> None:
    """A dispatch that took traces and failed gives them back for its retry (best effort: the
    backfill evaluates what is lost)."""
    if not trace_ids:
        return
    try:
        redis_client().sadd(_online_key(project_id), *trace_ids)
    except Exception:
        logger.warning("could not give back %d traces for online rules", len(trace_ids))


def online_evaluate(rule_id: int, trace_ids: list[int]) -> None:
    send("runs.tasks.ingest_online_evaluate", (rule_id, trace_ids))


def online_evaluate_sessions(rule_id: int, session_ids: list[int]) -> None:
    """A session rule's backfill chunk (``Session`` primary keys)."""
    send("runs.tasks.ingest_online_evaluate_sessions", (rule_id, session_ids))


def _debounced(name: str, key: str, args: tuple) -> None:
    """Queue ``name`` after the commit unless one is already waiting (the task clears ``key``
    as it starts, so work that lands meanwhile queues the next one)."""

    def queue() -> None:
        try:
            first = redis_client().set(key, 1, nx=True, ex=300)
        except Exception:  # no Redis: refresh every time rather than never
            logger.warning("no Redis for the debounce of %s", name, exc_info=True)
            first = True
        if first:
            send_now(name, args, countdown=conf.refresh_delay_seconds())

    transaction.on_commit(queue)


def debounce_clear(key: str) -> None:
    try:
        redis_client().delete(key)
    except Exception:
        logger.warning("no Redis to clear %s", key, exc_info=True)


def agreement_key(queue_id: int) -> str:
    return site_key("review", "agreement", str(queue_id))


def queue_agreement_refresh(queue_id: int) -> None:
    """Recompute an annotation queue's agreement a moment after reviews land (debounced)."""
    _debounced("runs.tasks.queue_agreement_refresh", agreement_key(queue_id), (queue_id,))


def reliability_refresh(project_id: int, trace_ids: list[int]) -> None:
    """Recompute the reliability records that rest on these traces' gold labels."""
    send("runs.tasks.reliability_refresh", (project_id, trace_ids))
