"""The process boundary of prompt templates: a few long-lived render workers per host process.

Why processes: a ``curly`` or ``jinja2`` template is user code with a small language. Jinja's
sandbox stops access to Python internals, and the guards in ``rendering`` cap ``range()``,
repetition and the printed size, but a template can still loop over a long string for minutes
or build a huge value it never prints (``"x"|center(300000000)``, ``"%0300000000d"|format(1)``):
the work happens in C inside one call, so no guard in the environment sees it coming, and
wrapping every string-producing filter and method would be whack-a-mole. A separate process can
be bounded whatever the template does: the kernel caps its address space (``RLIMIT_AS``) and CPU
(``RLIMIT_CPU``), and the caller kills it when it overruns the wall-clock deadline. The code
sandbox (bubblewrap) would also do, but starts in tens of milliseconds, and a judge renders one
prompt per scenario; a warm worker answers in well under a millisecond.

How: ``call(request)`` takes an idle worker of this process's pool (starting one while fewer
than ``EVALSITE_TEMPLATE_RENDER_WORKERS`` exist, else waiting for one at most the deadline),
writes the request on its stdin and waits for the answer on its stdout until
``EVALSITE_TEMPLATE_RENDER_SECONDS``. A worker is ``python -m evaluators.judge.render_worker``
started with ``subprocess`` (fork and exec at once, which is safe in the threaded gunicorn and
Celery processes, unlike a bare ``fork``; multiprocessing's forkserver would be one more
process-wide singleton, with its resource tracker, to carry across Celery's and gunicorn's forks),
with an empty environment but ``PYTHONPATH``. It imports no Django, so it starts fast. Before
each request it sets its own limits: address space at its size when idle plus
``EVALSITE_TEMPLATE_RENDER_MEMORY_MB``, and CPU at what it has used plus the deadline plus one
second (the backstop should the caller die mid-render).

- Overrun: the worker is killed and replaced on the next call; the caller gets
  ``EvaluationError`` ``template_error`` "the template did not finish within 2 s".
- ``MemoryError`` in the worker: the same error, "the template needed more than 256 MB"; that
  worker exits and is replaced.
- The caller's process exits: the worker reads end-of-file on its stdin and exits. A process
  forked from one with workers (a Celery prefork child, a gunicorn worker) forgets the inherited
  pipes at once (``os.register_at_fork``) and starts its own pool on first use; the pool also
  checks its pid.

Requests go as pickle (the caller is trusted); answers come back as JSON, so a worker that was
somehow taken over still cannot run code in the caller.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from evaluators.judge.conf import setting
from evaluators.judge.render_worker import ANSWER_HEADER, READY, REQUEST_HEADER
from evaluators.normalize import EvaluationError

_START_SECONDS = 20.0  # a cold interpreter importing jinja2 on a loaded host
_ROOT = str(Path(__file__).resolve().parents[2])


class _Overrun(Exception):
    pass


class _Stopped(Exception):
    pass


def call(request: Any) -> Any:
    """What the render worker answers to ``request`` (see ``render_worker.OPERATIONS``).

    Raises ``EvaluationError`` (``template_error``) when the worker overran a limit, when none
    was free within the deadline, or when the operation itself raised.
    """
    seconds = float(setting("EVALSITE_TEMPLATE_RENDER_SECONDS"))
    memory_mb = int(setting("EVALSITE_TEMPLATE_RENDER_MEMORY_MB"))
    payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    pool = _pool()
    worker = pool.checkout(int(setting("EVALSITE_TEMPLATE_RENDER_WORKERS")), seconds)
    healthy = False
    try:
        answer = worker.ask(payload, seconds, memory_mb)
        healthy = "limit" not in answer
    finally:
        pool.checkin(worker, healthy)
    if "ok" in answer:
        return answer["ok"]
    if "limit" in answer:
        raise EvaluationError(
            f"the template needed more than {memory_mb} MB", code="template_error"
        )
    raise EvaluationError(f"the template renderer failed: {answer['error']}", code="template_error")


def worker_pids() -> list[int]:
    """The pids of this process's render workers (for tests and diagnostics)."""
    pool = _current
    if pool is None or pool.pid != os.getpid():
        return []
    with pool.changed:
        return [worker.proc.pid for worker in pool.workers]


class _Worker:
    def __init__(self) -> None:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "evaluators.judge.render_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                close_fds=True,
                cwd=_ROOT,
                env={
                    "PYTHONPATH": os.pathsep.join([_ROOT, *sys.path]),
                    "PYTHONDONTWRITEBYTECODE": "1",
                },
            )
        except OSError as exc:  # out of processes, of memory, of file descriptors
            raise EvaluationError(
                f"the template renderer could not start ({exc})", code="template_error"
            )
        self.to_worker = self.proc.stdin.fileno()
        self.from_worker = self.proc.stdout.fileno()
        self.readable = select.poll()
        self.readable.register(self.from_worker, select.POLLIN)
        try:
            ready = self._receive(time.monotonic() + _START_SECONDS, len(READY))
        except (_Overrun, _Stopped):
            ready = b""
        if ready != READY:
            self.stop()
            raise EvaluationError(
                "the template renderer could not start; see the server log",
                code="template_error",
            )

    def ask(self, payload: bytes, seconds: float, memory_mb: int) -> dict:
        """The decoded answer; kills the worker and raises on an overrun or a crash."""
        deadline = time.monotonic() + seconds
        try:
            self._write(REQUEST_HEADER.pack(len(payload), seconds, memory_mb) + payload)
            # An answer longer than the worker's memory limit cannot be genuine.
            answer = json.loads(self._receive(deadline, memory_mb * 1024 * 1024))
            if not isinstance(answer, dict):
                raise _Stopped
            return answer
        except _Overrun:
            self.stop()
            raise EvaluationError(
                f"the template did not finish within {seconds:g} s", code="template_error"
            )
        except (_Stopped, OSError, ValueError):
            status = self.stop()
            if status == -signal.SIGXCPU:
                message = f"the template did not finish within {seconds:g} s"
            else:
                message = f"the template renderer stopped (exit status {status})"
            raise EvaluationError(message, code="template_error")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()
        return self.proc.wait()

    def forget(self) -> None:
        """In a forked child: drop the inherited pipes, leave the worker to its owner."""
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc.returncode = 0  # not ours to wait for

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.to_worker, view) :]

    def _receive(self, deadline: float, limit: int) -> bytes:
        """One answer: its length, then that many bytes (at most ``limit``)."""
        data, size = bytearray(), None
        while size is None or len(data) < ANSWER_HEADER.size + size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.readable.poll(remaining * 1000):
                raise _Overrun
            wanted = 1 << 20 if size is None else ANSWER_HEADER.size + size - len(data)
            chunk = os.read(self.from_worker, min(wanted, 1 << 20))
            if not chunk:
                raise _Stopped
            data += chunk
            if size is None and len(data) >= ANSWER_HEADER.size:
                (size,) = ANSWER_HEADER.unpack_from(data)
                if size > limit:
                    raise _Stopped
        return bytes(data[ANSWER_HEADER.size :])


class _Pool:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.changed = threading.Condition()
        self.idle: list[_Worker] = []
        self.workers: set[_Worker] = set()
        self.starting = 0

    def checkout(self, size: int, seconds: float) -> _Worker:
        deadline = time.monotonic() + seconds
        with self.changed:
            while True:
                while self.idle:
                    worker = self.idle.pop()
                    if worker.proc.poll() is None:
                        return worker
                    self.workers.discard(worker)  # died while idle (the OOM killer, an operator)
                    worker.stop()
                if len(self.workers) + self.starting < max(1, size):
                    self.starting += 1
                    break
                if self.starting:  # a worker is on its way: its start does not count
                    deadline = max(deadline, time.monotonic() + seconds)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EvaluationError(
                        f"no template renderer was free within {seconds:g} s; try again",
                        code="template_error",
                    )
                self.changed.wait(remaining)
        worker = None
        try:
            worker = _Worker()
        finally:
            with self.changed:
                self.starting -= 1
                if worker is not None:
                    self.workers.add(worker)
                self.changed.notify()
        return worker

    def checkin(self, worker: _Worker, healthy: bool) -> None:
        if not healthy:
            worker.stop()
        with self.changed:
            if healthy:
                self.idle.append(worker)
            else:
                self.workers.discard(worker)
            self.changed.notify()

    def forget(self) -> None:
        for worker in list(self.workers):
            worker.forget()


_current: _Pool | None = None
_creating = threading.Lock()


def _pool() -> _Pool:
    global _current
    pool = _current
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _creating:
        if _current is None or _current.pid != os.getpid():
            if _current is not None:
                _current.forget()
            _current = _Pool()
        return _current


def _forget_after_fork() -> None:
    global _current, _creating
    _creating = threading.Lock()  # another thread may have held it at the fork
    if _current is not None:
        _current.forget()
        _current = None


os.register_at_fork(after_in_child=_forget_after_fork)
