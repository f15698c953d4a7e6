"""Queueing the runs app's Celery work. Services call these instead of importing tasks: a task
is looked up by name in the Celery app (registered when the worker or the web process loads the
app's tasks), so services never import ``runs.tasks`` and tasks may import every service.

Everything is sent after the current transaction commits, so a worker never looks for rows that
are not there yet."""

from __future__ import annotations

import functools
import logging
import threading
from contextlib import suppress

from django.db import connection, transaction

from evalsite.celery import app as celery_app
from evalsite.redis_client import client as redis_client
from evalsite.redis_client import glob_escape, site_key
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

    The ids join the project's pending traces in the shared Redis, each with the time it first
    arrived; the first ingest after a dispatch started queues the next one, the others ride
    along: a message every few seconds, not one per ingest (publishing one cost a tenth of an
    ingest's CPU). A dispatch takes the traces that arrived ``online_delay_seconds`` ago or more
    and queues the next for the rest (``online_dispatch_take``). Without Redis, each ingest
    queues its traces in a message of their own."""
    if not trace_ids:
        return

    def queue() -> None:
        try:
            first = _scripts().add(
                keys=[_online_key(project_id), _online_key(project_id, "queued")],
                args=[_queued_seconds(), *trace_ids],
            )
            args = (project_id,)
        except Exception:
            logger.warning(
                "no Redis for the online dispatch of project %s", project_id, exc_info=True
            )
            first, args = True, (project_id, trace_ids)
        if first:
            _dispatch_send(project_id, args, conf.online_delay_seconds())

    transaction.on_commit(queue)


def _dispatch_send(project_id: int, args: tuple, countdown: float) -> None:
    try:
        send_now("runs.tasks.ingest_online_dispatch", args, countdown=countdown)
    except Exception:
        logger.exception("could not queue the online dispatch of project %s", project_id)
        with suppress(Exception):  # the next ingest, or the sweep, queues it
            redis_client().delete(_online_key(project_id, "queued"))


ONLINE_TAKE_MAX = 2000  # traces a dispatch takes; it queues the next one for the rest
ONLINE_INFLIGHT_SECONDS = 3600  # a dispatch's traces, kept for its retry or redelivery


def _queued_seconds() -> int:
    # A dispatch message lost holds the next one back this long at most (then the next ingest,
    # or the sweep, queues one); one waiting longer in a busy queue only lets a second be
    # queued, which finds little or nothing to do.
    return int(conf.online_delay_seconds()) + 60


def _online_key(project_id: int, *rest: str) -> str:
    return site_key("online", "pending", str(project_id), *rest)


# KEYS[1] the project's pending traces (a sorted set scored by first arrival, Redis's clock),
# KEYS[2] its "a dispatch is queued" flag. ARGV[1] the flag's life, ARGV[2..] trace ids.
# Returns 1 when this call set the flag: the caller queues the dispatch.
_ADD = """
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'NX', at, ARGV[i])
end
redis.call('EXPIRE', KEYS[1], 86400)
if redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[1]) then return 1 end
return 0
"""

# KEYS[1] pending, KEYS[2] the flag, KEYS[3] this dispatch's traces. ARGV: the delay (s), the
# most to take, the flag's life, the in-flight set's life. Moves the traces due (arrived at
# least the delay ago) into KEYS[3], unless KEYS[3] holds some already (this dispatch again:
# a retry, or a redelivery after its worker died). Returns {ids, wait}: wait is -1 when nothing
# is left pending, else the seconds until the next dispatch is due (the flag is then set).
_TAKE = """
local taken = redis.call('SMEMBERS', KEYS[3])
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
if #taken == 0 then
  redis.call('DEL', KEYS[2])
  taken = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', at - tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2]))
  for i = 1, #taken, 500 do
    local chunk = {unpack(taken, i, math.min(i + 499, #taken))}
    redis.call('ZREM', KEYS[1], unpack(chunk))
    redis.call('SADD', KEYS[3], unpack(chunk))
  end
  if #taken > 0 then redis.call('EXPIRE', KEYS[3], ARGV[4]) end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 0 then return {taken, '-1'} end
redis.call('SET', KEYS[2], 1, 'EX', ARGV[3])
return {taken, tostring(math.max(0, tonumber(first[2]) + tonumber(ARGV[1]) - at))}
"""


class _Scripts:
    def __init__(self, client):
        self.add = client.register_script(_ADD)
        self.take = client.register_script(_TAKE)


@functools.cache
def _scripts_for(client) -> _Scripts:
    return _Scripts(client)


def _scripts() -> _Scripts:
    return _scripts_for(redis_client())


def online_dispatch_take(project_id: int, dispatch_id: str) -> list[int]:
    """Called by a dispatch as it starts: ingests from now on queue the next one. Moves the
    project's traces that are due (arrived ``online_delay_seconds`` ago or more, at most
    ``ONLINE_TAKE_MAX``) into this dispatch's own set, in one step of Redis's, so two dispatches
    on two hosts never take the same trace, and queues the next dispatch when traces are left.
    The same dispatch run again (a retry, or a redelivery after its worker died) gets the same
    traces back. ``online_dispatch_done`` forgets them."""
    ids, wait = _scripts().take(
        keys=[
            _online_key(project_id),
            _online_key(project_id, "queued"),
            _online_key(project_id, "inflight", dispatch_id),
        ],
        args=[
            conf.online_delay_seconds(),
            ONLINE_TAKE_MAX,
            _queued_seconds(),
            ONLINE_INFLIGHT_SECONDS,
        ],
    )
    if float(wait) >= 0:
        _dispatch_send(project_id, (project_id,), float(wait))
    return sorted(int(trace_id) for trace_id in ids)


def online_dispatch_done(project_id: int, dispatch_id: str) -> None:
    redis_client().delete(_online_key(project_id, "inflight", dispatch_id))


def online_dispatch_pending(project_id: int) -> bool:
    """Whether traces of the project wait for a dispatch, or a dispatch is queued for them."""
    return bool(redis_client().exists(_online_key(project_id), _online_key(project_id, "queued")))


def online_dispatch_sweep() -> int:
    """Beat: a project whose traces wait with no dispatch queued (its message was lost, and no
    ingest came since to queue another) gets one. Returns how many were queued."""
    client, queued = redis_client(), 0
    prefix = _online_key(0).removesuffix("0")
    for key in client.scan_iter(match=glob_escape(prefix) + "*", count=1000):
        project = key.decode().removeprefix(prefix)
        if not project.isdigit():
            continue  # a flag or a dispatch's set
        flag = _online_key(int(project), "queued")
        if client.zcard(key) and client.set(flag, 1, nx=True, ex=_queued_seconds()):
            _dispatch_send(int(project), (int(project),), 0)
            queued += 1
    return queued


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
