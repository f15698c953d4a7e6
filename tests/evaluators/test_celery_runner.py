"""EVALSITE_CODE_RUNNER=celery with a real worker process on the ``code`` queue and a real Redis
(broker and result backend), plus the start-up messages about the runner."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from evalsite.celery import app
from evalsite.errors import InvalidInput
from evaluators.apps import report_code_runner
from evaluators.sandbox import register_runner, sandbox_status
from evaluators.sandbox.pool import registry
from evaluators.sandbox_celery import CeleryRunner
from evaluators.services import (
    evaluation_invoke,
    evaluations_invoke_many,
    evaluator_create,
    session_evaluations_invoke_many,
)
from runs.applications import application_create
from runs.engine import run_create, run_start
from runs.models import Result, Run
from tests.runs.factories import CAPITALS, make_testset
from tests.workers import Broker, database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

V2 = "def evaluate(inputs, outputs, trace):\n    {body}\n"


@contextmanager
def _using(broker: Broker):
    """Publish to, and read results from, ``broker`` (a Redis of the test's own)."""
    names = ("broker_url", "broker_read_url", "broker_write_url", "result_backend")
    original = {name: app.conf[name] for name in names}
    app.conf.update(dict.fromkeys(names, broker.url))
    _reconnect()
    try:
        yield broker
    finally:
        app.conf.update(original)
        _reconnect()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = Broker(tmp_path_factory.mktemp("broker"))
    with _using(broker):
        yield broker
    broker.stop()


@pytest.fixture
def empty_broker(tmp_path):
    """A broker no worker listens to."""
    broker = Broker(tmp_path)
    with _using(broker):
        yield broker
    broker.stop()


def _reconnect() -> None:
    app._pool = None
    app.amqp._producer_pool = None
    app._backend_cache = None
    app._local.__dict__.pop("backend", None)


@pytest.fixture
def celery_runner(settings):
    """The web side uses the celery runner; a short pickup window keeps "no worker" quick."""
    settings.EVALSITE_CODE_RUNNER = "celery"
    register_runner("celery", CeleryRunner(pickup_s=3.0, status_s=3.0, status_ttl_s=0))
    yield
    register_runner("celery", CeleryRunner())


class Worker:
    """``celery -A evalsite worker`` in its own session, against the test database and broker."""

    def __init__(self, broker: Broker, tmp_path: Path, queues: str):
        self.log = tmp_path / f"worker-{queues.replace(',', '-')}.log"
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": broker.url,
            "REDIS_URL": broker.url,
            # The same setting as the web side: the worker must still run the code itself.
            "EVALSITE_CODE_RUNNER": "celery",
        }
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "evalsite",
                    "worker",
                    "-Q",
                    queues,
                    "--concurrency",
                    "2",
                    "-l",
                    "info",
                    "--without-mingle",
                    "--without-gossip",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while "ready." not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def code_worker(broker, tmp_path_factory, django_db_setup):
    worker = Worker(broker, tmp_path_factory.mktemp("worker"), "code")
    yield worker
    worker.stop()


def _invoke(code: str, runtime: str = "python", **kwargs):
    parameters = {"runtime": runtime, "code": code, "version": "2"}
    return evaluation_invoke(kind="code", parameters=parameters, **kwargs)


def test_it_runs_a_batch_on_a_worker_of_the_code_queue(celery_runner, code_worker, project):
    code = V2.format(
        body="print('checked', outputs)\n    return outputs == inputs['correct_answer']"
    )
    items = [({"correct_answer": "Paris"}, answer, None) for answer in ("Paris", "Lyon")]
    results = evaluations_invoke_many(
        kind="code", parameters={"code": code, "version": "2"}, items=items, project=project
    )
    assert [r.outputs for r in results] == [{"success": True}, {"success": False}]
    assert "checked Lyon" in results[1].logs
    assert f"{project.pk}/python" not in registry().stats()  # no pool in this process
    assert "code_run_batch" in code_worker.log.read_text()


def test_it_runs_a_session_batch_on_a_worker_of_the_code_queue(celery_runner, code_worker, project):
    code = "def evaluate_session(inputs, outputs, session):\n    return len(session['traces'])\n"
    session = {"session_id": "s", "traces": [{"spans": {}}] * 3, "messages": []}
    [result] = session_evaluations_invoke_many(
        kind="code",
        parameters={"code": code, "version": "2"},
        items=[({}, "bye", session)],
        project=project,
    )
    assert result.outputs == {"score": 3, "success": True}
    assert f"{project.pk}/python" not in registry().stats()  # it ran on the code worker


def test_it_brings_back_errors_and_unrepresentable_values(celery_runner, code_worker):
    crashed = _invoke(V2.format(body="raise ValueError('bad input')"), inputs={}, outputs="x")
    assert crashed.status == "error" and "bad input" in crashed.error["message"]
    assert "ValueError" in crashed.error["stacktrace"]
    nan = _invoke("function evaluate() { return NaN; }", "javascript", inputs={}, outputs="x")
    assert nan.error["code"] == "invalid_return" and "NaN" in nan.error["message"]


def test_it_checks_code_on_the_worker_before_saving(celery_runner, code_worker, project):
    code = "def evaluate(inputs, outputs, trace):\n    return (1 +\n"
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(project=project, kind="code", name="Broken", parameters={"code": code})
    assert "line" in caught.value.fields["parameters.code"][0]
    assert not project.evaluators.exists()


def test_it_reports_the_sandbox_of_the_code_worker(celery_runner, code_worker):
    status = sandbox_status()
    assert status["available"] is True, status
    assert (status["runner"], status["remote"]["runner"]) == ("celery", "sandbox")


def test_it_fails_loudly_when_no_worker_takes_the_batch(celery_runner, empty_broker):
    started = time.monotonic()
    result = _invoke(V2.format(body="return True"), inputs={}, outputs="x")
    assert result.status == "error" and result.error["code"] == "sandbox_unavailable"
    assert "no worker on the 'code' queue took the work within 3 s" in result.error["message"]
    assert time.monotonic() - started < 15
    status = sandbox_status()
    assert status["available"] is False and "no worker" in status["problem"]


def test_it_runs_a_run_whose_code_evaluator_waits_for_the_code_queue(
    celery_runner, empty_broker, tmp_path, project
):
    # One worker serves both sides: a runs chunk waits for a code batch on another slot.
    worker = Worker(empty_broker, tmp_path, "default,runs,code")
    try:
        version = make_testset(project, CAPITALS)
        column = application_create(
            project=project, name="Column", kind="column", config={"outputs_column": "outputs"}
        )
        code = evaluator_create(project=project, kind="code", name="Code exact").head
        run = run_create(project=project, testset_version=version, application=column,
                         revisions=[code])  # fmt: skip
        run_start(run=run)
        deadline = time.monotonic() + 90
        while Run.objects.get(pk=run.pk).status in ("pending", "queued", "running"):
            assert time.monotonic() < deadline, worker.log.read_text()
            time.sleep(0.3)
        results = Result.objects.filter(run=run, step_key=f"evaluator-{code.slug}")
        assert {r.status for r in results} == {"success"}, [r.error for r in results]
        assert results.count() == len(CAPITALS)
    finally:
        worker.stop()


# --- start-up messages ------------------------------------------------------------------------


def test_it_logs_an_error_at_start_up_when_bwrap_is_missing(settings, caplog):
    settings.EVALSITE_CODE_RUNNER = "sandbox"
    settings.EVALSITE_SANDBOX_BWRAP = "/nowhere/bwrap"
    with caplog.at_level(logging.INFO, logger="evaluators"):
        report_code_runner()
    [record] = [r for r in caplog.records if r.name == "evaluators"]
    assert record.levelno == logging.ERROR
    assert "bwrap not found at /nowhere/bwrap" in record.getMessage()


def test_it_logs_a_loud_warning_at_start_up_for_the_inprocess_runner(settings, caplog):
    settings.EVALSITE_CODE_RUNNER = "inprocess"
    with caplog.at_level(logging.INFO, logger="evaluators"):
        report_code_runner()
    [record] = [r for r in caplog.records if r.name == "evaluators"]
    assert record.levelno == logging.WARNING and "without any sandbox" in record.getMessage()


def test_it_says_nothing_alarming_when_the_sandbox_works(settings, caplog):
    settings.EVALSITE_CODE_RUNNER = "sandbox"
    with caplog.at_level(logging.INFO, logger="evaluators"):
        report_code_runner()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
