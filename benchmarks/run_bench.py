"""Run-engine benchmark: 10,000 rows with outputs present x 3 evaluators (a built-in exact
match, a Python code evaluator, a JavaScript code evaluator) on one Celery worker with 2
processes, measured from queueing the run to its metrics being stored.

    uv run python benchmarks/run_bench.py [--rows 10000] [--concurrency 2] [--chunk 250]

It uses DATABASE_URL / CELERY_BROKER_URL when set (else the embedded servers), creates a
throw-away project, starts its own worker, and prints wall time, evaluations per second and the
peak memory (VmHWM) of every worker process. Target on a 2-core machine: 30,000 evaluations
stored and metrics computed within 30 s, each worker process under 500 MB.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from evalsite.celery import QUEUES  # noqa: E402
from evalsite.services import project_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.engine import run_create, run_start  # noqa: E402
from runs.models import Result, Run  # noqa: E402
from runs.testsets import testset_create  # noqa: E402

PYTHON = "def evaluate(inputs, outputs, trace):\n    return outputs == inputs['correct_answer']\n"
JAVASCRIPT = (
    "function evaluate(inputs, outputs, trace) {\n  return outputs === inputs.correct_answer;\n}\n"
    "module.exports = { evaluate };\n"
)


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout
    children = [int(p) for p in out.split()]
    return children + [d for c in children for d in descendants(c)]


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:60]
    except OSError:
        return "?"


def _wait_until_ready(worker: subprocess.Popen, timeout: float = 60) -> None:
    """Until the worker answers a ping (booting Django and Celery is not what is measured)."""
    from evalsite.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit("the worker exited")
        if app.control.ping(timeout=0.5):
            return
    raise SystemExit("the worker did not answer within 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=250)
    args = parser.parse_args()

    stamp = time.strftime("%Y%m%d%H%M%S")
    project = project_create(name=f"bench {stamp}", slug=f"bench-{stamp}", owner=None)
    rows = [
        {
            "question": f"q{i}",
            "correct_answer": str(i % 10),
            "outputs": str(i % 10 if i % 4 else (i + 1) % 10),
        }
        for i in range(args.rows)
    ]
    started = time.perf_counter()
    testset = testset_create(project=project, name="bench rows", rows=rows)
    print(f"testset of {args.rows} rows stored in {time.perf_counter() - started:.2f} s")
    app = application_create(
        project=project, name="column", kind="column", config={"outputs_column": "outputs"}
    )
    revisions = [
        evaluator_create(project=project, kind="exact_match", name="exact").head,
        evaluator_create(
            project=project,
            kind="code",
            name="python",
            parameters={"runtime": "python", "code": PYTHON},
        ).head,
        evaluator_create(
            project=project,
            kind="code",
            name="javascript",
            parameters={"runtime": "javascript", "code": JAVASCRIPT},
        ).head,
    ]
    run = run_create(
        project=project, testset_version=testset.head, application=app, revisions=revisions
    )

    env = {**os.environ, "EVALSITE_RUN_CHUNK_SIZE": str(args.chunk)}
    if "DATABASE_URL" not in os.environ:
        print("note: the worker uses the embedded PostgreSQL too", file=sys.stderr)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "evalsite",
            "worker",
            "-Q",
            ",".join(QUEUES),
            "--concurrency",
            str(args.concurrency),
            "-l",
            "warning",
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    _wait_until_ready(worker)  # cold start is not what this measures
    peaks: dict[int, tuple[str, float]] = {}
    try:
        started = time.perf_counter()
        run_start(run=run)
        while True:
            run.refresh_from_db()
            for pid in [worker.pid, *descendants(worker.pid)]:
                peaks[pid] = (command_of(pid), max(peak_rss_mb(pid), peaks.get(pid, ("", 0))[1]))
            if run.status not in ("queued", "running") and run.metrics_refreshed_at:
                break
            if time.perf_counter() - started > 600:
                raise SystemExit("gave up after 600 s")
            time.sleep(0.1)
        wall = time.perf_counter() - started
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)

    evaluations = Result.objects.filter(
        run=run, step_key__startswith="evaluator-", status="success"
    ).count()
    cells = Result.objects.filter(run=run).count()
    print(f"run {run.pk}: status {run.status}, {cells} cells ({evaluations} evaluations) stored")
    print(
        f"wall time to all cells + metrics: {wall:.2f} s  ->  {evaluations / wall:,.0f} evaluations/s"
    )
    data = Run.objects.get(pk=run.pk).metrics.get(scenario=None).data
    for step, stats in data.items():
        if step.startswith("evaluator-"):
            print(
                f"  {step}: success rate {stats['success']['rate']:.3f}, errors {stats['success']['errors']}"
            )
    print("peak memory (VmHWM) per worker process:")
    for pid, (command, mb) in sorted(peaks.items()):
        print(f"  {pid:>7}  {mb:7.1f} MB  {command}")
    print(f"database: {settings.DATABASES['default']['HOST'] or 'localhost'}")


if __name__ == "__main__":
    main()
