"""The ``celery`` code runner: ship a batch to a worker on the ``code`` queue and wait for it.

``EVALSITE_CODE_RUNNER=celery`` keeps user code off the web and run hosts: ``run_batch`` and
``check_code`` send their arguments to ``evaluators.tasks.code_*`` by name (routed to queue
``code``; this module never imports the tasks, which call its worker's side below), a
worker there runs them with its own local runner (the bubblewrap sandbox, or ``inprocess`` when
that worker is configured so), and the caller waits for the ``CallResult`` list through the
result backend (``CELERY_RESULT_BACKEND``). Nothing falls back: when no worker takes the batch in
time, the call raises ``SandboxUnavailable`` and every evaluation of the batch records that error.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from typing import Any

from celery.exceptions import TaskRevokedError
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.signals import worker_ready
from kombu.exceptions import OperationalError

from evalsite.celery import app
from evaluators.normalize import Unrepresentable
from evaluators.sandbox import CHECK_TIMEOUT_S, CallResult, SandboxUnavailable, get_runner
from evaluators.sandbox.config import Config, load_config

logger = logging.getLogger(__name__)

QUEUE = "code"


class CeleryRunner:
    """A ``Runner`` whose work happens on the ``code`` queue's workers.

    ``pickup_s``: how long a batch may wait for a worker to start it. The message expires then,
    so a worker that comes back later never runs a batch nobody waits for. ``status_s``: how long
    the status check waits for a worker's answer; the answer is kept ``status_ttl_s``.
    """

    name = "celery"

    def __init__(
        self, *, pickup_s: float = 60.0, status_s: float = 3.0, status_ttl_s: float = 30.0
    ):
        self.pickup_s = pickup_s
        self.status_s = status_s
        self.status_ttl_s = status_ttl_s
        self._status: tuple[float, dict[str, Any]] | None = None

    def run_batch(self, *, config: Config, calls: list[dict[str, Any]], **kwargs: Any):
        # Calls run one after another in the worker; a slow pool start comes on top.
        work_s = config.start_timeout_s + kwargs["timeout_s"] * max(len(calls), 1) + 5
        payload = self._call("evaluators.tasks.code_run_batch", {"calls": calls, **kwargs}, work_s)
        return [result_decode(item) for item in payload]

    def check_code(
        self, *, config: Config, runtime: str, code: str, version: str = "2"
    ) -> list[dict[str, Any]]:
        work_s = config.start_timeout_s + CHECK_TIMEOUT_S + 5
        kwargs = {"runtime": runtime, "code": code, "version": version}
        return self._call("evaluators.tasks.code_check", kwargs, work_s)

    def status(self, config: Config, *, probe: bool = True) -> dict[str, Any]:
        # Asking a worker is the only check there is; ``probe`` does not apply here.
        now = time.monotonic()
        if self._status is None or now - self._status[0] > self.status_ttl_s:
            self._status = (now, self._remote_status())
        return self._status[1]

    def _remote_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"available": False, "runner": self.name, "queue": QUEUE}
        try:
            remote = self._call(
                "evaluators.tasks.code_status", {}, self.status_s, pickup_s=self.status_s
            )
        except SandboxUnavailable as exc:
            status["problem"] = str(exc)
            return status
        except Exception as exc:  # the result backend is down: the page must still render
            status["problem"] = f"the Celery result backend is unreachable: {exc}"
            return status
        problem = remote.get("problem")
        status.update(
            available=bool(remote.get("available")),
            problem=f"on the code worker: {problem}" if problem else None,
            remote=remote,
        )
        if remote.get("warning"):
            status["warning"] = f"on the code worker: {remote['warning']}"
        status["warnings"] = [f"on the code worker: {w}" for w in remote.get("warnings", [])]
        return status

    def _call(self, task: str, kwargs: dict[str, Any], work_s: float, pickup_s: float = 0) -> Any:
        pickup_s = pickup_s or self.pickup_s
        try:
            result = app.send_task(
                task,
                kwargs=kwargs,
                ignore_result=False,  # against the global default: we wait for it
                expires=pickup_s,
                soft_time_limit=work_s,
                time_limit=work_s + 10,
            )
        except OperationalError as exc:
            raise SandboxUnavailable(f"the Celery broker is unreachable: {exc}")
        try:
            return self._wait(result, work_s, pickup_s)
        finally:
            with suppress(Exception):  # the original error matters more than this clean-up
                result.forget()  # stop listening for it; drop a result nobody will read

    def _wait(self, result, work_s: float, pickup_s: float) -> Any:
        try:
            # Work usually comes back well within the pickup window: one wait covers it.
            return result.get(timeout=pickup_s, disable_sync_subtasks=False)
        except TaskRevokedError:
            raise _not_picked_up(pickup_s)
        except CeleryTimeout:
            if result.state == "PENDING":  # nobody started it, and now the message has expired
                raise _not_picked_up(pickup_s)
        try:
            return result.get(timeout=work_s, disable_sync_subtasks=False)
        except (CeleryTimeout, TaskRevokedError):
            raise SandboxUnavailable(
                f"a worker on the {QUEUE!r} queue took the work but sent no answer within "
                f"{work_s:g} s"
            )


def _not_picked_up(pickup_s: float) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"no worker on the {QUEUE!r} queue took the work within {pickup_s:g} s: none is running "
        f"(start one with `celery -A evalsite worker -Q {QUEUE}`), or every one is busy"
    )


# --- the worker's side ------------------------------------------------------------------------


def local_config() -> Config:
    """The configuration a code worker runs with: its own runner, never ``celery`` again."""
    config = load_config()
    return config.with_(runner="sandbox") if config.runner == "celery" else config


def batch_run_here(**kwargs: Any) -> list[dict[str, Any]]:
    """Run a shipped batch with this host's runner; ``CallResult`` objects as JSON."""
    config = local_config()
    results = get_runner(config).run_batch(config=config, **kwargs)
    return [result_encode(result) for result in results]


def check_here(*, runtime: str, code: str, version: str = "2") -> list[dict[str, Any]]:
    config = local_config()
    return get_runner(config).check_code(config=config, runtime=runtime, code=code, version=version)


def status_here() -> dict[str, Any]:
    config = local_config()
    return get_runner(config).status(config)


def result_encode(result: CallResult) -> dict[str, Any]:
    encoded = {
        "status": result.status,
        "value": result.value,
        "error": result.error,
        "logs": result.logs,
        "duration_ms": result.duration_ms,
    }
    if isinstance(result.value, Unrepresentable):
        encoded.update(value=None, unrepresentable=result.value.what)
    return encoded


def result_decode(item: dict[str, Any]) -> CallResult:
    value = item.get("value")
    if "unrepresentable" in item:
        value = Unrepresentable(item["unrepresentable"])
    return CallResult(
        item["status"], value, item.get("error"), item.get("logs", ""), item.get("duration_ms", 0.0)
    )


@worker_ready.connect
def _report_local_sandbox(sender=None, **kwargs: Any) -> None:
    # Only workers that consume the code queue run user code; say at once if they cannot.
    app = getattr(sender, "app", None)
    if app is None or QUEUE not in app.amqp.queues.consume_from:
        return
    status = status_here()
    if not status.get("available"):
        logger.error(
            "This worker consumes the %r queue but cannot run code evaluators: %s",
            QUEUE,
            status.get("problem"),
        )
    elif status.get("warning"):
        logger.warning("!!! %s !!!", status["warning"])
    for warning in status.get("warnings", []):
        logger.warning("Code sandbox: %s", warning)
