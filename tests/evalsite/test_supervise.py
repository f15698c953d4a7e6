"""The supervisor under ``manage.py up``: a child that dies is started again and the others keep
running; a child that keeps dying stops the site with the reason. Children are real processes,
and the last test kills a real Celery worker under a real ``manage.py up``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from evalsite.supervise import Supervisor
from tests.workers import database_url

ROOT = Path(__file__).resolve().parents[2]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def eventually(check, what: str, seconds: float = 60):
    """Until ``check()`` is truthy (a guard against a hang, not a timing)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def supervised(supervisor: Supervisor) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run(poll=0.02)))
    thread.start()
    return thread, result


def pid(supervisor: Supervisor, name: str) -> int | None:
    child = next(c for c in supervisor.children if c.name == name)
    return child.process.pid if child.process and child.process.poll() is None else None


def test_it_starts_a_killed_child_again_and_leaves_the_others_running():
    started: list[subprocess.Popen] = []

    def sleeper():
        started.append(subprocess.Popen(SLEEPER))
        return started[-1]

    lines: list[str] = []
    supervisor = Supervisor(
        [("the worker", sleeper), ("the web server", sleeper)], log=lines.append, first_delay=0.05
    )
    thread, result = supervised(supervisor)
    try:
        worker = eventually(lambda: pid(supervisor, "the worker"), "the worker started")
        web = eventually(lambda: pid(supervisor, "the web server"), "the web server started")
        os.kill(worker, signal.SIGKILL)  # the kernel's out-of-memory killer, say
        again = eventually(
            lambda: (p := pid(supervisor, "the worker")) not in (None, worker) and p,
            "the worker started again",
        )
        assert pid(supervisor, "the web server") == web  # untouched
        assert again != worker and len(started) == 3
        assert lines == [
            f"the worker exited with code {-signal.SIGKILL}; starting it again in 0.05 s"
        ]
    finally:
        supervisor.stop()
        thread.join()
    assert result == [0]
    assert all(process.poll() is not None for process in started)  # all stopped with the site


def test_it_stops_the_site_when_a_child_keeps_exiting():
    good = []

    def sleeper():
        good.append(subprocess.Popen(SLEEPER))
        return good[-1]

    def port_taken():
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])

    lines: list[str] = []
    supervisor = Supervisor(
        [("the worker", sleeper), ("the web server", port_taken)],
        log=lines.append,
        give_up_after=3,
        first_delay=0.01,
    )
    thread, result = supervised(supervisor)
    thread.join(timeout=60)

    assert result == [1]
    assert supervisor.failed == (
        "the web server exited 3 times within 60 s (last exit code 3); stopping the site"
    )
    assert lines[-1] == supervisor.failed
    assert len(good) == 1 and good[0].poll() is not None  # the healthy child was stopped too


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def celery_workers(up: subprocess.Popen, name: str) -> list[psutil.Process]:
    """The live main processes of ``up``'s Celery workers named ``name`` (``runs`` or ``llm``)."""
    found = []
    for child in psutil.Process(up.pid).children():
        try:
            command = child.cmdline()
        except psutil.Error:  # gone, or dead and not reaped yet
            continue
        if "celery" in " ".join(command) and f"{name}@%h" in command:
            found.append(child)
    return found


@pytest.mark.slow
def test_manage_py_up_starts_a_killed_worker_again_and_keeps_serving(db, broker, tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),  # the tests' database, migrated already
        "CELERY_BROKER_URL": broker.url,  # a broker of this test's own
        "EVALSITE_DATA_DIR": str(tmp_path / "data"),
        "WEB_CONCURRENCY": "1",
        "WORKER_CONCURRENCY": "1",
        "LLM_WORKER_CONCURRENCY": "2",
    }
    log = open(tmp_path / "up.log", "w")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--no-demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    healthz = f"http://127.0.0.1:{port}/healthz"

    def serving():
        try:
            return urllib.request.urlopen(healthz, timeout=5).status == 200
        except OSError:
            return False

    try:
        eventually(serving, "the site answered", seconds=120)
        [first] = eventually(lambda: celery_workers(up, "llm"), "the llm worker started")
        first.kill()
        [second] = eventually(
            lambda: [w for w in celery_workers(up, "llm") if w.pid != first.pid],
            "the llm worker started again",
        )
        assert up.poll() is None and serving()
        assert second.is_running()
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=60)
        log.close()
    output = (tmp_path / "up.log").read_text()
    assert "up: the llm worker exited with code -9; starting it again in 1 s" in output
    assert code == 0, output[-2000:]
