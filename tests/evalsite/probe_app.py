"""A WSGI app for tests of the web server's worker (tests/evalsite/test_webworker.py): each
answer names the process that served it.

- ``/burn?ms=N`` keeps its process's CPU busy for N ms;
- ``/hold?n=N&dir=D`` waits, in its thread, until N requests are holding together (each
  leaves a file in D), then answers ``ok``; ``timeout`` after 10 s.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs


def app(environ, start_response):
    query = {key: values[0] for key, values in parse_qs(environ["QUERY_STRING"]).items()}
    if environ["PATH_INFO"] == "/burn":
        until = time.process_time() + int(query["ms"]) / 1000
        while time.process_time() < until:
            pass
        outcome = "burnt"
    else:
        holders = Path(query["dir"])
        (holders / uuid.uuid4().hex).touch()
        deadline = time.monotonic() + 10
        while len(list(holders.iterdir())) < int(query["n"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        outcome = "ok" if len(list(holders.iterdir())) >= int(query["n"]) else "timeout"
    body = f"{os.getpid()} {outcome}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
