"""Throughput and resilience of the LLM judge against a local chat-completions server.

    uv run python benchmarks/judge_bench.py [--cells 1000] [--latency 0.2] [--rate-limited 0.2]

Starts an OpenAI-compatible server on 127.0.0.1 that answers every call after ``--latency``
seconds, creates a throwaway project and model connection (rate limit on, so every call goes
through the Redis limiter; traces recorded), and runs one batch of ``--cells`` judgements through
``evaluations_invoke_many`` in this one process, as a run's worker does. It prints:

1. judgements per second with every call answered;
2. the same batch with ``--rate-limited`` of the calls answered 429 (``Retry-After: 1``): every
   cell must finish, none may be lost, and no 429 may end up as a score. Success cells must hold
   the server's real verdict; error cells must be errors (``rate_limited``), never scores;
3. the same with 429s carrying no Retry-After (client-side exponential backoff only).

The project is deleted at the end (its traces with it). Needs PostgreSQL and Redis like the app
(DATABASE_URL / REDIS_URL, or the embedded ones).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERDICT = {"reasoning": "matches the reference", "score": 0.75}


# --- the model server (its own process, so it does not share this one's GIL) -----------------


def serve(latency: float, rate_limited: float, retry_after: str) -> None:
    rng = random.Random(7)
    lock = threading.Lock()
    body_ok = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "judge-1",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps(VERDICT)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320},
        }
    ).encode()
    body_429 = json.dumps({"error": {"message": "slow down", "type": "rate_limit"}}).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like real endpoints
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                limited = rng.random() < rate_limited
            if limited:
                self._send(429, body_429, {"Retry-After": retry_after} if retry_after else {})
                return
            time.sleep(latency)
            self._send(200, body_ok, {})

        def _send(self, status, body, headers):
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 512

    httpd = Server(("127.0.0.1", 0), Handler)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


class ModelServer:
    def __init__(self, latency: float, rate_limited: float = 0.0, retry_after: str = "") -> None:
        argv = [sys.executable, __file__, "--serve", "--latency", str(latency),
                "--rate-limited", str(rate_limited), "--retry-after", retry_after]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().strip()}/v1"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


# --- the judge side -----------------------------------------------------------------------------


def setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()
    import logging

    logging.getLogger("httpx2").setLevel(logging.WARNING)


def batch(project, cells: int) -> tuple[list, float]:
    from evaluators.services import evaluations_invoke_many

    items = [
        ({"country": f"Country {i}", "correct_answer": f"Capital {i}"}, f"Capital {i}", None)
        for i in range(cells)
    ]
    started = time.perf_counter()
    results = evaluations_invoke_many(
        kind="llm_judge",
        parameters={"connection": "bench", "max_retries": 6},
        items=items,
        project=project,
    )
    return results, time.perf_counter() - started


def check(results: list, cells: int) -> dict:
    expected = {"score": 0.75, "success": True, "reasoning": VERDICT["reasoning"]}
    statuses: dict[str, int] = {}
    for result in results:
        statuses[result.status] = statuses.get(result.status, 0) + 1
    not_from_model = [
        r
        for r in results
        if (r.status == "success" and r.outputs != expected)
        or (r.status != "success" and r.outputs is not None)
    ]
    return {
        "cells": len(results),
        "lost": cells - len(results),
        "statuses": statuses,
        "scores_not_from_the_model": len(not_from_model),
        "error_codes": sorted({r.error["code"] for r in results if r.status == "error"}),
        "attempts": sum(r.details.get("attempts", 0) for r in results),
    }


def scenario(label: str, project, connection, args, rate_limited=0.0, retry_after="") -> None:
    from tests.llm_server import clear_judge_state

    clear_judge_state()
    server = ModelServer(args.latency, rate_limited, retry_after)
    try:
        connection.base_url = server.url
        connection.save(update_fields=["base_url"])
        results, seconds = batch(project, args.cells)
    finally:
        server.close()
    print(f"{label}: {args.cells / seconds:7.1f} judgements/s ({seconds:.2f} s) "
          f"{check(results, args.cells)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rate-limited", type=float, default=0.2)
    parser.add_argument("--retry-after", default="1")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.latency, args.rate_limited, args.retry_after)
        return
    setup_django()
    from django.conf import settings

    from evalsite.services import project_create, user_get_or_create
    from evaluators.judge.conf import setting
    from evaluators.judge.connections import model_connection_create
    from runs.models import Trace

    settings.EVALSITE_MODELS_ALLOW_PRIVATE = True
    suffix = uuid.uuid4().hex[:8]
    owner = user_get_or_create(username=f"bench-{suffix}", password=uuid.uuid4().hex)
    project = project_create(name="Judge bench", slug=f"judge-bench-{suffix}", owner=owner)
    connection = model_connection_create(
        project=project,
        name="bench",
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-bench",
        model_names=["judge-1"],
        prices={"judge-1": {"prompt": 0.15, "completion": 0.6}},
        rate_limit_rpm=1_000_000,
    )
    print(f"server latency {args.latency * 1000:.0f} ms, {args.cells} cells per batch, one "
          f"process, EVALSITE_JUDGE_CONCURRENCY={setting('EVALSITE_JUDGE_CONCURRENCY')}")  # fmt: skip
    try:
        scenario("1. every call answered         ", project, connection, args)
        traces = Trace.objects.filter(project=project, source="judge").count()
        print(f"   judge traces recorded: {traces}")
        share = f"{args.rate_limited:.0%} answered 429"
        scenario(f"2. {share}, Retry-After: {args.retry_after}", project, connection, args,
                 args.rate_limited, args.retry_after)  # fmt: skip
        scenario(f"3. {share}, no Retry-After ", project, connection, args,
                 args.rate_limited, "")  # fmt: skip
    finally:
        project.delete()
        owner.delete()


if __name__ == "__main__":
    main()
