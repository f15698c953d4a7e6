"""Celery tasks of the evaluators app. ``code_*`` tasks are routed to the ``code`` queue.

They are the far end of the ``celery`` code runner (evaluators.sandbox_celery): the caller waits
for their results, so they keep them (``ignore_result=False``, against the global default), and
they never retry: evaluating is pure, and the caller decides what a lost batch means.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from evaluators import sandbox_celery


@shared_task(ignore_result=False, track_started=True, acks_late=True)
def code_run_batch(
    *,
    project_key: str,
    runtime: str,
    code: str,
    revision_key: str,
    version: str,
    calls: list[dict[str, Any]],
    timeout_s: float,
    entry: str = "evaluate",
) -> list[dict[str, Any]]:
    return sandbox_celery.batch_run_here(
        entry=entry,
        project_key=project_key,
        runtime=runtime,
        code=code,
        revision_key=revision_key,
        version=version,
        calls=calls,
        timeout_s=timeout_s,
    )


@shared_task(ignore_result=False, track_started=True, acks_late=True)
def code_check(*, runtime: str, code: str, version: str = "2") -> list[dict[str, Any]]:
    return sandbox_celery.check_here(runtime=runtime, code=code, version=version)


@shared_task(ignore_result=False, track_started=True)
def code_status() -> dict[str, Any]:
    return sandbox_celery.status_here()
