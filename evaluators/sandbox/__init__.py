"""Run user-written evaluators (Python, JavaScript, TypeScript) isolated by the OS, fast.

Public API (used by the ``code`` evaluator kind)::

    run_batch(project_key=..., runtime=..., code=..., revision_key=..., version=...,
              calls=[{"inputs", "outputs", "trace", "app_params", "correct_answer"}, ...],
              timeout_s=5.0, entry="evaluate") -> list[CallResult]
    (entry="session": calls are {"inputs", "outputs", "session"}, for evaluate_session)
    check_code(runtime=..., code=..., version="2") -> list[dict]
    sandbox_status() -> dict

The runner is chosen by ``EVALSITE_CODE_RUNNER``: ``sandbox`` (default: bubblewrap + seccomp
workers), ``inprocess`` (the same workers without any jail, for trusted single-user installs
only), or a runner registered with ``register_runner``: ``celery`` (evaluators/sandbox_celery.py)
ships the same arguments to a ``code`` worker and returns its ``CallResult`` list; work already
on a code worker runs here instead (``runner_here``).
A runner that cannot run raises ``SandboxUnavailable``; there is no silent fallback.

See docs/sandbox.md for the threat model and the limits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from . import jail, pool
from .config import RUNTIMES, Config, load_config
from .errors import SandboxError, SandboxUnavailable
from .process import WorkerProcess
from .results import CallResult
from .seccomp import filter_bpf

__all__ = [
    "CallResult",
    "Runner",
    "SandboxError",
    "SandboxUnavailable",
    "check_code",
    "get_runner",
    "register_runner",
    "run_batch",
    "runner_here",
    "sandbox_status",
]

CHECK_TIMEOUT_S = 10.0
_FAMILIES = ("python", "javascript")  # one runtime of each jail layout
PROBE_TTL_S = 30.0
_probes: dict[Config, tuple[float, str | None]] = {}
_probe_lock = threading.Lock()


class Runner(Protocol):
    """What a runner provides. ``config`` is the one loaded for this call."""

    name: str

    def run_batch(
        self,
        *,
        config: Config,
        project_key: str,
        runtime: str,
        code: str,
        revision_key: str,
        version: str,
        calls: list[dict[str, Any]],
        timeout_s: float,
        entry: str = "evaluate",
    ) -> list[CallResult]: ...

    def check_code(
        self, *, config: Config, runtime: str, code: str, version: str = "2"
    ) -> list[dict[str, Any]]: ...

    def status(self, config: Config, *, probe: bool = True) -> dict[str, Any]: ...


class WorkerRunner:
    """Both built-in runners: pooled worker processes, jailed or not."""

    def __init__(self, name: str, *, sandboxed: bool) -> None:
        self.name = name
        self.sandboxed = sandboxed

    def run_batch(self, *, config: Config, runtime: str, **kwargs: Any) -> list[CallResult]:
        if self.sandboxed:
            _require_sandbox(config, runtime)
        return pool.run_batch(config=config, runtime=runtime, sandboxed=self.sandboxed, **kwargs)

    def check_code(
        self, *, config: Config, runtime: str, code: str, version: str = "2"
    ) -> list[dict[str, Any]]:
        if self.sandboxed:
            _require_sandbox(config, runtime)
        # A one-off worker: checking runs the module's top level, which must not leave anything
        # behind in a pooled worker.
        worker = (
            pool.registry()
            .spawner.submit(WorkerProcess, config, runtime, sandboxed=self.sandboxed)
            .result()
        )
        try:
            return worker.check(code, CHECK_TIMEOUT_S, version)
        finally:
            worker.close()

    def status(self, config: Config, *, probe: bool = True) -> dict[str, Any]:
        status: dict[str, Any] = {"available": True, "runner": self.name, "problem": None}
        if self.sandboxed:
            problem = _sandbox_problem(config, probe=probe)
            status.update(available=problem is None, problem=problem)
            status.update(_uid_report(config))
        else:
            status["warning"] = (
                "user code runs without any sandbox (EVALSITE_CODE_RUNNER=inprocess)"
            )
        status["pools"] = pool.registry().stats()
        return status


_RUNNERS: dict[str, Runner] = {
    "sandbox": WorkerRunner("sandbox", sandboxed=True),
    "inprocess": WorkerRunner("inprocess", sandboxed=False),
}


def register_runner(name: str, runner: Runner) -> None:
    """Install another runner (the Celery one), selected with ``EVALSITE_CODE_RUNNER=<name>``."""
    _RUNNERS[name] = runner


_HERE: ContextVar[bool] = ContextVar("sandbox_here", default=False)


@contextmanager
def runner_here() -> Iterator[None]:
    """Run code on this host's own sandbox even when ``EVALSITE_CODE_RUNNER=celery``: for work
    that already runs on a ``code`` worker (the run engine's code lane), which must not send
    its batch to another code worker and wait for it."""
    token = _HERE.set(True)
    try:
        yield
    finally:
        _HERE.reset(token)


def get_runner(config: Config) -> Runner:
    name = "sandbox" if config.runner == "celery" and _HERE.get() else config.runner
    runner = _RUNNERS.get(name)
    if runner is None:
        raise SandboxUnavailable(
            f"EVALSITE_CODE_RUNNER={config.runner!r} but no such runner is installed "
            f"(available: {', '.join(sorted(_RUNNERS))})."
        )
    return runner


def run_batch(
    *,
    project_key: str,
    runtime: str,
    code: str,
    revision_key: str,
    version: str,
    calls: list[dict[str, Any]],
    timeout_s: float = 5.0,
    entry: str = "evaluate",
) -> list[CallResult]:
    """Evaluate ``calls`` with one evaluator revision; one ``CallResult`` per call, in order.

    ``version`` ``"2"``: ``evaluate(inputs, outputs, trace)``; ``"1"`` (legacy):
    ``evaluate(app_params, inputs, output, correct_answer)``. ``entry="session"`` (version 2
    only) calls ``evaluate_session(inputs, outputs, session)`` (``evaluateSession`` in
    JavaScript/TypeScript) with each call's ``session``; code without it fails every call with
    ``session_unsupported``. ``revision_key`` identifies the code:
    the same key must always mean the same code (workers compile each key once). ``timeout_s``
    bounds each call's wall-clock time. Per-call failures are results, never exceptions; the
    function raises only when the runner itself cannot run (``SandboxUnavailable``).
    """
    _check_runtime(runtime)
    if version not in ("1", "2"):
        raise ValueError(f"version must be '1' or '2', not {version!r}")
    if entry not in ("evaluate", "session") or (entry == "session" and version != "2"):
        raise ValueError(f"entry must be 'evaluate', or 'session' with version 2, not {entry!r}")
    config = load_config()
    return get_runner(config).run_batch(
        config=config,
        project_key=project_key,
        runtime=runtime,
        code=code,
        revision_key=revision_key,
        version=version,
        calls=calls,
        timeout_s=timeout_s,
        entry=entry,
    )


def check_code(*, runtime: str, code: str, version: str = "2") -> list[dict[str, Any]]:
    """Problems that stop ``code`` from loading, each ``{code, type, message, line?, column?}``.

    Runs the module's top level in a fresh worker of the configured runner; ``[]`` means it
    loads and defines an entry point: ``evaluate`` or ``evaluate_session`` (``evaluateSession``)
    for ``version`` ``"2"``, ``evaluate`` for ``"1"`` (the legacy interface judges no sessions).
    """
    _check_runtime(runtime)
    if version not in ("1", "2"):
        raise ValueError(f"version must be '1' or '2', not {version!r}")
    config = load_config()
    return get_runner(config).check_code(config=config, runtime=runtime, code=code, version=version)


def sandbox_status(*, probe: bool = True) -> dict[str, Any]:
    """``{"available", "runner", "problem", ...}`` for health pages and admin screens.

    ``probe=False`` checks files only and starts no jailed worker (what start-up uses: every
    Django process, every ``manage.py`` command, would otherwise start one)."""
    try:
        config = load_config()
    except SandboxError as exc:
        return {"available": False, "runner": None, "problem": str(exc)}
    runner = _RUNNERS.get(config.runner)
    if runner is None:
        problem = f"runner {config.runner!r} is not installed"
        return {"available": False, "runner": config.runner, "problem": problem}
    return runner.status(config, probe=probe)


def _check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")


def _require_sandbox(config: Config, runtime: str) -> None:
    """Refuse to run where the jail cannot. Checked once per process, configuration and runtime
    family: a worker that then fails to start makes the next call check again
    (``jail.forget_resolutions``), so a tool removed since is reported, not run around."""
    key = (config, jail.family(runtime))
    if key in jail.checked:
        return
    problem = _sandbox_problem(config, probe=False, runtimes=(runtime,))
    if problem:
        raise SandboxUnavailable(problem)
    jail.checked.add(key)


def _sandbox_problem(
    config: Config, *, probe: bool = True, runtimes: tuple[str, ...] = _FAMILIES
) -> str | None:
    """Why the jail cannot run ``runtimes`` here, or None. ``probe`` also starts a jailed
    worker."""
    for name, path, package in (
        ("bwrap", config.bwrap, "bubblewrap"),
        ("prlimit", config.prlimit, "util-linux"),
    ):
        if not os.access(path, os.X_OK):
            setting = f"EVALSITE_SANDBOX_{name.upper()}"
            return f"{name} not found at {path} (install {package}, or set {setting})"
    try:
        filter_bpf(allow_threads=True)
        # Works out each runtime's layout as root: an interpreter that cannot run says so here.
        refusals = [jail.uid_decision(config, runtime)[1] for runtime in runtimes]
    except SandboxUnavailable as exc:
        return str(exc)
    if any(refusals):
        return "; ".join(r for r in refusals if r)
    return _probe(config) if probe else None


def _probe(config: Config) -> str | None:
    """Start and stop one jailed worker; the answer is kept for PROBE_TTL_S."""
    now = time.monotonic()
    with _probe_lock:
        cached = _probes.get(config)
        if cached and now - cached[0] < PROBE_TTL_S:
            return cached[1]
    try:
        WorkerProcess(config, "python", sandboxed=True).close()
        problem = None
    except SandboxError as exc:
        problem = f"a jailed worker could not start: {exc}"
    with _probe_lock:
        _probes[config] = (now, problem)
    return problem


def _uid_report(config: Config) -> dict[str, Any]:
    """The host uid each runtime's workers run as, and a warning for each that stays root."""
    uids: dict[str, int] = {}
    for runtime in _FAMILIES:
        uid, refused = jail.uid_decision(config, runtime)
        if not refused:
            uids[runtime] = uid if uid is not None else os.geteuid()
    warnings = [
        f"{runtime} workers run as host root (uid 0), as EVALSITE_SANDBOX_ALLOW_ROOT allows: "
        "still without capabilities, in a user namespace, behind a read-only root"
        for runtime, uid in uids.items()
        if uid == 0
    ]
    return {"uid": uids, "warnings": warnings}
