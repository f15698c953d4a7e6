"""Helpers for the sandbox tests: real bwrap, real node, small limits so failures come fast."""

from __future__ import annotations

import itertools
import textwrap
from typing import Any

import pytest

from evaluators.sandbox import get_runner
from evaluators.sandbox.config import Config, load_config, reset_config
from evaluators.sandbox.pool import registry
from evaluators.sandbox.results import CallResult

_keys = itertools.count()

SMALL = {
    "memory_mb": 128,
    "node_memory_mb": 256,
    "cpu_seconds": 20,
    "file_size_mb": 1,
    "tmp_mb": 2,
    "log_limit_bytes": 2000,
    "max_consecutive_faults": 3,
    "idle_seconds": 60.0,
}


@pytest.fixture(scope="session")
def config() -> Config:
    return load_config().with_(runner="sandbox", **SMALL)


@pytest.fixture(autouse=True, scope="module")
def _close_pools():
    yield
    registry().close_all()


@pytest.fixture
def sandbox_env(monkeypatch):
    """Set sandbox environment variables for one test. The configuration is resolved once per
    process, so it is resolved again after each change and once the test has undone them."""

    def setenv(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        reset_config()

    yield setenv
    monkeypatch.undo()
    reset_config()


def call(inputs: Any = None, outputs: Any = "", trace: Any = None, **extra: Any) -> dict:
    return {"inputs": {} if inputs is None else inputs, "outputs": outputs, "trace": trace, **extra}


def run(
    config: Config,
    runtime: str,
    code: str,
    calls: list[dict] | None = None,
    *,
    project: str = "acme",
    version: str = "2",
    timeout_s: float = 5.0,
    revision_key: str | None = None,
) -> list[CallResult]:
    """Run a batch through the configured runner (the public run_batch, with a given config)."""
    return get_runner(config).run_batch(
        config=config,
        project_key=project,
        runtime=runtime,
        code=textwrap.dedent(code),
        revision_key=revision_key or f"rev-{next(_keys)}",
        version=version,
        calls=calls if calls is not None else [call()],
        timeout_s=timeout_s,
    )


def one(config: Config, runtime: str, code: str, **kwargs: Any) -> CallResult:
    results = run(config, runtime, code, **kwargs)
    assert len(results) == 1
    return results[0]


def fresh_project() -> str:
    """A project key no earlier test used: its pool starts from a new worker."""
    return f"project-{next(_keys)}"


def error_code(result: CallResult) -> str:
    assert result.status == "error", result
    assert result.error is not None
    return result.error["code"]
