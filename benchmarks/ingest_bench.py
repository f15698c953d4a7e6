"""Spans per second persisted through the ingestion doors, over HTTP to a real server.

    uv run python benchmarks/ingest_bench.py [--path native|otlp|both] [--threads 4]
        [--spans-per-request 100] [--requests 200] [--spans 10] [--workers N]
        [--server-threads N]

Uses the database the settings name (DATABASE_URL, else the embedded PostgreSQL). Starts the web
server the way ``manage.py up`` does (gunicorn with gunicorn.conf.py: a process per core, at
least two, of 4 threads each, unless ``WEB_CONCURRENCY``/``WEB_THREADS`` or ``--workers`` /
``--server-threads`` say otherwise), then for each path sends ``--requests`` bodies of ``--spans-per-request`` spans (whole traces of
``--spans`` spans: a workflow root with a session, retrieval, LLM calls with tokens and costs,
tools; new trace ids in every request) from ``--threads`` client threads, each on its own
keep-alive connection:

- native: ``POST /api/v1/traces``, ``{"spans": [...]}`` (JSON);
- otlp: ``POST /api/v1/otlp/v1/traces``, an ``ExportTraceServiceRequest`` in protobuf, the
  OpenTelemetry SDKs' default, with GenAI and OpenInference attributes.

Each path runs twice, each time in a fresh project: without online rules, then with an active
online rule matching every trace, so every ingest also looks the rules up and queues the
dispatch (to ``--broker``, a Redis database of the benchmark's own whose ``ingest`` queue is
emptied at the end: no worker evaluates here, that cost is the workers'). The figure is the
spans and traces counted in the database afterwards, divided by the wall time from the first
request to the last answer; responses are not trusted. The bodies are built up front and the
server is warmed up in another project, so the figure is the server's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django  # noqa: E402

django.setup()

import psutil  # noqa: E402
import redis  # noqa: E402
from django.db import connection  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan  # noqa: E402

from evalsite.models import Project, Role  # noqa: E402
from evalsite.redis_client import glob_escape, site_key  # noqa: E402
from evalsite.services import api_key_create, project_create, user_get_or_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs.models import OnlineRule, Run, Span, Trace  # noqa: E402
from runs.online import online_rule_create  # noqa: E402

NATIVE = "/api/v1/traces"
OTLP = "/api/v1/otlp/v1/traces"
KINDS = ["retriever", "llm", "tool", "llm"]
T0_NS = 1_795_168_800_000_000_000  # 2026-11-20T10:00:00Z


# --- bodies -------------------------------------------------------------------------------------


def native_trace(spans_per_trace: int, session: str) -> list[dict]:
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
            "session_id": session,
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
    for i in range(1, spans_per_trace):
        kind = KINDS[i % len(KINDS)]
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


def native_body(traces: int, spans_per_trace: int) -> bytes:
    session = f"chat-{uuid.uuid4().hex[:12]}"
    items = [s for _ in range(traces) for s in native_trace(spans_per_trace, session)]
    return json.dumps({"spans": items}).encode()


def _attrs(span: OtlpSpan, **values) -> None:
    for key, value in values.items():
        pair = KeyValue(key=key.replace("__", "."))
        if isinstance(value, bool):
            pair.value.bool_value = value
        elif isinstance(value, int):
            pair.value.int_value = value
        elif isinstance(value, float):
            pair.value.double_value = value
        else:
            pair.value.string_value = value
        span.attributes.append(pair)


def otlp_trace(scope_spans, spans_per_trace: int, session: str) -> None:
    trace_id, root_id = uuid.uuid4().bytes, uuid.uuid4().bytes[:8]
    root = scope_spans.spans.add(
        trace_id=trace_id,
        span_id=root_id,
        name="support_agent",
        kind=OtlpSpan.SPAN_KIND_SERVER,
        start_time_unix_nano=T0_NS,
        end_time_unix_nano=T0_NS + 2_500_000_000,
    )
    _attrs(
        root,
        openinference__span__kind="CHAIN",
        session__id=session,
        input__value=json.dumps({"question": "Where is my order #4411?", "user": "u-829"}),
        input__mime_type="application/json",
        output__value="Your order left the warehouse yesterday.",
        deployment__environment="prod",
    )
    for i in range(1, spans_per_trace):
        kind = KINDS[i % len(KINDS)]
        span = scope_spans.spans.add(
            trace_id=trace_id,
            span_id=uuid.uuid4().bytes[:8],
            parent_span_id=root_id,
            name=f"{kind}_{i}",
            kind=OtlpSpan.SPAN_KIND_CLIENT if kind == "llm" else OtlpSpan.SPAN_KIND_INTERNAL,
            start_time_unix_nano=T0_NS + i * 1_000_000,
            end_time_unix_nano=T0_NS + 1_000_000_000 + i * 1_000_000,
        )
        if kind == "llm":
            _attrs(
                span,
                gen_ai__operation__name="chat",
                gen_ai__system="openai",
                gen_ai__request__model="gpt-4o-mini",
                gen_ai__usage__input_tokens=120 + i,
                gen_ai__usage__output_tokens=30,
                gen_ai__usage__cost=0.00004,
                input__value=f"Step {i}: where is order 4411?",
                output__value=f"r{i}",
            )
        elif kind == "tool":
            _attrs(
                span,
                gen_ai__operation__name="execute_tool",
                gen_ai__tool__name="order_lookup",
                input__value=json.dumps({"order": 4411}),
                input__mime_type="application/json",
                output__value=f"r{i}",
            )
        else:
            _attrs(
                span,
                openinference__span__kind="RETRIEVER",
                input__value="order 4411",
                output__value=f"r{i}",
            )


def otlp_body(traces: int, spans_per_trace: int) -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in (("service.name", "support-agent"), ("telemetry.sdk.language", "python")):
        resource_spans.resource.attributes.add(key=key).value.string_value = value
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "openinference.instrumentation.openai"
    session = f"chat-{uuid.uuid4().hex[:12]}"
    for _ in range(traces):
        otlp_trace(scope_spans, spans_per_trace, session)
    return request.SerializeToString()


DOORS = {
    "native": (NATIVE, "application/json", native_body),
    "otlp": (OTLP, "application/x-protobuf", otlp_body),
}


# --- server and clients -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server(
    port: int, workers: int | None, threads: int | None, broker: str, root: Path
) -> subprocess.Popen:
    # gunicorn.conf.py of the copy served, as manage.py up reads it; the flags override it.
    command = [sys.executable, "-m", "gunicorn", "evalsite.wsgi", "--bind", f"127.0.0.1:{port}"]
    if (root / "gunicorn.conf.py").exists():
        command += ["-c", str(root / "gunicorn.conf.py")]
    if workers:
        command += ["--workers", str(workers)]
    if threads:
        command += ["--threads", str(threads)]
    command += ["--timeout", "120"]
    env = {**os.environ, "CELERY_BROKER_URL": broker, "PYTHONPATH": str(root)}
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/healthz")
            if connection.getresponse().status < 500:
                return process
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("the web server did not start")


def _send(port: int, key: str, door: str, bodies: list[bytes], start: threading.Barrier) -> None:
    path, content_type, _ = DOORS[door]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": content_type}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    start.wait()
    for body in bodies:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise SystemExit(f"{door}: HTTP {response.status}: {answer[:500]!r}")
    connection.close()


def _post_all(port: int, key: str, door: str, bodies: list[bytes], threads: int) -> float:
    """Send the bodies from ``threads`` threads (round-robin shares); the wall time taken."""
    start = threading.Barrier(threads + 1)
    workers = [
        threading.Thread(target=_send, args=(port, key, door, bodies[i::threads], start))
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


class CpuMeter:
    """CPU seconds used by the web workers, this database's PostgreSQL backends and this
    process (the clients): on a machine others share, the wall time says how busy they were,
    the CPU time what ingestion costs."""

    def __init__(self, server: subprocess.Popen):
        self.server = psutil.Process(server.pid)

    def sample(self) -> dict[str, dict[int, float]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            backends = [row[0] for row in cursor.fetchall()]
        return {
            "web": self._times(self.server.children()),
            "postgres": self._times(psutil.Process(pid) for pid in backends),
            "client": self._times([psutil.Process()]),
        }

    @staticmethod
    def _times(processes) -> dict[int, float]:
        times = {}
        for process in processes:
            try:
                cpu = process.cpu_times()
            except psutil.Error:
                continue
            times[process.pid] = cpu.user + cpu.system
        return times

    @staticmethod
    def used(before: dict, after: dict) -> dict[str, float]:
        return {
            part: sum(after[part][pid] - before[part].get(pid, 0.0) for pid in after[part])
            for part in after
        }


def _project(owner, label: str, online: bool) -> tuple[Project, str]:
    slug = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    project = project_create(name=f"Ingest bench {label}", slug=slug, owner=owner)
    _, key = api_key_create(project=project, name="bench", created_by=owner, role=Role.EDITOR)
    if online:
        revision = evaluator_create(
            project=project, kind="regex", name="Mentions the order", parameters={"pattern": "4411"}
        ).head
        online_rule_create(
            project=project, name="Support", revision=revision, filter={"name": "support_agent"}
        )
    return project, key


def _delete(project: Project) -> None:
    # The rule's run points at the evaluator revision, which refuses to go first.
    OnlineRule.objects.filter(project=project).delete()
    Run.objects.filter(project=project).delete()
    Project.objects.filter(pk=project.pk).delete()


# --- the measurement ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["native", "otlp", "both"], default="both")
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    parser.add_argument("--spans-per-request", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement")
    parser.add_argument("--spans", type=int, default=10, help="spans per trace")
    parser.add_argument(
        "--workers", type=int, help="gunicorn processes (default: gunicorn.conf.py's, as up)"
    )
    parser.add_argument(
        "--server-threads", type=int, help="threads per gunicorn process (default: as up)"
    )
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/13")
    parser.add_argument(
        "--server-root",
        type=Path,
        default=ROOT,
        help="run the web server from this copy of evalsite (same database): before/after",
    )
    args = parser.parse_args()
    if args.spans_per_request % args.spans:
        parser.error("--spans-per-request must be a multiple of --spans")
    traces = args.spans_per_request // args.spans
    doors = ["native", "otlp"] if args.path == "both" else [args.path]

    owner = user_get_or_create(username="ingest-bench", password=uuid.uuid4().hex)
    port = _free_port()
    server = _server(
        port, args.workers, args.server_threads, args.broker, args.server_root.resolve()
    )
    meter = CpuMeter(server)
    projects = []
    try:
        warm, warm_key = _project(owner, "warm", online=True)
        projects.append(warm)
        for door in doors:
            # Every worker process and thread imports, connects and caches before timing.
            _post_all(port, warm_key, door, [DOORS[door][2](traces, args.spans)] * 16, 8)
        print(
            f"gunicorn {len(psutil.Process(server.pid).children())} processes"
            f"{f' x {args.server_threads} threads' if args.server_threads else ''}; "
            f"{args.threads} client threads; "
            f"{args.requests} requests x {traces} traces x {args.spans} spans each"
        )
        for door in doors:
            bodies = [DOORS[door][2](traces, args.spans) for _ in range(args.requests * 2)]
            size = sum(map(len, bodies)) / len(bodies) / 1024
            for online in (False, True):
                project, key = _project(owner, door, online)
                projects.append(project)
                chunk = bodies[args.requests :] if online else bodies[: args.requests]
                before = meter.sample()
                elapsed = _post_all(port, key, door, chunk, args.threads)
                cpu = CpuMeter.used(before, meter.sample())
                # Through the traces: spans have no index on their project.
                spans = Span.objects.filter(trace__project=project).count()
                stored = Trace.objects.filter(project=project).count()
                expected = args.requests * args.spans_per_request
                check = "" if spans == expected else f"  MISSING {expected - spans} spans!"
                rule = "active online rule" if online else "no online rule    "
                print(
                    f"{door:6} {rule} ({size:.0f} KiB/request): {spans} spans, {stored} traces "
                    f"in {elapsed:.2f} s = {spans / elapsed:,.0f} spans/s persisted "
                    f"({elapsed / args.requests * 1000 * args.threads:.0f} ms/request){check}"
                )
                per_request = {
                    part: seconds / args.requests * 1000 for part, seconds in cpu.items()
                }
                ceiling = spans / sum(cpu.values()) * os.cpu_count()
                print(
                    "       CPU per request: "
                    + ", ".join(f"{part} {ms:.1f} ms" for part, ms in per_request.items())
                    + f"; on {os.cpu_count()} idle cores: at most {ceiling:,.0f} spans/s"
                )
    finally:
        server.terminate()
        server.wait(30)
        for project in projects:
            _delete(project)
        broker = redis.Redis.from_url(args.broker)
        broker.delete("ingest")
        for project in projects:  # the online traces waiting for the dispatch nobody ran
            pending = site_key("online", "pending", project.pk)
            broker.delete(pending, *broker.scan_iter(glob_escape(pending + ":") + "*"))


if __name__ == "__main__":
    main()
