"""gunicorn's settings for evalsite, read by every ``gunicorn evalsite.wsgi`` started in this
directory or given ``-c gunicorn.conf.py`` (``manage.py up``, the README's deploy command, the
benchmarks); the command line and ``GUNICORN_CMD_ARGS`` still win. docs/configuration.md."""

import os

# A process per core this process may run on (at least two, at most eight: each thread holds a
# database connection), each with threads for requests that wait on something else (model
# calls, streamed exports); a new connection goes to the process best placed to serve it, an
# idle one first (evalsite/webworker.py).
worker_class = "evalsite.webworker.BalancedThreadWorker"
workers = int(os.environ.get("WEB_CONCURRENCY") or min(8, max(2, len(os.sched_getaffinity(0)))))
threads = int(os.environ.get("WEB_THREADS") or 4)
