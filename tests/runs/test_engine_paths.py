"""Every path through the run engine's units: cancelling mid-run, a unit failed by the sweeper
after killing its workers, a unit that crashes, repeats, refusals on a closed run, retrying
cells that really failed, duplicated messages, the llm lane, and traces sent back by an HTTP
application. Applications and judges are real servers on 127.0.0.1 (tests/servers.py,
tests/llm_server.py); units are claimed by calling the engine as a worker would."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from evalsite.errors import InvalidInput
from evaluators.services import evaluator_create
from runs import tasks
from runs.applications import application_create
from runs.engine import (
    results_log,
    run_add_evaluators,
    run_cancel,
    run_close,
    run_create,
    run_dispatch,
    run_execute_inline,
    run_retry_failed,
    run_start,
    scenario_annotate,
    scenarios_add,
    unit_claim,
    unit_process,
    unit_work,
    units_sweep,
)
from runs.models import Annotation, Application, Result, Run, RunStep, Scenario, Span, WorkUnit
from tests.runs.factories import CAPITALS, make_testset
from tests.servers import Reply

CAPITAL = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid"}
EXACT = "evaluator-exact-v1"


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline in these tests."""


@pytest.fixture
def allow_local(settings):
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True


@pytest.fixture
def capital_server(http_server, allow_local):
    """An HTTP application answering each country's capital."""
    http_server.handler = lambda request: Reply(
        200, {"outputs": CAPITAL[request.json()["inputs"]["country"]]}
    )
    return http_server


def http_app(project, url: str, **config) -> Application:
    return application_create(
        project=project, name="Bot", kind="http", config={"url": url, "retries": 0, **config}
    )


def dispatched(run: Run) -> int:
    """Start the run and plan its units as the dispatch task would; no message is delivered,
    so the test claims the units itself, one ``unit_work`` call per message."""
    run_start(run=run)
    return run_dispatch(run_id=run.pk)


def units(run: Run, lane: str = "runs") -> list[tuple]:
    return list(
        WorkUnit.objects.filter(run=run, lane=lane)
        .order_by("first")
        .values_list("first", "last", "status")
    )


def countries_called(server) -> Counter:
    return Counter(r.json()["inputs"]["country"] for r in server.requests)


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


# --- cancelling ---------------------------------------------------------------------------------


def test_it_cancels_mid_run_and_computes_nothing_more(project, column_app, exact, settings):
    settings.EVALSITE_RUN_CHUNK_SIZE = 2
    version = make_testset(project, [dict(CAPITALS[i % 4], n=i) for i in range(6)], slug="six")
    run = run_create(
        project=project, testset_version=version, application=column_app, revisions=[exact]
    )
    assert dispatched(run) == 3
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) == 2 * 3

    run_cancel(run=run)
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) is None
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) is None
    units_sweep()

    assert units(run) == [(0, 1, "done"), (2, 3, "cancelled"), (4, 5, "cancelled")]
    statuses = dict(Scenario.objects.filter(run=run).values_list("index", "status"))
    assert statuses == {0: "success", 1: "success"} | {i: "cancelled" for i in range(2, 6)}
    assert Result.objects.filter(run=run).count() == 6
    assert set(Result.objects.filter(run=run).values_list("scenario__index", flat=True)) == {0, 1}
    run = fresh(run)
    assert run.status == "cancelled" and run.finished_at is not None
    assert (run.done_cells, run.error_cells) == (6, 0)


def test_it_ends_a_unit_held_at_cancel_time_without_computing_it(
    project, capitals, capital_server, exact
):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=http_app(project, capital_server.url),
        revisions=[exact],
    )
    dispatched(run)
    held = unit_claim(run_id=run.pk, lane="runs", owner="worker-1")
    run_cancel(run=run)

    assert unit_process(unit=held, owner="worker-1") == 0
    assert capital_server.requests == []
    assert units(run) == [(0, 3, "cancelled")]
    assert not Result.objects.filter(run=run).exists()
    assert fresh(run).status == "cancelled"


# --- failing units ------------------------------------------------------------------------------


def expire(unit: WorkUnit) -> None:
    """The worker holding the unit died: its lease ran out. PostgreSQL's now() is the test
    transaction's start, so the expiry goes well before it."""
    WorkUnit.objects.filter(pk=unit.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))


def test_it_fails_a_unit_that_kept_killing_its_worker_and_the_run_still_ends(
    project, capitals, column_app, exact, settings
):
    settings.EVALSITE_RUN_CHUNK_SIZE = 2
    settings.EVALSITE_UNIT_MAX_ATTEMPTS = 3
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    assert dispatched(run) == 2
    sweeps = []
    for attempt in range(3):
        unit = unit_claim(run_id=run.pk, lane="runs", owner=f"doomed-{attempt}")
        assert (unit.first, unit.attempts) == (0, attempt + 1)
        expire(unit)
        sweeps.append(units_sweep())
    assert [(s["requeued"], s["failed"]) for s in sweeps] == [(1, 0), (1, 0), (0, 1)]

    failed = WorkUnit.objects.get(run=run, first=0)
    assert failed.status == "failed" and failed.error["code"] == "engine_error"
    cells = Result.objects.filter(run=run, scenario__index__in=(0, 1))
    assert cells.count() == 2 * 3
    assert {(c.status, c.error["code"], c.error["type"]) for c in cells} == {
        ("error", "engine_error", "WorkerLost")
    }
    assert fresh(run).status == "running"  # the other unit is still to come

    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) == 2 * 3
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) is None
    run = fresh(run)
    assert run.status == "errors"
    assert (run.done_cells, run.error_cells, run.total_cells) == (12, 6, 12)
    judged = Result.objects.filter(run=run, annotation__isnull=False)
    assert set(judged.values_list("scenario__index", flat=True)) == {2, 3}  # never 0 or 1
    stats = run.metrics.get(scenario=None).data[EXACT]["success"]
    assert (stats["count"], stats["errors"]) == (2, 2)  # Italy and Spain judged, no score of 0


def test_it_records_a_crash_while_computing_a_unit_and_the_run_still_ends(
    project, capitals, capital_server, exact, django_capture_on_commit_callbacks
):
    app = http_app(project, capital_server.url)
    run = run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    # A configuration stored before its schema changed no longer validates: invoking the
    # application raises (a bug, not a blip), inside the unit's computation.
    Application.objects.filter(pk=app.pk).update(config={**app.config, "url": "not a url"})
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)

    assert capital_server.requests == []
    [unit] = WorkUnit.objects.filter(run=run)
    assert unit.status == "failed" and unit.error["type"] == "ValidationError"
    cells = Result.objects.filter(run=run)
    assert cells.count() == 4 * 3
    assert {(c.status, c.error["code"]) for c in cells} == {("error", "engine_error")}
    assert all("ValidationError" in c.error["stacktrace"] for c in cells)
    run = fresh(run)
    assert run.status == "failure" and run.finished_at is not None
    assert (run.done_cells, run.error_cells) == (12, 12)
    assert run.metrics.get(scenario=None).data[EXACT]["success"]["errors"] == 4


# --- repeats ------------------------------------------------------------------------------------


def test_it_calls_the_application_once_per_scenario_and_repeat(
    project, capitals, capital_server, exact, django_capture_on_commit_callbacks
):
    app = http_app(project, capital_server.url)
    run = run_create(
        project=project, testset_version=capitals, application=app, revisions=[exact], repeats=3
    )
    assert run.total_cells == 4 * (1 + 3 * 2)
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)

    assert countries_called(capital_server) == {country: 3 for country in CAPITAL}
    cells = list(
        Result.objects.filter(run=run).values_list("scenario__index", "step_key", "repeat_idx")
    )
    inputs = {(i, "testset-capitals", 0) for i in range(4)}
    computed = {
        (i, key, r) for i in range(4) for key in ("application-bot", EXACT) for r in range(3)
    }
    assert len(cells) == len(set(cells)) == 28
    assert set(cells) == inputs | computed
    invocations = Result.objects.filter(run=run, step_key="application-bot")
    assert len(set(invocations.values_list("trace_id", flat=True))) == 12
    for judged in Result.objects.filter(run=run, step_key=EXACT).select_related("annotation"):
        invoked = invocations.get(scenario=judged.scenario_id, repeat_idx=judged.repeat_idx)
        assert judged.annotation.trace_id == invoked.trace_id  # each repeat judged on its own
    run = fresh(run)
    assert run.status == "success" and (run.done_cells, run.error_cells) == (28, 0)
    stats = run.metrics.get(scenario=None).data[EXACT]["success"]
    assert (stats["count"], stats["true"], stats["rate"]) == (12, 12, 1.0)


# --- a closed run -------------------------------------------------------------------------------


def snapshot(run: Run) -> dict:
    fields = ("status", "total_cells", "done_cells", "error_cells", "scenario_count", "mappings")
    return {
        "run": Run.objects.filter(pk=run.pk).values(*fields).get(),
        "results": sorted(
            Result.objects.filter(run=run).values_list(
                "scenario_id", "step_key", "repeat_idx", "status", "annotation_id", "updated_at"
            )
        ),
        "annotations": sorted(
            Annotation.objects.filter(project=run.project).values_list("pk", "outputs", "history")
        ),
        "scenarios": sorted(Scenario.objects.filter(run=run).values_list("pk", "status")),
        "steps": sorted(RunStep.objects.filter(run=run).values_list("key", flat=True)),
        "units": WorkUnit.objects.filter(run=run).count(),
    }


CLOSED_RUN_WRITES = {
    "retry": lambda run, exact, polite: run_retry_failed(run=run),
    "add-evaluators": lambda run, exact, polite: run_add_evaluators(run=run, revisions=[polite]),
    "log-results": lambda run, exact, polite: results_log(
        run=run, entries=[{"scenario": 0, "step_key": EXACT, "outputs": {"success": False}}]
    ),
    "add-scenarios": lambda run, exact, polite: scenarios_add(
        run=run, rows=[{"inputs": {"country": "Peru"}}]
    ),
    "annotate": lambda run, exact, polite: scenario_annotate(
        run=run, scenario=run.scenarios.get(index=0), revision=exact, outputs={"success": False}
    ),
}


@pytest.mark.parametrize("write", CLOSED_RUN_WRITES.values(), ids=CLOSED_RUN_WRITES.keys())
def test_it_refuses_writes_to_a_closed_run_and_changes_nothing(project, column_app, exact, write):
    rows = [*CAPITALS[:3], {"country": "Spain", "outputs": "Madrid"}]  # Spain: no ground truth
    version = make_testset(project, rows, slug="partial")
    polite = evaluator_create(project=project, kind="regex", name="Polite", preset="no_apology")
    run = run_create(
        project=project, testset_version=version, application=column_app, revisions=[exact]
    )
    run = run_close(run=run_execute_inline(run=run))
    assert run.closed and run.status == "errors"
    before = snapshot(run)

    with pytest.raises(InvalidInput) as caught:
        write(run, exact, polite.head)
    assert caught.value.fields == {"run": ["This run is closed and read-only."]}
    assert snapshot(run) == before


# --- retrying -----------------------------------------------------------------------------------


def test_it_retries_cells_that_really_failed_and_calls_only_those_again(
    project, capitals, http_server, allow_local, exact, django_capture_on_commit_callbacks
):
    seen: Counter = Counter()
    lock = threading.Lock()

    def down_once_for_italy_and_spain(request):
        country = request.json()["inputs"]["country"]
        with lock:
            seen[country] += 1
            first = seen[country] == 1
        if first and country in ("Italy", "Spain"):
            return Reply(500, "down")
        return Reply(200, {"outputs": CAPITAL[country]})

    http_server.handler = down_once_for_italy_and_spain
    app = http_app(project, http_server.url)
    run = run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    run = fresh(run)
    assert run.status == "errors" and (run.done_cells, run.error_cells) == (12, 2)
    failed = Result.objects.filter(run=run, scenario__index__in=(2, 3))
    assert set(failed.filter(step_key="application-bot").values_list("status", flat=True)) == {
        "error"
    }
    assert set(failed.filter(step_key=EXACT).values_list("status", flat=True)) == {"skipped"}

    with django_capture_on_commit_callbacks() as requeue:
        assert run_retry_failed(run=run) == 4  # two invocations, the two evaluations they skipped
    waiting = fresh(run)
    assert (waiting.status, waiting.done_cells, waiting.error_cells) == ("queued", 8, 0)
    with django_capture_on_commit_callbacks(execute=True):
        for callback in requeue:
            callback()

    assert seen == {"France": 1, "Germany": 1, "Italy": 2, "Spain": 2}
    run = fresh(run)
    assert run.status == "success"
    assert (run.done_cells, run.error_cells, run.total_cells) == (12, 0, 12)
    assert set(Result.objects.filter(run=run).values_list("status", flat=True)) == {"success"}
    stats = run.metrics.get(scenario=None).data[EXACT]["success"]
    assert (stats["count"], stats["rate"], stats["errors"]) == (4, 1.0, 0)


# --- duplicated messages ------------------------------------------------------------------------


def test_it_does_nothing_for_a_duplicated_message_after_the_run_ended(
    project, capitals, capital_server, exact, django_capture_on_commit_callbacks
):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=http_app(project, capital_server.url),
        revisions=[exact],
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    calls = len(capital_server.requests)
    assert calls == 4
    before = snapshot(run)

    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.unit_work.delay(run.pk, "runs").get() is None  # redelivered by the broker
        assert unit_work(run_id=run.pk, lane="runs") is None
        assert tasks.run_dispatch.delay(run.pk).get() == 0

    assert len(capital_server.requests) == calls
    assert snapshot(run) == before


def test_it_does_not_claim_a_unit_another_worker_holds(project, capitals, capital_server, exact):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=http_app(project, capital_server.url),
        revisions=[exact],
    )
    dispatched(run)
    held = unit_claim(run_id=run.pk, lane="runs", owner="other")

    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) is None
    assert capital_server.requests == []
    assert not Result.objects.filter(run=run).exists()
    held.refresh_from_db()
    assert (held.status, held.owner, held.attempts) == ("leased", "other", 1)

    assert unit_process(unit=held, owner="other") == 4 * 3  # its holder computes it, once
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) is None
    assert len(capital_server.requests) == 4
    assert fresh(run).status == "success"


# --- the llm lane -------------------------------------------------------------------------------


def test_it_sends_a_judge_step_to_the_llm_lane_after_the_invocations(
    project, capitals, column_app, exact, llm_server, llm_connection, settings
):
    settings.EVALSITE_RUN_CHUNK_SIZE = 2
    judge = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Judge",
        preset="correctness",
        parameters={"connection": llm_connection.slug},
    ).head
    judge_key = f"evaluator-{judge.slug}"
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact, judge]
    )
    assert dispatched(run) == 2
    assert units(run, "runs") == [(0, 1, "queued"), (2, 3, "queued")]
    assert units(run, "llm") == [(0, 1, "waiting"), (2, 3, "waiting")]
    assert {tuple(u.step_keys) for u in WorkUnit.objects.filter(run=run, lane="runs")} == {(EXACT,)}
    assert {tuple(u.step_keys) for u in WorkUnit.objects.filter(run=run, lane="llm")} == {
        (judge_key,)
    }

    assert unit_work(run_id=run.pk, lane="llm", heartbeat=False) is None  # nothing invoked yet
    assert llm_server.calls == []
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) == 2 * 3
    assert units(run, "llm") == [(0, 1, "queued"), (2, 3, "waiting")]
    assert unit_work(run_id=run.pk, lane="llm", heartbeat=False) == 2
    assert unit_work(run_id=run.pk, lane="llm", heartbeat=False) is None
    assert len(llm_server.calls) == 2
    assert unit_work(run_id=run.pk, lane="runs", heartbeat=False) == 2 * 3
    assert unit_work(run_id=run.pk, lane="llm", heartbeat=False) == 2

    assert unit_work(run_id=run.pk, lane="llm", heartbeat=False) is None  # a duplicated message
    prompts = [call.json()["messages"][-1]["content"] for call in llm_server.calls]
    assert len(prompts) == 4
    references = Counter(
        capital for p in prompts for capital in CAPITAL.values() if f"answer:\n{capital}\n" in p
    )
    assert references == {capital: 1 for capital in CAPITAL.values()}  # one call per scenario
    judged = Result.objects.filter(run=run, step_key=judge_key, status="success")
    assert judged.count() == 4
    run = fresh(run)
    assert run.status == "success" and run.done_cells == run.total_cells == 4 * 4


# --- traces sent back by the application -------------------------------------------------------


def test_it_stores_the_trace_an_http_application_returns(
    project, capitals, http_server, allow_local, exact, django_capture_on_commit_callbacks
):
    sent: dict[str, str] = {}

    def traced(request):
        inputs = request.json()["inputs"]
        answer = CAPITAL[inputs["country"]]
        trace_id, root, child = uuid.uuid4().hex, uuid.uuid4().hex[:16], uuid.uuid4().hex[:16]
        sent[inputs["country"]] = trace_id
        lookup = {
            "span_id": child,
            "parent_id": root,
            "name": "lookup",
            "kind": "tool",
            "start_time": "2025-01-01T00:00:00.100Z",
            "end_time": "2025-01-01T00:00:00.200Z",
            "status": "ok",
            "attributes": {"ag": {"data": {"inputs": inputs, "outputs": answer}}},
            "children": {},
        }
        span = {
            "span_id": root,
            "parent_id": None,
            "name": "capital-bot",
            "kind": "workflow",
            "start_time": "2025-01-01T00:00:00Z",
            "end_time": "2025-01-01T00:00:00.300Z",
            "status": "ok",
            "attributes": {
                "ag": {
                    "data": {"inputs": inputs, "outputs": answer},
                    "metrics": {"acc": {"tokens": {"total": 42}}},
                }
            },
            "children": {child: lookup},
        }
        body = {"answer": answer, "debug": {"trace": {"trace_id": trace_id, "spans": {root: span}}}}
        return Reply(200, body)

    http_server.handler = traced
    app = http_app(project, http_server.url, outputs_path="answer", trace_path="debug.trace")
    run = run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)

    assert fresh(run).status == "success"
    invocations = Result.objects.filter(run=run, step_key="application-bot").select_related(
        "trace", "scenario"
    )
    assert {r.scenario.inputs["country"]: r.trace.trace_id for r in invocations} == sent
    for result in invocations:
        trace = result.trace
        assert (trace.name, trace.span_count, trace.tokens) == ("capital-bot", 2, 42)
        names = set(Span.objects.filter(trace=trace).values_list("name", flat=True))
        assert names == {"capital-bot", "lookup"}
    judged = Result.objects.filter(run=run, step_key=EXACT).select_related("annotation__trace")
    assert {r.annotation.trace.trace_id for r in judged} == set(sent.values())
    assert all(r.annotation.outputs["success"] for r in judged)


def trace_of(inputs: dict, outputs, trace_id: str = "") -> dict:
    """A one-span trace in the contract shape, as an instrumented application returns it."""
    span_id = uuid.uuid4().hex[:16]
    span = {
        "span_id": span_id,
        "name": "capital-bot",
        "kind": "workflow",
        "start_time": "2025-01-01T00:00:00Z",
        "end_time": "2025-01-01T00:00:00.300Z",
        "status": "ok",
        "attributes": {"ag": {"data": {"inputs": inputs, "outputs": outputs}}},
        "children": {},
    }
    return {"trace_id": trace_id or uuid.uuid4().hex, "spans": {span_id: span}}


def test_it_keeps_the_other_scenarios_of_a_unit_when_one_returns_a_malformed_trace(
    project, capitals, http_server, allow_local, exact, django_capture_on_commit_callbacks
):
    def answer(request):
        inputs = request.json()["inputs"]
        trace = trace_of(inputs, CAPITAL[inputs["country"]])
        if inputs["country"] == "Spain":
            del trace["trace_id"]  # "spans" is there, so _from_response takes it as a trace
        return Reply(200, {"outputs": CAPITAL[inputs["country"]], "trace": trace})

    http_server.handler = answer
    app = http_app(project, http_server.url, trace_path="trace")
    run = run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)

    others = Result.objects.filter(run=run, scenario__index__in=(0, 1, 2))
    assert set(others.values_list("status", flat=True)) == {"success"}
    assert not WorkUnit.objects.filter(run=run, status="failed").exists()


def test_it_accepts_a_returned_trace_the_application_already_exported(
    project, capitals, http_server, allow_local, exact, django_capture_on_commit_callbacks
):
    from runs.traces import trace_ingest

    exported = trace_of({"country": "Spain"}, "Madrid")
    trace_ingest(project=project, spans=[exported])

    def answer(request):
        inputs = request.json()["inputs"]
        country = inputs["country"]
        trace = exported if country == "Spain" else trace_of(inputs, CAPITAL[country])
        return Reply(200, {"outputs": CAPITAL[country], "trace": trace})

    http_server.handler = answer
    app = http_app(project, http_server.url, trace_path="trace")
    run = run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)

    assert fresh(run).status == "success"
    spain = Result.objects.get(run=run, step_key="application-bot", scenario__index=3)
    assert spain.trace.trace_id == exported["trace_id"]


def test_it_judges_the_same_outputs_when_an_evaluator_is_added_later(
    project, capitals, http_server, allow_local, exact, django_capture_on_commit_callbacks
):
    def answer(request):
        inputs = request.json()["inputs"]
        capital = CAPITAL[inputs["country"]]
        # The application's own trace records its whole reply; outputs_path picks the answer.
        trace = trace_of(inputs, {"answer": capital, "model": "bot-1"})
        return Reply(200, {"answer": capital, "trace": trace})

    http_server.handler = answer
    app = http_app(project, http_server.url, outputs_path="answer", trace_path="trace")
    run = run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    later = evaluator_create(project=project, kind="exact_match", name="Exact again").head
    with django_capture_on_commit_callbacks(execute=True):
        run_add_evaluators(run=fresh(run), revisions=[later])

    def verdicts(step_key):
        results = Result.objects.filter(run=run, step_key=step_key).select_related("annotation")
        return {r.scenario_id: r.annotation.outputs["success"] for r in results}

    assert verdicts(EXACT) == {s.pk: True for s in run.scenarios.all()}
    assert verdicts(f"evaluator-{later.slug}") == verdicts(EXACT)
