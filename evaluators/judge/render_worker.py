"""A render worker: ``python -m evaluators.judge.render_worker``, started by ``render_pool``.

It reads requests on stdin and answers on stdout, one at a time, until stdin ends: that is,
until the process that started it closes the pipe or exits. It imports ``rendering`` and the
standard library only (nothing of evalsite's, no Django), so it starts quickly.
Before each request it sets its own limits, so nothing the template does can lift them:

- address space (``RLIMIT_AS``): its size when it was idle and ready, plus the request's MB. An
  allocation past it raises ``MemoryError``, answered as ``{"limit": "memory"}``, and the worker
  exits (the pool starts a fresh one);
- priority: ``nice`` 10, so a template that burns CPU yields to the processes serving others;
- CPU (``RLIMIT_CPU``): what it has used so far, plus the request's deadline, plus one second.
  The caller kills the worker at the deadline; this is the backstop should the caller die first
  (``SIGXCPU`` ends the worker).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import resource
import signal
import struct

from evaluators.judge.rendering import render_here, syntax_here

# A request is this header (payload length, deadline in seconds, memory in MB), then a pickle.
# An answer is a length, then JSON: {"ok": ...}, {"error": "..."} or {"limit": "memory"}.
REQUEST_HEADER = struct.Struct("!QdI")
ANSWER_HEADER = struct.Struct("!Q")
READY = b"ready"  # the first answer, once the worker has started
OPERATIONS = {"render": render_here, "syntax": syntax_here}
_MB = 1024 * 1024
NICE = 10


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the caller, whose exit stops us
    answers = os.dup(1)
    os.dup2(2, 1)  # a stray print goes to stderr, never into the answers
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A template that burns CPU until its deadline yields the cores to the web and workers.
    os.nice(NICE)
    idle_bytes = _address_space()
    _write(answers, READY)
    while True:
        header = _read(0, REQUEST_HEADER.size)
        if header is None:
            return
        size, seconds, memory_mb = REQUEST_HEADER.unpack(header)
        _limit(resource.RLIMIT_AS, idle_bytes + memory_mb * _MB)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _limit(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime + seconds) + 1)
        answer = _answer(size)
        if answer is None:
            _write(answers, b'{"limit": "memory"}')
            return
        _write(answers, answer)


def _answer(size: int) -> bytes | None:
    """The JSON answer to the next request; ``None`` when it ran out of memory."""
    try:
        payload = _read(0, size)
        if payload is None:
            raise SystemExit(0)
        operation, *arguments = pickle.loads(payload)  # noqa: S301  # from the process that started us
        return json.dumps({"ok": OPERATIONS[operation](*arguments)}).encode()
    except MemoryError:
        return None
    except Exception as exc:
        return json.dumps({"error": f"{type(exc).__name__}: {exc}"[:2000]}).encode()


def _limit(which: int, soft: int) -> None:
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _read(fd: int, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = os.readv(fd, [view[got:]])
        if count == 0:
            return None
        got += count
    return buffer


def _write(fd: int, data: bytes) -> None:
    view = memoryview(ANSWER_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    main()
