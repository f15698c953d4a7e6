"""The Celery app. Configuration lives in settings.py under CELERY_*; queues are declared here.

One queue per kind of work, so each can get its own worker pool and concurrency:
``runs`` (orchestration and chunk evaluation, judge calls included), ``code`` (sandboxed code
evaluations sent by the celery code runner), ``llm`` (declared for judge calls; no tasks yet),
``ingest`` (trace ingestion and online rules) and ``default``.
Start a worker for all of them:  uv run celery -A evalsite worker -l info -Q default,runs,code,llm,ingest
"""

import os

from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

QUEUES = ("default", "runs", "code", "llm", "ingest")

app = Celery("evalsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Each queue has its own exchange and routing key, so a task lands in exactly one queue.
app.conf.task_queues = [Queue(name, Exchange(name), routing_key=name) for name in QUEUES]
app.autodiscover_tasks()
