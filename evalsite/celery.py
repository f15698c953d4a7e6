"""The Celery app. Configuration lives in settings.py under CELERY_*; queues are declared here.

One queue per kind of work, so each can get its own worker pool and concurrency:
``runs`` (dispatch, work units that call applications and run cheap evaluators, the sweeper,
metric refreshes), ``code`` (code units and batches with the ``celery`` code runner), ``llm``
(units of model judges, for a thread-pool worker), ``ingest`` (online rules) and ``default``.
``manage.py up`` starts the workers for one machine; README.md shows them for several.
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
