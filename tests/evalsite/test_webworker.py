"""The web server's worker (evalsite/webworker.py) in a real gunicorn: new connections go to
idle processes first, and a process whose requests wait still takes more, up to its threads."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server():
    started = []

    def start(workers: int, threads: int) -> int:
        port = _free_port()
        command = [sys.executable, "-m", "gunicorn", "tests.evalsite.probe_app:app"]
        command += ["--bind", f"127.0.0.1:{port}", "--workers", str(workers)]
        command += ["--threads", str(threads)]
        command += ["--worker-class", "evalsite.webworker.BalancedThreadWorker"]
        # Requests count as fresh for half a second, not the default 20 ms: a busy CI machine
        # may start the clients' connections that far apart.
        env = {**os.environ, "WEB_ACCEPT_FRESH_SECONDS": "0.5"}
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started.append(process)
        for _ in range(200):
            try:
                _get(port, "/burn?ms=1")
                break
            except OSError:
                time.sleep(0.05)
        # Every process booted: each answers a burn that keeps it busy while the others take
        # the next connections.
        _at_once(port, ["/burn?ms=200"] * workers)
        return port

    yield start
    for process in started:
        process.terminate()
        process.wait(30)


def _get(port: int, path: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def _at_once(port: int, paths: list[str]) -> list[str]:
    """Each path from a thread of its own, all connecting at the same moment."""
    answers: list[str] = [""] * len(paths)
    start = threading.Barrier(len(paths))

    def send(index: int) -> None:
        start.wait()
        answers[index] = _get(port, paths[index])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(paths))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_it_gives_connections_arriving_at_once_to_idle_processes_first(server):
    port = server(workers=3, threads=4)
    for _ in range(5):
        answers = _at_once(port, ["/burn?ms=300"] * 3)
        pids = {answer.split()[0] for answer in answers}
        assert len(pids) == 3, answers  # one busy process, never two requests on one core


def test_a_process_whose_requests_wait_still_takes_more(server, tmp_path):
    # One process: four requests that each wait for all four can only end "ok" if the
    # process took the later connections while the first ones were waiting (after half a
    # second each, here).
    port = server(workers=1, threads=4)
    answers = _at_once(port, [f"/hold?n=4&dir={tmp_path}"] * 4)
    assert [answer.split()[1] for answer in answers] == ["ok"] * 4


def test_a_process_kept_busy_by_kept_alive_clients_still_takes_a_new_connection(server):
    # Three kept-alive clients whose requests overlap: one of them is always fresh, and without
    # a bound on its refusal the process would take no other connection while they go on.
    port = server(workers=1, threads=4)
    stop, answers = threading.Event(), []

    def keep_busy() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        deadline = time.monotonic() + 10
        while not stop.is_set() and time.monotonic() < deadline:
            connection.request("GET", "/burn?ms=50")
            answers.append(connection.getresponse().read())
        connection.close()

    clients = [threading.Thread(target=keep_busy) for _ in range(3)]
    for client in clients:
        client.start()
    while len(answers) < 6:
        time.sleep(0.01)
    answer = _get(port, "/burn?ms=1")
    answered_while_busy = all(client.is_alive() for client in clients)
    stop.set()
    for client in clients:
        client.join()
    assert answer.endswith("burnt") and answered_while_busy
