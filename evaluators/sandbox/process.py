"""The host side of one worker process: send a batch, read result frames, watch the clock.

One thread drives a worker at a time (the pool guarantees it). Everything the worker writes is
untrusted: a frame is accepted only if it carries this batch's nonce and the index of the call
the host is waiting for; anything else is a protocol violation and the worker is discarded.
The wire protocol is described in ``harness/worker.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from evalsite import jsonsafe
from evaluators.normalize import Unrepresentable

from . import jail
from .config import Config
from .errors import SandboxError
from .results import CallResult, error_result

CHUNK_CALLS = 256  # calls per request line at most: one JSON decode in the worker per line
# A worker decodes a whole request line at once and keeps it until its last call ends, and the
# decoded objects take several times the text's bytes: a line carries at most this share of the
# worker's memory limit (one call larger than that travels on a line of its own).
LINE_MEMORY_SHARE = 16
_DIAG_TAIL = 8192
_READ_SIZE = 1 << 20
_JOIN_BYTES = 1 << 16  # a first request line up to this size is written with the header
_OOM_MARKERS = (
    b"heap out of memory",
    b"Reached heap limit",
    b"Fatal process out of memory",
    b"MemoryError",
    b"Cannot allocate memory",
    b"std::bad_alloc",
)
_SIGNALS = {s.value for s in signal.Signals}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_CORES = os.cpu_count() or 1  # the most CPU seconds any process can use per second
_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
_json_decode = json.JSONDecoder().decode


def _loads(frame: bytes) -> Any:
    """``json.loads`` for what a worker writes (UTF-8, the only encoding either harness writes)
    without its guessing of the encoding: half the time of a small frame's decode."""
    return _json_decode(frame.decode("utf-8", "surrogatepass"))


def line_bytes(config: Config, runtime: str) -> int:
    """The most bytes of JSON one request line carries to a ``runtime`` worker."""
    limit_mb = config.memory_mb if runtime == "python" else config.node_memory_mb
    return max(limit_mb * (1 << 20) // LINE_MEMORY_SHARE, 1 << 16)


def encode_chunks(calls: list[list[Any]], max_bytes: int) -> list[bytes]:
    """Request lines for a batch: JSON arrays of up to CHUNK_CALLS argument lists and, unless
    one call alone is larger, up to ``max_bytes`` each (``line_bytes``).

    Raises ``ValueError``/``TypeError`` when an argument is not JSON.
    """
    lines = []
    for start in range(0, len(calls), CHUNK_CALLS):
        chunk = calls[start : start + CHUNK_CALLS]
        line = _encode(chunk).encode() + b"\n"
        lines.extend([line] if len(line) <= max_bytes else _split(chunk, max_bytes))
    return lines


def _split(calls: list[list[Any]], max_bytes: int) -> list[bytes]:
    """Calls packed in order into lines of at most ``max_bytes`` (a larger call alone)."""
    lines: list[bytes] = []
    parts: list[bytes] = []
    size = 2  # the brackets and the newline, less one comma
    for args in calls:
        encoded = _encode(args).encode()
        if parts and size + len(encoded) + 1 > max_bytes:
            lines.append(b"[" + b",".join(parts) + b"]\n")
            parts, size = [], 2
        parts.append(encoded)
        size += len(encoded) + 1
    lines.append(b"[" + b",".join(parts) + b"]\n")
    return lines


@dataclass
class Fault:
    """Why a worker stopped being usable in the middle of a batch."""

    code: str
    message: str
    detail: str = ""


@dataclass
class Outcome:
    """What one batch attempt on one worker produced.

    ``results`` holds the calls that finished, in order from the first. If ``fault`` is set, the
    call right after them was in flight and caused it (or, with ``during_load``, loading did).
    ``retire`` means the worker asked to be replaced after its last result; nobody is to blame.
    """

    results: list[CallResult] = field(default_factory=list)
    fault: Fault | None = None
    during_load: bool = False
    load_error: dict[str, Any] | None = None
    load_logs: str = ""
    retire: bool = False
    received: int = 0  # bytes of result frames accepted

    @property
    def healthy(self) -> bool:
        return self.fault is None and not self.retire


class ProtocolViolation(Exception):
    pass


class OverBudget(Exception):
    pass


class WorkerProcess:
    """A started worker. ``run`` sends one batch; the worker keeps its compiled evaluators."""

    def __init__(self, config: Config, runtime: str, *, sandboxed: bool) -> None:
        self.config = config
        self.runtime = runtime
        self.sandboxed = sandboxed
        self.calls_served = 0
        self.last_used = time.monotonic()
        self.buffer = bytearray()
        self.diag = bytearray()
        # Reads land here: os.read(fd, 1 MiB) would map and unmap a fresh 1 MiB on every call
        # (~15 µs); pages of this one are only backed once a large read touches them.
        self.scratch = memoryview(bytearray(_READ_SIZE))
        self.header_rest: tuple[tuple[str, ...], bytes] = ((), b"")
        started = time.perf_counter()
        try:
            self._start()
        except (SandboxError, OSError):
            # Interpreter, library and harness paths are resolved once per process. When they
            # started a worker before, they may have moved since (an upgrade, a cleaned /tmp):
            # resolve them afresh and try once more. Paths that never worked fail with their error.
            if not jail.forget_resolutions(runtime):
                raise
            self._start()
        jail.mark_working(runtime)
        self.start_ms = (time.perf_counter() - started) * 1000

    def _start(self) -> None:
        self.exit_status: int | None = None
        self.cpu_seconds = 0.0
        # CPU time read from /proc, and when: see ``cpu_past_half``.
        self.cpu_seen, self.cpu_seen_at = 0.0, time.monotonic()
        self.buffer.clear()
        self.diag.clear()
        self.spawned = jail.spawn(self.config, self.runtime, sandboxed=self.sandboxed)
        os.set_blocking(self.spawned.requests, False)
        self.version = self._await_hello()

    @property
    def remaining(self) -> int:
        """Calls this worker may still serve before it is recycled."""
        return max(self.config.recycle_after - self.calls_served, 0)

    def worn_out(self) -> bool:
        """Due for recycling: served its calls, or used half its lifetime CPU allowance (the
        other half is headroom, so RLIMIT_CPU never kills it in the middle of a call)."""
        return self.remaining == 0 or self.cpu_past_half()

    def cpu_past_half(self) -> bool:
        """Whether the worker used more than half of ``cpu_seconds``, reading /proc only when
        it could have: CPU time grows at most as fast as the wall clock on every core at once,
        so while the last reading plus that much since stays under half, nothing is read (a
        fresh worker with the default 120 s, on 2 cores: not for 30 s)."""
        half = self.config.cpu_seconds / 2
        now = time.monotonic()
        if self.cpu_seen + (now - self.cpu_seen_at) * _CORES <= half:
            return False
        self.cpu_seen, self.cpu_seen_at = self.cpu_used(), now
        return self.cpu_seen > half

    def alive(self) -> bool:
        # A pidfd turns readable when its process exits.
        return not select.select([self.spawned.pidfd], [], [], 0)[0]

    def cpu_used(self) -> float:
        try:
            with open(f"/proc/{self.spawned.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    # -- one batch ------------------------------------------------------------------------------
    def run(
        self,
        *,
        code: str,
        revision_key: str,
        version: str,
        count: int,
        chunks: list[bytes],
        timeout_s: float,
        output_budget: int,
        entry: str = "evaluate",
    ) -> Outcome:
        """Send one batch of ``count`` calls (already encoded by ``encode_chunks``) to the
        ``entry`` point: ``evaluate``, or ``session`` (the code's evaluate_session).

        ``output_budget``: bytes of results and logs the host accepts before it stops the
        worker with ``output_limit`` (a bound on the host's memory, whatever the batch size).
        """
        nonce = secrets.token_hex(12).encode()
        self.diag.clear()  # a crash report should only show this batch's output
        reader = _BatchReader(nonce, count, self.config.log_limit_bytes, output_budget)
        head = b'{"op":"batch","nonce":"%s","n":%d,%s\n' % (
            nonce,
            count,
            self._header_rest(revision_key, code, version, entry),
        )
        if chunks and len(chunks[0]) <= _JOIN_BYTES:
            # One write wakes the worker once: a small batch goes with its header.
            lines = [head + chunks[0], *chunks[1:]]
        else:
            lines = [head, *chunks]
        outcome = self._exchange(iter(lines), reader, timeout_s)
        self.calls_served += len(outcome.results) + (1 if outcome.fault else 0)
        self.last_used = time.monotonic()
        return outcome

    def _header_rest(self, revision_key: str, code: str, version: str, entry: str) -> bytes:
        """The batch header after its nonce and count, encoded once for a run of batches of the
        same revision (the code can be long; the worker keeps it compiled anyway)."""
        key = (revision_key, code, version, entry)
        if self.header_rest[0] != key:
            rest = {
                "rev": revision_key, "code": code, "version": version,
                "runtime": self.runtime, "entry": entry,
            }  # fmt: skip
            self.header_rest = (key, _encode(rest)[1:].encode())
        return self.header_rest[1]

    def check(self, code: str, timeout_s: float, version: str = "2") -> list[dict[str, Any]]:
        """Load ``code`` once (as ``check_code`` does) and return its problems."""
        nonce = secrets.token_hex(12)
        message = {
            "op": "check", "nonce": nonce, "code": code, "runtime": self.runtime,
            "version": version,
        }  # fmt: skip
        reader = _CheckReader(nonce.encode())
        outcome = self._exchange(iter([json.dumps(message).encode() + b"\n"]), reader, timeout_s)
        if outcome.fault:
            fault = outcome.fault
            return [{"code": fault.code, "type": "SandboxError", "message": fault.message}]
        return reader.problems

    def _exchange(self, payload: Iterator[bytes], reader: _Reader, timeout_s: float) -> Outcome:
        """Write ``payload`` while reading frames, until ``reader`` is satisfied or a fault.

        The deadline restarts whenever a frame arrives: ``timeout_s`` bounds each call.
        """
        writer = _Writer(self.spawned.requests, payload)
        poller = select.poll()
        poller.register(self.spawned.results, select.POLLIN)
        poller.register(self.spawned.diag, select.POLLIN)
        if writer.write():  # most batches fit in the pipe at once: no poll to wait for room
            poller.register(self.spawned.requests, select.POLLOUT)
        deadline = time.monotonic() + timeout_s
        try:
            # After a load error the harness still reads the whole batch: finish writing it.
            while not reader.done or (writer.busy and reader.outcome.load_error):
                events = poller.poll(max(0.0, (deadline - time.monotonic()) * 1000))
                if not events and time.monotonic() >= deadline:
                    return self._fault(reader, _timeout_fault(reader, timeout_s))
                for fd, _ in events:
                    if fd == self.spawned.requests:
                        if not writer.write():
                            poller.unregister(fd)
                    elif fd == self.spawned.diag:
                        if not self._drain_diag():
                            poller.unregister(fd)
                    elif not self._read_results(reader):
                        return self._fault(reader, self._death_fault())
                if reader.progressed:
                    reader.progressed = False
                    deadline = time.monotonic() + timeout_s
        except OverBudget as exc:
            return self._fault(reader, Fault("output_limit", str(exc)))
        except ProtocolViolation as exc:
            return self._fault(reader, _violation(str(exc)))
        return reader.outcome

    def _read_results(self, reader: _Reader) -> bool:
        """Read what is there and hand every whole line to ``reader``; False at end of file."""
        size = os.readv(self.spawned.results, [self.scratch])
        if not size:
            return False
        buffer = self.buffer
        buffer += self.scratch[:size]
        end = buffer.rfind(b"\n")
        if end >= 0:
            lines = bytes(buffer[:end]).split(b"\n")
            del buffer[: end + 1]
            reader.feed(lines)
        if len(buffer) > self._frame_limit() or (reader.done and buffer):
            raise ProtocolViolation("more bytes than any legitimate frame")
        return True

    def _frame_limit(self) -> int:
        return self.config.result_limit_bytes + 6 * self.config.log_limit_bytes + 65536

    def _drain_diag(self) -> bool:
        """Keep the tail of the worker's raw stdout/stderr (for crash reports); False at EOF."""
        try:
            size = os.readv(self.spawned.diag, [self.scratch])
        except OSError:
            return False
        if size:
            self.diag += self.scratch[:size]
            del self.diag[:-_DIAG_TAIL]
        return bool(size)

    def _await_hello(self) -> str:
        reader = _HelloReader()
        deadline = time.monotonic() + self.config.start_timeout_s
        while not reader.done:
            wait = max(deadline - time.monotonic(), 0)
            ready = select.select([self.spawned.results, self.spawned.diag], [], [], wait)[0]
            if self.spawned.diag in ready:
                self._drain_diag()
            try:
                alive = self.spawned.results not in ready or self._read_results(reader)
            except ProtocolViolation:
                alive = False
            if not ready or not alive:
                self._drain_diag_now()
                self.close()
                tail = bytes(self.diag).decode("utf-8", "replace").strip()
                raise SandboxError(
                    f"the {self.runtime} worker failed to start: {tail or 'no output'}"
                )
        return reader.runtime

    # -- stopping -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the worker (SIGKILL: it has nothing to flush) and reap it."""
        if self.exit_status is None:
            self._kill()
            self._reap()
        for fd in (self.spawned.requests, self.spawned.results, self.spawned.diag):
            _close_quietly(fd)
        _close_quietly(self.spawned.pidfd)

    def forget(self) -> None:
        """Drop this worker without touching it (in a forked child that inherited it)."""
        self.exit_status = -1
        self.close()

    def _kill(self) -> None:
        # The harness first (pidfd: no pid-reuse race), then bwrap around it.
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.spawned.pidfd, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.spawned.proc.kill()

    def _reap(self, grace_s: float = 0.0) -> None:
        """Collect the exit status, killing the worker if it has not exited within ``grace_s``."""
        pid = self.spawned.proc.pid
        deadline = time.monotonic() + grace_s
        try:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            while done == 0 and time.monotonic() < deadline:
                time.sleep(0.002)
                done, status, usage = os.wait4(pid, os.WNOHANG)
            if done == 0:
                self._kill()
                _, status, usage = os.wait4(pid, 0)
        except ChildProcessError:
            self.exit_status = -1
            return
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        self.exit_status = os.waitstatus_to_exitcode(status)
        self.spawned.proc.returncode = self.exit_status

    def _fault(self, reader: _Reader, fault: Fault) -> Outcome:
        if self.exit_status is None:
            self._kill()
            self._reap()
        outcome = reader.outcome
        outcome.fault = fault
        outcome.during_load = reader.loading
        return outcome

    def _death_fault(self) -> Fault:
        """The result pipe closed: the worker died. Work out from what."""
        self._reap(grace_s=1.0)
        self._drain_diag_now()
        tail = bytes(self.diag)
        code, message = self._cause_of_death(tail)
        return Fault(code, message, tail.decode("utf-8", "replace"))

    def _cause_of_death(self, tail: bytes) -> tuple[str, str]:
        config = self.config
        status = self.exit_status or 0
        # bwrap reports a signal death as 128 + signal; a bare worker as -signal.
        signum = -status if status < 0 else (status - 128 if status > 128 else 0)
        if any(marker in tail for marker in _OOM_MARKERS):
            python = jail.family(self.runtime) == "python"
            limit = config.memory_mb if python else config.node_memory_mb
            return "memory_limit", (
                f"the evaluator ran out of memory (limit {limit} MB); the worker was stopped."
            )
        if signum == signal.SIGXCPU or self.cpu_seconds >= config.cpu_seconds - 0.5:
            return "cpu_limit", (
                f"the worker used up its {config.cpu_seconds} s of CPU time and was stopped."
            )
        if signum == signal.SIGXFSZ:
            return "file_size_limit", f"a file grew past {config.file_size_mb} MB."
        how = f"signal {signal.Signals(signum).name}" if signum in _SIGNALS else f"status {status}"
        return "worker_crashed", (
            f"the worker process died ({how}) while running this call; it was replaced."
        )

    def _drain_diag_now(self) -> None:
        while select.select([self.spawned.diag], [], [], 0)[0] and self._drain_diag():
            pass


class _Writer:
    """Feeds request lines into the worker's non-blocking stdin as room appears."""

    def __init__(self, fd: int, chunks: Iterator[bytes]) -> None:
        self.fd = fd
        self.chunks = chunks
        self.pending = memoryview(b"")
        self.busy = True

    def write(self) -> bool:
        """Write what fits now; False once everything is written (or the worker is gone)."""
        while True:
            if not self.pending:
                chunk = next(self.chunks, None)
                if chunk is None:
                    self.busy = False
                    return False
                self.pending = memoryview(chunk)
            try:
                written = os.write(self.fd, self.pending)
            except BlockingIOError:
                return True
            except BrokenPipeError:
                self.busy = False  # the worker died: reading the result pipe will say why
                return False
            self.pending = self.pending[written:]


def _timeout_fault(reader: _Reader, timeout_s: float) -> Fault:
    what = "loading the evaluator" if reader.loading else "this call"
    return Fault(
        "timeout", f"{what} did not finish within {timeout_s:g} s; the worker was stopped."
    )


def _violation(what: str) -> Fault:
    return Fault(
        "protocol_violation",
        f"the worker wrote something that is not this call's result ({what}); "
        "user code may have written to the result channel. The worker was replaced.",
    )


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def fault_result(fault: Fault) -> CallResult:
    return error_result(fault.code, fault.message, stacktrace=fault.detail)


# -- frame readers ------------------------------------------------------------------------------
class _Reader:
    done = False
    loading = False
    progressed = False

    def __init__(self) -> None:
        self.outcome = Outcome()

    def feed(self, lines: list[bytes]) -> None:
        raise NotImplementedError


class _HelloReader(_Reader):
    runtime = ""

    def feed(self, lines: list[bytes]) -> None:
        if len(lines) != 1 or not lines[0].startswith(b"H "):
            raise ProtocolViolation("no hello")
        self.runtime = str(_json_object(lines[0][2:]).get("runtime", ""))
        self.done = True


class _CheckReader(_Reader):
    def __init__(self, nonce: bytes) -> None:
        super().__init__()
        self.prefix = b"C " + nonce + b" "
        self.problems: list[dict[str, Any]] = []

    def feed(self, lines: list[bytes]) -> None:
        if len(lines) != 1 or not lines[0].startswith(self.prefix):
            raise ProtocolViolation("not the answer to this check")
        try:
            problems = json.loads(lines[0][len(self.prefix) :])
        except (ValueError, RecursionError):
            raise ProtocolViolation("a malformed check answer")
        if not isinstance(problems, list):
            raise ProtocolViolation("a malformed check answer")
        self.problems = [_error_dict(p) for p in problems]
        self.done = True


class _BatchReader(_Reader):
    """Accepts ``K`` at most once, then ``L`` once, then ``R`` frames with indexes 0, 1, 2 ...
    in this order only.

    ``loading`` is true from ``K`` (the worker compiles the code) to ``L``: a fault then is the
    load's. A worker that already has the revision sends no ``K`` and its ``L`` with the first
    result, so a fault before any frame is the first call's, as it would be a microsecond after
    a separate ``L``."""

    def __init__(self, nonce: bytes, count: int, log_limit: int, budget: int) -> None:
        super().__init__()
        self.count = count
        self.log_limit = log_limit
        self.budget = budget
        self.loaded = False
        self.compiling = b"K " + nonce
        self.load_prefix = b"L " + nonce + b" "
        self.prefix = b"R " + nonce + b" "

    def feed(self, lines: list[bytes]) -> None:
        if not self.loaded:
            if lines[0] == self.compiling and not self.loading:
                self.loading = True
                lines = lines[1:]
                if not lines:
                    return
            self._feed_load(lines[0])
            lines = lines[1:]
        if not lines:
            return
        if self.done:
            raise ProtocolViolation("frames after the end of the batch")
        payloads: list[bytes] = []
        try:
            self._collect(lines, payloads)
        finally:
            # Frames that came before a bad one are genuine results: keep them.
            self._decode(payloads)

    def _collect(self, lines: list[bytes], payloads: list[bytes]) -> None:
        index = len(self.outcome.results)
        prefix = self.prefix
        outcome = self.outcome
        for line in lines:
            if index == self.count:
                raise ProtocolViolation("frames after the last result of the batch")
            outcome.received += len(line)
            if outcome.received > self.budget:
                raise OverBudget(
                    f"the batch's results and logs went past {self.budget} bytes; "
                    "the worker was stopped."
                )
            head = b"%s%d " % (prefix, index)
            if not line.startswith(head):
                raise ProtocolViolation(f"{line[:40]!r} while waiting for result {index}")
            payloads.append(line[len(head) :])
            index += 1

    def _decode(self, payloads: list[bytes]) -> None:
        if not payloads:
            return
        try:
            decoded = _loads(b"[" + b",".join(payloads) + b"]")
        except (ValueError, RecursionError):
            decoded = []
            for payload in payloads:
                try:
                    decoded.append(_loads(payload))
                except RecursionError:  # the harness could encode it, the host cannot decode it
                    decoded.append({"ok": True, "unrepresentable": _TOO_DEEP})
                except ValueError:
                    break
        results = self.outcome.results
        for data in decoded:
            result, retire = _result(data, self.log_limit)
            results.append(result)
            if retire:
                self.outcome.retire = True
                break
        self.progressed = True
        if len(decoded) < len(payloads) and not self.outcome.retire:
            raise ProtocolViolation("a frame that is not JSON")
        if self.outcome.retire or len(results) == self.count:
            self.done = True

    def _feed_load(self, line: bytes) -> None:
        if not line.startswith(self.load_prefix):
            raise ProtocolViolation("a frame from outside this batch")
        payload = line[len(self.load_prefix) :]
        # The answer to nearly every batch: no load error, no output. Spare it a JSON decode.
        loaded = _LOADED if payload == b'{"ok":true}' else _json_object(payload)
        self.loaded = True
        self.loading = False
        self.progressed = True
        self.outcome.load_logs = _clip(loaded.get("logs"), self.log_limit)
        if not loaded.get("ok"):
            self.outcome.load_error = _error_dict(loaded.get("error"))
            self.done = True
        elif self.count == 0:
            self.done = True


_TOO_DEEP = f"a value {jsonsafe.too_deep_message()}"
_LOADED = {"ok": True}


def _result(data: Any, log_limit: int) -> tuple[CallResult, bool]:
    if type(data) is not dict:
        raise ProtocolViolation("a frame that is not a JSON object")
    ms = data.get("ms")
    duration = float(ms) if type(ms) in (int, float) else 0.0
    logs = _clip(data["logs"], log_limit) if "logs" in data else ""
    retire = data.get("retire") is True
    if data.get("ok") is True:
        if "unrepresentable" in data:
            value: Any = Unrepresentable(str(data["unrepresentable"]))
        else:
            value = data.get("value")
        return CallResult("success", value, None, logs, duration), retire
    return CallResult("error", None, _error_dict(data.get("error")), logs, duration), retire


def _json_object(payload: bytes) -> dict[str, Any]:
    try:
        data = _loads(payload)
    except (ValueError, RecursionError):
        raise ProtocolViolation("a frame that is not JSON")
    if not isinstance(data, dict):
        raise ProtocolViolation("a frame that is not a JSON object")
    return data


def _error_dict(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolViolation("a malformed error")
    error: dict[str, Any] = {
        key: str(raw.get(key) or "") for key in ("code", "type", "message", "stacktrace")
    }
    error["code"] = error["code"] or "exception"
    for key in ("line", "column"):
        if type(raw.get(key)) is int:
            error[key] = raw[key]
    return error


def _clip(logs: Any, limit: int) -> str:
    if not isinstance(logs, str):
        return ""
    return logs if len(logs) <= limit + 100 else logs[:limit] + "\n[output truncated]"
