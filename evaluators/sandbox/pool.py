"""Warm worker pools: long-lived workers per (configuration, project, runtime), fed batches.

Lifecycle of a worker: started on demand (from ``Registry.spawner``'s long-lived threads),
checked out by one thread for one batch attempt, checked back in, and closed after any fault,
when idle for ``idle_seconds``, or to make room under ``max_workers``. After ``recycle_after``
calls or half its CPU-time allowance it is recycled: closed, and a successor started in the
background in its slot. A worker never serves two projects: the project is part of the key.

A batch is cut into attempts. When a worker faults (timeout, crash, memory, protocol violation),
the calls that finished keep their results, the call in flight gets the fault as its error, and
the rest go to a fresh worker. ``max_consecutive_faults`` attempts in a row that achieve nothing
else stop the batch: the remaining calls fail as ``aborted`` instead of each waiting out its own
timeout."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .config import Config
from .process import Fault, Outcome, WorkerProcess, encode_chunks, fault_result, line_bytes
from .results import CallResult, error_result

log = logging.getLogger("evaluators.sandbox")


@dataclass
class Pool:
    config: Config
    project_key: str
    runtime: str
    sandboxed: bool
    idle: list[WorkerProcess] = field(default_factory=list)
    size: int = 0  # idle + checked out + being started
    users: int = 0  # run_batch calls holding this pool: it must stay registered meanwhile


class Registry:
    """Every pool of this host process, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.pools: dict[tuple[Config, str, str, bool], Pool] = {}
        # Workers are started from these long-lived threads: bwrap's --die-with-parent follows
        # the *thread* that started it, and request threads come and go.
        self.spawner = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sandbox-spawn")
        self.reaper: threading.Thread | None = None

    # -- checkout / checkin ---------------------------------------------------------------------
    def checkout(self, pool: Pool) -> WorkerProcess:
        while True:
            worker = self._take_idle_or_slot(pool)
            if worker is None:
                break
            if worker.alive():
                return worker
            # Died while idle (killed from outside): nobody's call is to blame.
            self.checkin(pool, worker, healthy=False)
        try:
            return self.spawner.submit(
                WorkerProcess, pool.config, pool.runtime, sandboxed=pool.sandboxed
            ).result()
        except BaseException:
            with self.lock:
                pool.size -= 1
                self.lock.notify_all()
            raise

    def _take_idle_or_slot(self, pool: Pool) -> WorkerProcess | None:
        """An idle worker, or None once a slot for a new one is reserved."""
        with self.lock:
            while True:
                if pool.idle:
                    return pool.idle.pop()
                if pool.size < pool.config.workers_per_pool and self._make_room(pool.config):
                    pool.size += 1
                    return None
                self.lock.wait(timeout=1.0)

    def checkin(self, pool: Pool, worker: WorkerProcess, *, healthy: bool) -> None:
        worn = worker.worn_out()
        keep = healthy and not worn
        with self.lock:
            if keep:
                pool.idle.append(worker)
            elif healthy:
                # Recycled on schedule: its successor starts now, off the caller's thread, and
                # inherits its slot, so the next batch does not wait for a cold start.
                self.spawner.submit(self._spawn_spare, pool)
            else:
                pool.size -= 1
            self.lock.notify_all()
        if not keep:
            worker.close()

    def _spawn_spare(self, pool: Pool) -> None:
        try:
            worker = WorkerProcess(pool.config, pool.runtime, sandboxed=pool.sandboxed)
        except Exception:
            log.exception("could not start a replacement %s worker", pool.runtime)
            with self.lock:
                pool.size -= 1
                self.lock.notify_all()
            return
        with self.lock:
            pool.idle.append(worker)
            self.lock.notify_all()

    def _make_room(self, config: Config) -> bool:
        """Whether one more worker fits under max_workers, closing the stalest idle one if not."""
        if sum(p.size for p in self.pools.values()) < config.max_workers:
            return True
        candidates = [(w.last_used, p, w) for p in self.pools.values() for w in p.idle]
        if not candidates:
            return False
        _, victim_pool, victim = min(candidates, key=lambda c: c[0])
        victim_pool.idle.remove(victim)
        victim_pool.size -= 1
        threading.Thread(target=victim.close, daemon=True).start()
        return True

    # -- pools ----------------------------------------------------------------------------------
    def pool(self, config: Config, project_key: str, runtime: str, *, sandboxed: bool) -> Pool:
        """The pool for this key, held until ``release``."""
        key = (config, project_key, runtime, sandboxed)
        with self.lock:
            pool = self.pools.get(key)
            created = pool is None
            if pool is None:
                pool = self.pools[key] = Pool(config, project_key, runtime, sandboxed)
                self._start_reaper()
            pool.users += 1
        if created and not sandboxed:
            log.warning(
                "UNSANDBOXED code runner: starting a %s pool for project %r with "
                "EVALSITE_CODE_RUNNER=inprocess. User code runs with this server's files, "
                "network and environment. Use this only on a trusted single-user install.",
                runtime,
                project_key,
            )
        return pool

    def release(self, pool: Pool) -> None:
        with self.lock:
            pool.users -= 1

    def close_all(self) -> None:
        with self.lock:
            workers = [w for p in self.pools.values() for w in p.idle]
            for pool in self.pools.values():
                pool.size -= len(pool.idle)
                pool.idle.clear()
        for worker in workers:
            worker.close()

    def _start_reaper(self) -> None:
        if self.reaper is None:
            self.reaper = threading.Thread(
                target=self._reap_forever, daemon=True, name="sandbox-reaper"
            )
            self.reaper.start()

    def _reap_forever(self) -> None:
        while True:
            time.sleep(1.0)
            self.reap_idle()

    def reap_idle(self) -> None:
        now = time.monotonic()
        stale: list[WorkerProcess] = []
        with self.lock:
            for key, pool in list(self.pools.items()):
                expired = [w for w in pool.idle if now - w.last_used > pool.config.idle_seconds]
                for worker in expired:
                    pool.idle.remove(worker)
                    pool.size -= 1
                stale += expired
                if pool.size == 0 and pool.users == 0:
                    del self.pools[key]
        for worker in stale:
            worker.close()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                f"{p.project_key}/{p.runtime}": {"workers": p.size, "idle": len(p.idle)}
                for p in self.pools.values()
            }


_registry = Registry()
atexit.register(lambda: _registry.close_all())


def _forget_after_fork() -> None:
    # A forked child (Celery prefork) must not drive its parent's workers through shared pipes.
    global _registry
    old, _registry = _registry, Registry()
    for pool in old.pools.values():
        for worker in pool.idle:
            worker.forget()


os.register_at_fork(after_in_child=_forget_after_fork)


def registry() -> Registry:
    return _registry


# -- running a batch --------------------------------------------------------------------------------
@dataclass
class Batch:
    code: str
    revision_key: str
    version: str
    timeout_s: float
    args: list[list[Any]]
    results: list[CallResult | None]
    output_budget: int
    line_bytes: int  # the most bytes of one request line (process.line_bytes)
    chunks: list[bytes] | None = None  # every call encoded, until the first attempt uses it
    entry: str = "evaluate"  # or "session": the code's evaluate_session


def run_batch(
    *,
    config: Config,
    project_key: str,
    runtime: str,
    sandboxed: bool,
    code: str,
    revision_key: str,
    version: str,
    calls: list[dict[str, Any]],
    timeout_s: float,
    entry: str = "evaluate",
) -> list[CallResult]:
    """Run every call through the project's pool; see the module docstring for faults."""
    args = [call_args(call, version, entry) for call in calls]
    budget = config.batch_output_limit_bytes
    batch = Batch(
        code,
        revision_key,
        version,
        timeout_s,
        args,
        [None] * len(args),
        budget,
        line_bytes(config, runtime),
        entry=entry,
    )
    pending = _encode_or_reject(batch)
    pools = _registry
    pool = pools.pool(config, project_key, runtime, sandboxed=sandboxed)
    try:
        streak = 0
        while pending:
            pending, streak = _attempt(pools, pool, batch, pending, streak)
            if pending and streak >= config.max_consecutive_faults:
                _abort(batch, pending, f"the previous {streak} calls each stopped the worker")
                break
    finally:
        pools.release(pool)
    return batch.results  # type: ignore[return-value]  # every slot is filled by now


def _encode_or_reject(batch: Batch) -> list[int]:
    """Encode the whole batch once; calls whose arguments are not JSON fail on their own."""
    try:
        batch.chunks = encode_chunks(batch.args, batch.line_bytes)
        return list(range(len(batch.args)))
    except (TypeError, ValueError):
        pass
    pending = []
    for index, args in enumerate(batch.args):
        try:
            encode_chunks([args], batch.line_bytes)
            pending.append(index)
        except (TypeError, ValueError) as exc:
            batch.results[index] = error_result(
                "invalid_input", f"The call's arguments are not JSON: {exc}", type="InvalidInput"
            )
    return pending


def _attempt(
    pools: Registry, pool: Pool, batch: Batch, pending: list[int], streak: int
) -> tuple[list[int], int]:
    """One attempt on one worker; returns the calls still to run and the updated fault streak."""
    worker = pools.checkout(pool)
    outcome: Outcome | None = None
    try:
        chunk = pending[: worker.remaining]
        chunks = batch.chunks if len(chunk) == len(batch.args) else None
        batch.chunks = None
        outcome = worker.run(
            code=batch.code,
            revision_key=batch.revision_key,
            version=batch.version,
            count=len(chunk),
            chunks=chunks or encode_chunks([batch.args[i] for i in chunk], batch.line_bytes),
            timeout_s=batch.timeout_s,
            output_budget=batch.output_budget,
            entry=batch.entry,
        )
    finally:
        pools.checkin(pool, worker, healthy=outcome is not None and outcome.healthy)
    if outcome.load_error is not None or outcome.during_load:
        _fail_load(batch, pending, outcome)
        return [], 0
    done = len(outcome.results)
    for offset, result in enumerate(outcome.results):
        batch.results[chunk[offset]] = result
    if done and outcome.load_logs:
        first = outcome.results[0]
        first.logs = outcome.load_logs + first.logs
    if outcome.fault is not None and done < len(chunk):
        batch.results[chunk[done]] = fault_result(outcome.fault)
        done += 1
    batch.output_budget -= outcome.received
    if outcome.fault is not None and outcome.fault.code == "output_limit":
        _abort(batch, pending[done:], outcome.fault)
        return [], 0
    if outcome.healthy:
        return pending[done:], 0
    # A fault (or a worker asking to go) that came with no other progress lengthens the streak.
    return pending[done:], (streak + 1 if done <= 1 else 1)


def _fail_load(batch: Batch, pending: list[int], outcome: Outcome) -> None:
    if outcome.load_error is not None:
        error = outcome.load_error
    else:
        assert outcome.fault is not None
        fault = outcome.fault
        error = {
            "code": fault.code,
            "type": "SandboxError",
            "message": "While loading the evaluator: " + fault.message,
            "stacktrace": fault.detail,
        }
    for index in pending:
        batch.results[index] = CallResult("error", None, dict(error), outcome.load_logs, 0.0)


def _abort(batch: Batch, pending: list[int], why: str | Fault) -> None:
    if isinstance(why, Fault):
        code, message = why.code, f"Not run: {why.message}"
    else:
        code, message = "aborted", f"Not run: {why} (see their errors)."
    for index in pending:
        batch.results[index] = error_result(code, message)


def call_args(call: dict[str, Any], version: str, entry: str = "evaluate") -> list[Any]:
    """The positional arguments of evaluate() (or evaluate_session()) for one call."""
    if entry == "session":
        return [call.get("inputs"), call.get("outputs"), call.get("session")]
    if version == "1":
        app_params = call.get("app_params") or {}
        return [app_params, call.get("inputs"), call.get("outputs"), call.get("correct_answer")]
    return [call.get("inputs"), call.get("outputs"), call.get("trace")]
