"""Celery tasks of the runs app: thin, id-in, each calls one service."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError

from runs import services

logger = logging.getLogger(__name__)
TRANSIENT = (OperationalError, InterfaceError)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def run_dispatch(run_id: int) -> int:
    return services.run_dispatch(run_id=run_id)


@shared_task(bind=True, acks_late=True, max_retries=5)
def run_chunk(self, run_id: int, first: int, last: int) -> int:
    try:
        return services.scenarios_process(run_id=run_id, first=first, last=last)
    except TRANSIENT as exc:
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, 30))
    except Exception as exc:
        # A bug, not a blip: record it on the chunk's missing cells so the run still ends.
        logger.exception("run %s scenarios %s..%s failed", run_id, first, last)
        services.scenarios_fail(run_id=run_id, first=first, last=last, exc=exc)
        return 0


@shared_task(acks_late=True)
def runs_resume_stalled() -> list[int]:
    return services.runs_resume_stalled()


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def run_mappings_and_metrics_refresh(run_id: int) -> None:
    from runs import backfill

    backfill.run_mappings_and_metrics_refresh(run_id=run_id)


# --- online evaluation (tasks named ingest_* go to the ingest queue) ---------------------------


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def ingest_online_dispatch(project_id: int, trace_ids: list[int]) -> int:
    from runs import online

    return online.online_dispatch(project_id=project_id, trace_ids=trace_ids)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def ingest_online_evaluate(rule_id: int, trace_ids: list[int]) -> int:
    from runs import online

    return online.online_evaluate_ids(rule_id=rule_id, trace_ids=trace_ids)
