"""Spans per second through the batch endpoint, POST /api/v1/traces.

    uv run python benchmarks/ingest_bench.py [--requests 10] [--traces 200] [--spans 10]

Uses the database the settings name (DATABASE_URL, else the embedded PostgreSQL), creates a
throw-away project with an editor API key, sends realistic traces (a workflow root, retrieval,
LLM calls with tokens and costs, tools) through Django's test client, i.e. the whole stack
(middleware, key authentication, JSON parsing, validation, upserts, summaries) without a
network hop, then deletes the project. Each request carries new trace ids.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

from django.test import Client  # noqa: E402

from evalsite.models import Project, Role  # noqa: E402
from evalsite.services import api_key_create, project_create, user_get_or_create  # noqa: E402


def trace_spans(spans_per_trace: int) -> list[dict]:
    trace_id = uuid.uuid4().hex
    root_id = uuid.uuid4().hex[:16]
    spans = [
        {
            "trace_id": trace_id,
            "span_id": root_id,
            "name": "support_agent",
            "kind": "workflow",
            "start_time": "2026-11-20T10:00:00.000Z",
            "end_time": "2026-11-20T10:00:02.500Z",
            "attributes": {
                "ag": {
                    "data": {
                        "inputs": {"question": "Where is my order #4411?", "user": "u-829"},
                        "outputs": "Your order left the warehouse yesterday.",
                    },
                    "meta": {"app": "support", "env": "prod"},
                }
            },
        }
    ]
    kinds = ["retriever", "llm", "tool", "llm"]
    for i in range(1, spans_per_trace):
        kind = kinds[i % len(kinds)]
        attributes: dict = {
            "ag": {"data": {"inputs": {"step": i, "query": "order 4411"}, "outputs": f"r{i}"}}
        }
        if kind == "llm":
            attributes.update(
                {
                    "gen_ai.system": "openai",
                    "gen_ai.request.model": "gpt-4o-mini",
                    "gen_ai.usage.input_tokens": 120 + i,
                    "gen_ai.usage.output_tokens": 30,
                }
            )
            attributes["ag"]["metrics"] = {"unit": {"costs": {"total": 0.00004}}}
        spans.append(
            {
                "trace_id": trace_id,
                "span_id": uuid.uuid4().hex[:16],
                "parent_id": root_id,
                "name": f"{kind}_{i}",
                "kind": kind,
                "start_time": f"2026-11-20T10:00:00.{i:03d}Z",
                "end_time": f"2026-11-20T10:00:01.{i:03d}Z",
                "attributes": attributes,
            }
        )
    return spans


def body(traces: int, spans: int) -> bytes:
    items = [s for _ in range(traces) for s in trace_spans(spans)]
    return json.dumps({"spans": items}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--traces", type=int, default=200, help="traces per request")
    parser.add_argument("--spans", type=int, default=10, help="spans per trace")
    args = parser.parse_args()

    owner = user_get_or_create(username="ingest-bench", password=uuid.uuid4().hex)
    project = project_create(name="Ingest bench", slug=f"bench-{uuid.uuid4().hex[:8]}", owner=owner)
    _, key = api_key_create(project=project, name="bench", created_by=owner, role=Role.EDITOR)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    try:
        # The bodies are built up front: the figure is the server's, not the generator's.
        bodies = [body(args.traces, args.spans) for _ in range(args.requests + 1)]
        warm = client.post("/api/v1/traces", bodies[0], content_type="application/json")
        assert warm.status_code == 200, warm.content[:500]
        started = time.perf_counter()
        for payload in bodies[1:]:
            response = client.post("/api/v1/traces", payload, content_type="application/json")
            assert response.status_code == 200, response.content[:500]
        elapsed = time.perf_counter() - started
        spans = args.requests * args.traces * args.spans
        size = sum(len(b) for b in bodies[1:]) / args.requests / 1024
        print(
            f"{args.requests} requests x {args.traces} traces x {args.spans} spans "
            f"({size:.0f} KiB each): {spans} spans in {elapsed:.2f} s = "
            f"{spans / elapsed:,.0f} spans/s ({elapsed / args.requests * 1000:.0f} ms/request)"
        )
    finally:
        Project.objects.filter(pk=project.pk).delete()


if __name__ == "__main__":
    main()
