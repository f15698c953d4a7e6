"""Celery tasks of the runs app: thin, id-in, each calls one service. Services queue them by
name through ``runs.queue``; routes and queues are in settings.py and evalsite/celery.py."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError

from runs import engine, online, review, traces
from runs import queue as work
from runs.metrics import backfill

logger = logging.getLogger(__name__)
TRANSIENT = (OperationalError, InterfaceError)
RETRY = {"autoretry_for": TRANSIENT, "retry_backoff": True, "max_retries": 5}


@shared_task(acks_late=True, **RETRY)
def run_dispatch(run_id: int) -> int:
    return engine.run_dispatch(run_id=run_id)


@shared_task(acks_late=True, **RETRY)
def unit_work(run_id: int, lane: str) -> int | None:
    """Claim and compute the next unit of a run's lane (sent to the lane's queue)."""
    process = online.online_unit_process if engine.run_is_online(run_id=run_id) else None
    return engine.unit_work(run_id=run_id, lane=lane, process=process)


@shared_task(acks_late=True)
def units_sweep() -> dict[str, int]:
    return engine.units_sweep()


@shared_task(acks_late=True, **RETRY)
def run_read_model_refresh(run_id: int, rescan: bool = False) -> None:
    engine.read_model_refresh(run_id=run_id, rescan=rescan)
    review.reliability_refresh_for_run(run_id=run_id)


@shared_task(acks_late=True, **RETRY)
def run_values_pack(run_id: int) -> int:
    return engine.read_model_pack(run_id=run_id)


@shared_task(acks_late=True)
def values_pack_sweep() -> int:
    """Beat: finished runs left without packs of their last refresh get a pack task again."""
    return engine.read_model_packs_sweep()


@shared_task(acks_late=True, **RETRY)
def run_finished(run_id: int) -> None:
    """Sent once when a run ends: an alignment's two records, the records of its evaluators."""
    review.alignments_refresh_for_run(run_id=run_id)
    review.reliability_refresh_for_run(run_id=run_id)


@shared_task(acks_late=True, **RETRY)
def run_mappings_and_metrics_refresh(run_id: int) -> None:
    backfill.run_mappings_and_metrics_refresh(run_id=run_id)


# --- online evaluation (tasks named ingest_* go to the ingest queue) ---------------------------


@shared_task(bind=True, acks_late=True, **RETRY)
def ingest_online_dispatch(self, project_id: int, trace_ids: list[int] | None = None) -> int:
    """The project's traces due for matching (waiting in Redis), or those given (sent by an
    ingest that found no Redis). A transient failure is retried on the same traces; any other
    drops them, as a lost message would (a backfill evaluates them)."""
    dispatch_id = None
    if trace_ids is None:
        dispatch_id = self.request.id or "inline"
        trace_ids = work.online_dispatch_take(project_id, dispatch_id)
    try:
        review.items_feed(project_id=project_id, trace_ids=trace_ids)
        queued = online.online_dispatch(project_id=project_id, trace_ids=trace_ids)
    except TRANSIENT:
        raise  # retried with the same id: online_dispatch_take gives the same traces
    except Exception:
        if dispatch_id:
            work.online_dispatch_done(project_id, dispatch_id)
        raise
    if dispatch_id:
        work.online_dispatch_done(project_id, dispatch_id)
    return queued


@shared_task(acks_late=True)
def ingest_online_dispatch_sweep() -> int:
    """Beat: traces waiting in Redis with no dispatch queued for them get one."""
    return work.online_dispatch_sweep()


@shared_task(acks_late=True, **RETRY)
def ingest_online_evaluate(rule_id: int, trace_ids: list[int]) -> int:
    return online.online_evaluate_ids(rule_id=rule_id, trace_ids=trace_ids)


@shared_task(acks_late=True)
def ingest_sessions_sweep() -> dict[str, int]:
    """Beat: session rules judge the sessions that went idle (two beats at once are harmless)."""
    return online.online_sessions_sweep()


@shared_task(acks_late=True, **RETRY)
def ingest_online_evaluate_sessions(rule_id: int, session_ids: list[int]) -> int:
    return online.online_evaluate_session_ids(rule_id=rule_id, session_ids=session_ids)


# --- annotation queues and reliability -----------------------------------------------------------


@shared_task(acks_late=True, **RETRY)
def queue_agreement_refresh(queue_id: int) -> None:
    work.debounce_clear(work.agreement_key(queue_id))
    review.queue_agreement_refresh_by_id(queue_id=queue_id)


@shared_task(acks_late=True, **RETRY)
def reliability_refresh(project_id: int, trace_ids: list[int]) -> int:
    return review.reliability_refresh_for_traces(project_id=project_id, trace_ids=trace_ids)


# --- span partitions and retention (beat; both take advisory locks, so two beats are harmless) ---


@shared_task(acks_late=True, **RETRY)
def partitions_ensure() -> dict[str, list[str]]:
    ensured = traces.partitions_ensure()
    return {"created": ensured.created, "blocked": ensured.blocked}


# Batches commit one by one: a run stopped by its time limit resumes at the next beat.
@shared_task(acks_late=True, soft_time_limit=3300, time_limit=3600)
def traces_retention() -> dict:
    return traces.retention_apply().as_dict()
