"""Online evaluation: matching, deterministic sampling, evaluation of new traces shortly after
ingestion, never twice, backfill, pause, buckets, isolation. Celery runs inline (eager);
tests/runs/test_online_worker.py does it with a real worker process."""

from __future__ import annotations

import socket
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError

from evalsite.errors import InvalidInput
from evalsite.redis_client import client as redis_client
from evalsite.redis_client import site_key
from evaluators.services import evaluator_create
from runs import metrics, online, tasks
from runs.engine import unit_claim
from runs.models import Annotation, Result, RunMetrics, Scenario, Trace, WorkUnit
from runs.online import (
    online_backfill,
    online_backfill_progress,
    online_dispatch,
    online_evaluate_traces,
    online_rule_create,
    online_rule_matches,
    online_rule_pause,
    online_rule_resume,
    online_sampled,
    online_units_plan,
)
from runs.queue import online_dispatch_pending, online_dispatch_sweep, online_dispatch_take
from runs.traces import trace_ingest, trace_record

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline in these tests."""


@pytest.fixture
def paris(project):
    return evaluator_create(
        project=project, kind="regex", name="Says Paris", parameters={"pattern": "Paris"}
    ).head


def root(trace_id, *, name="capital_qa", start=T0, outputs="Paris", env="prod", **extra):
    return {
        "trace_id": trace_id,
        "span_id": "root",
        "name": name,
        "kind": "workflow",
        "start_time": start.isoformat(),
        "end_time": (start + timedelta(seconds=1)).isoformat(),
        "attributes": {
            "ag": {
                "data": {"inputs": {"country": "France"}, "outputs": outputs},
                "meta": {"env": env},
            },
            **extra,
        },
    }


def child(trace_id, *, start=T0, model="gpt-4o-mini"):
    return {
        "trace_id": trace_id,
        "span_id": "chat",
        "parent_id": "root",
        "name": "chat",
        "kind": "llm",
        "start_time": (start + timedelta(milliseconds=100)).isoformat(),
        "end_time": (start + timedelta(milliseconds=900)).isoformat(),
        "attributes": {"gen_ai.request.model": model, "gen_ai.usage.input_tokens": 42},
    }


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ingest(project, capture, *spans):
    with capture(execute=True):
        return trace_ingest(project=project, spans=list(spans))


def evaluated(rule) -> set[str]:
    return set(Scenario.objects.filter(run=rule.run).values_list("trace__trace_id", flat=True))


# --- matching -----------------------------------------------------------------------------------


def test_it_matches_by_root_name_attributes_and_time(project, paris):
    rule = online_rule_create(
        project=project,
        name="Prod capital QA",
        revision=paris,
        filter={
            "name": "capital_qa",
            "attributes": {"ag.meta.env": "prod", "gen_ai.request.model": "gpt-4o-mini"},
            "since": "2026-11-20T09:00:00Z",
            "until": "2026-11-20T12:00:00Z",
        },
        active=False,  # nothing queued: only matching is under test
    )
    trace_ingest(
        project=project,
        spans=[
            root("t-match"),
            child("t-match"),
            root("t-other-name", name="summarise"),
            child("t-other-name"),
            root("t-staging", env="staging"),
            child("t-staging"),
            root("t-other-model"),
            child("t-other-model", model="gpt-4o"),
            root("t-too-late", start=T0 + timedelta(hours=3)),
            child("t-too-late", start=T0 + timedelta(hours=3)),
            child("t-no-root-yet"),  # its root has not arrived: it waits
        ],
    )
    trace_record(
        project=project, name="capital_qa", inputs={}, outputs="Paris", source="invocation"
    )
    matched = online_rule_matches(rule=rule)
    assert set(matched.values_list("trace_id", flat=True)) == {"t-match"}


def test_it_matches_any_json_value_of_an_attribute(project, paris):
    rule = online_rule_create(
        project=project,
        name="Retries",
        revision=paris,
        filter={"attributes": {"app.retries": 2, "app.cached": True}},
        active=False,
    )
    trace_ingest(
        project=project,
        spans=[
            root("t-yes", **{"app.retries": 2, "app.cached": True}),
            root("t-no", **{"app.retries": 3, "app.cached": True}),
        ],
    )
    assert list(online_rule_matches(rule=rule).values_list("trace_id", flat=True)) == ["t-yes"]


def test_it_refuses_a_bad_filter_naming_the_field(project, paris):
    with pytest.raises(InvalidInput) as caught:
        online_rule_create(
            project=project,
            name="Bad",
            revision=paris,
            filter={"since": "2026-11-21T00:00:00Z", "until": "2026-11-20T00:00:00Z"},
        )
    assert "filter" in caught.value.fields
    with pytest.raises(InvalidInput) as caught:
        online_rule_create(project=project, name="Bad", revision=paris, sampling_rate=1.5)
    assert "sampling_rate" in caught.value.fields


# --- sampling -----------------------------------------------------------------------------------


def test_it_samples_deterministically_by_trace_id(project, paris):
    ids = [uuid.UUID(int=i * 7919 + 1).hex for i in range(2000)]
    first = [online_sampled(trace_id, 0.25) for trace_id in ids]
    assert first == [online_sampled(trace_id, 0.25) for trace_id in ids]  # always in or out
    assert 0.22 * 2000 < sum(first) < 0.28 * 2000
    # A trace in a 10 % sample is in every larger one.
    assert all(online_sampled(t, 0.5) for t in ids if online_sampled(t, 0.1))
    assert all(online_sampled(t, 1.0) for t in ids)
    # PostgreSQL decides exactly the same (backfills filter in SQL).
    trace_ingest(project=project, spans=[root(trace_id) for trace_id in ids])
    rule = online_rule_create(
        project=project, name="Quarter", revision=paris, sampling_rate=0.25, active=False
    )
    in_sql = set(online.rule_candidates(rule).values_list("trace_id", flat=True))
    assert in_sql == {t for t, sampled in zip(ids, first, strict=True) if sampled}


def test_it_evaluates_only_the_sampled_traces(project, paris, django_capture_on_commit_callbacks):
    rule = online_rule_create(project=project, name="Tenth", revision=paris, sampling_rate=0.1)
    ids = [f"trace-{i:04d}" for i in range(200)]
    ingest(project, django_capture_on_commit_callbacks, *[root(t) for t in ids])
    assert evaluated(rule) == {t for t in ids if online_sampled(t, 0.1)}
    assert 5 < len(evaluated(rule)) < 40


# --- new traces ---------------------------------------------------------------------------------


def test_it_evaluates_new_traces_shortly_after_ingestion(
    project, paris, django_capture_on_commit_callbacks
):
    rule = online_rule_create(
        project=project, name="Capital QA", revision=paris, filter={"name": "capital_qa"}
    )
    ingest(
        project,
        django_capture_on_commit_callbacks,
        root("t-good"),
        child("t-good"),
        root("t-bad", outputs="Lyon"),
        root("t-ignored", name="summarise"),
    )
    rule.run.refresh_from_db()
    assert evaluated(rule) == {"t-good", "t-bad"}
    scenario = Scenario.objects.get(run=rule.run, trace__trace_id="t-good")
    assert scenario.inputs == {"country": "France"}  # the root's ag.data.inputs
    assert scenario.status == "success"
    cells = {r.step_key: r for r in Result.objects.filter(scenario=scenario)}
    assert set(cells) == {"query-capital-qa", "evaluator-says-paris-v1"}
    assert cells["query-capital-qa"].trace.trace_id == "t-good"  # the input step points at it
    annotation = cells["evaluator-says-paris-v1"].annotation
    assert annotation.trace.trace_id == "t-good"  # the trace itself is annotated
    assert annotation.outputs == {"success": True}
    assert annotation.references["evaluator"] == {"id": paris.evaluator_id, "slug": "says-paris"}
    assert annotation.revision == paris
    bad = Annotation.objects.get(trace__trace_id="t-bad")
    assert bad.outputs == {"success": False}
    run = rule.run
    assert run.is_online and run.status == "running"
    assert (run.scenario_count, run.total_cells, run.done_cells) == (2, 4, 4)
    steps = {s.key: s for s in run.steps.all()}
    assert steps["query-capital-qa"].references == {"query": {"id": rule.pk, "slug": "capital-qa"}}
    assert steps["evaluator-says-paris-v1"].type == "annotation"
    stats = RunMetrics.objects.get(run=run, scenario=None, bucket_start=None).data
    assert stats["evaluator-says-paris-v1"]["success"]["rate"] == 0.5


@pytest.fixture
def dispatches(monkeypatch):
    """The dispatch messages sent, as (args, countdown), instead of running them."""
    sent = []
    monkeypatch.setattr(
        tasks.ingest_online_dispatch,
        "apply_async",
        lambda args, countdown: sent.append((args, countdown)),
    )
    return sent


def test_it_queues_the_match_a_few_seconds_after_commit(
    project, paris, settings, dispatches, django_capture_on_commit_callbacks
):
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 7
    with django_capture_on_commit_callbacks(execute=True):
        trace_ingest(project=project, spans=[root("t-1")])
    assert not dispatches  # no active rule: nothing queued
    online_rule_create(project=project, name="Any", revision=paris)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        traces = trace_ingest(project=project, spans=[root("t-2")])
    assert not dispatches  # only once the ingest commits
    for callback in callbacks:
        callback()
    assert dispatches == [((project.pk,), 7.0)]  # the trace waits in Redis for it
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 0
    assert online_dispatch_take(project.pk, "d1") == [traces[0].pk]


def test_a_dispatch_takes_only_the_traces_that_arrived_the_delay_ago(
    project, paris, settings, dispatches, django_capture_on_commit_callbacks
):
    # A dispatch queued by an earlier ingest runs when that ingest's traces are due: a trace
    # that joined just before must still wait its delay, for its other spans to arrive.
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 60
    online_rule_create(project=project, name="Any", revision=paris)
    [trace] = ingest(project, django_capture_on_commit_callbacks, root("t-1"))
    assert online_dispatch_take(project.pk, "early") == []
    [(args, countdown)] = dispatches[1:]  # the next dispatch, when the trace is due
    assert args == (project.pk,) and 59 < countdown <= 60
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 0
    assert online_dispatch_take(project.pk, "due") == [trace.pk]
    assert not online_dispatch_pending(project.pk)


def test_ingests_before_the_dispatch_starts_ride_along_with_it(
    project, paris, settings, dispatches, django_capture_on_commit_callbacks
):
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 0
    online_rule_create(project=project, name="Any", revision=paris)
    first = ingest(project, django_capture_on_commit_callbacks, root("t-1"))
    second = ingest(project, django_capture_on_commit_callbacks, root("t-2"))
    assert [args for args, _ in dispatches] == [(project.pk,)]  # one message for both
    assert online_dispatch_take(project.pk, "d1") == sorted([first[0].pk, second[0].pk])
    third = ingest(project, django_capture_on_commit_callbacks, root("t-3"))
    # The dispatch started: the next ingest queues the next one.
    assert [args for args, _ in dispatches] == [(project.pk,), (project.pk,)]
    assert online_dispatch_take(project.pk, "d2") == [third[0].pk]
    assert not online_dispatch_pending(project.pk)


def test_without_redis_each_ingest_sends_its_traces(
    project, paris, settings, dispatches, django_capture_on_commit_callbacks
):
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    online_rule_create(project=project, name="Any", revision=paris)
    first = ingest(project, django_capture_on_commit_callbacks, root("t-1"))
    second = ingest(project, django_capture_on_commit_callbacks, root("t-2"))
    assert [args for args, _ in dispatches] == [
        (project.pk, [first[0].pk]),
        (project.pk, [second[0].pk]),
    ]


def _a_dispatch_failing_once(project, paris, monkeypatch, capture, error):
    """A rule, a trace ingested for it, and its dispatch run once while matching raises
    ``error``; the rule."""
    rule = online_rule_create(project=project, name="Any", revision=paris)
    ingest(project, capture, root("t-1"))

    def broken(**kwargs):
        raise error

    monkeypatch.setattr(online, "online_dispatch", broken)
    with pytest.raises(type(error)):
        tasks.ingest_online_dispatch.run(project.pk)
    monkeypatch.undo()
    return rule


def test_a_dispatch_retried_after_a_transient_failure_takes_the_same_traces(
    project, paris, settings, monkeypatch, dispatches, django_capture_on_commit_callbacks
):
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 0
    gone = OperationalError("server gone")
    rule = _a_dispatch_failing_once(
        project, paris, monkeypatch, django_capture_on_commit_callbacks, gone
    )
    assert not evaluated(rule) and not online_dispatch_pending(project.pk)
    # The same dispatch again (Celery's retry, or the message redelivered after its worker
    # died): the traces it had taken, though nothing is pending any more.
    assert tasks.ingest_online_dispatch.run(project.pk) == 1
    assert evaluated(rule) == {"t-1"}


def test_a_dispatch_that_fails_for_good_drops_its_traces_as_a_lost_message_would(
    project, paris, settings, monkeypatch, dispatches, django_capture_on_commit_callbacks
):
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 0
    rule = _a_dispatch_failing_once(
        project, paris, monkeypatch, django_capture_on_commit_callbacks, RuntimeError("a bug")
    )
    # Not given back: a trace that always fails its dispatch must not hold up the others.
    assert tasks.ingest_online_dispatch.run(project.pk) == 0
    assert not evaluated(rule)
    with django_capture_on_commit_callbacks(execute=True):  # what a backfill is for
        online_backfill(rule=rule, since=T0 - timedelta(hours=1))
    assert evaluated(rule) == {"t-1"}


def test_the_sweep_queues_a_dispatch_for_traces_whose_message_was_lost(
    project, paris, settings, dispatches, django_capture_on_commit_callbacks
):
    online_rule_create(project=project, name="Any", revision=paris)
    ingest(project, django_capture_on_commit_callbacks, root("t-1"))
    assert online_dispatch_sweep() == 0  # a dispatch is queued: nothing to do
    redis_client().delete(site_key("online", "pending", project.pk, "queued"))  # it was lost
    assert online_dispatch_sweep() == 1
    assert dispatches[-1] == ((project.pk,), 0)
    assert online_dispatch_pending(project.pk)


def test_it_never_evaluates_a_trace_twice(project, paris, django_capture_on_commit_callbacks):
    rule = online_rule_create(project=project, name="Capital QA", revision=paris)
    # The spans of one trace arrive in two requests; each queues a dispatch.
    first = ingest(project, django_capture_on_commit_callbacks, root("t-1"))
    ingest(project, django_capture_on_commit_callbacks, child("t-1"))
    # The same dispatch delivered twice, and an evaluation asked for again.
    online_dispatch(project_id=project.pk, trace_ids=[first[0].pk])
    online_dispatch(project_id=project.pk, trace_ids=[first[0].pk])
    assert online_evaluate_traces(rule=rule, traces=first) == 0
    assert Scenario.objects.filter(run=rule.run).count() == 1
    assert Annotation.objects.filter(trace=first[0]).count() == 1
    assert Result.objects.filter(run=rule.run).count() == 2
    rule.run.refresh_from_db()
    assert (rule.run.scenario_count, rule.run.done_cells) == (1, 2)


def test_it_leaves_a_trace_being_evaluated_to_its_evaluator(project, paris):
    rule = online_rule_create(project=project, name="Capital QA", revision=paris, active=False)
    traces = trace_ingest(project=project, spans=[root("t-1")])
    rule = online_rule_resume(rule=rule)
    [unit] = online_units_plan(rule=rule, traces=traces)
    held = unit_claim(run_id=rule.run_id, lane=unit.lane, owner="another worker")
    assert held.pk == unit.pk  # another worker is evaluating it now
    assert online_evaluate_traces(rule=rule, traces=traces) == 0
    assert not Annotation.objects.exists()
    # That worker died: once its lease is over, the next delivery does the work, once.
    WorkUnit.objects.filter(pk=unit.pk).update(lease_expires_at=T0)
    assert online_evaluate_traces(rule=rule, traces=traces) == 1
    assert online_evaluate_traces(rule=rule, traces=traces) == 0
    assert Annotation.objects.count() == 1
    assert WorkUnit.objects.get(pk=unit.pk).status == "done"


def test_it_records_an_evaluator_error_as_an_error(project, django_capture_on_commit_callbacks):
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    rule = online_rule_create(project=project, name="Exact", revision=exact)
    ingest(project, django_capture_on_commit_callbacks, root("t-1"))  # no correct_answer
    result = Result.objects.get(run=rule.run, step_key="evaluator-exact-v1")
    assert result.status == "error" and result.annotation is None
    assert result.error["code"] == "missing_ground_truth"
    rule.run.refresh_from_db()
    assert rule.run.error_cells == 1 and rule.run.status == "running"


# --- backfill -----------------------------------------------------------------------------------


def test_it_backfills_past_traces_in_chunks(
    project, paris, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.EVALSITE_ONLINE_CHUNK_SIZE = 2
    trace_ingest(
        project=project,
        spans=[root(f"t-{i}", start=T0 + timedelta(minutes=10 * i)) for i in range(5)]
        + [root("t-old", start=T0 - timedelta(days=3)), root("t-skip", name="summarise")],
    )
    rule = online_rule_create(
        project=project, name="Capital QA", revision=paris, filter={"name": "capital_qa"}
    )
    assert evaluated(rule) == set()  # created after the traces: nothing yet
    calls = []
    real = online.online_evaluate_ids
    monkeypatch.setattr(online, "online_evaluate_ids", lambda **kw: calls.append(kw) or real(**kw))
    with django_capture_on_commit_callbacks(execute=True):
        progress = online_backfill(
            rule=rule, since=T0 - timedelta(hours=1), until=T0 + timedelta(hours=1)
        )
    assert (progress["total"], progress["queued"]) == (5, 5)
    assert [len(c["trace_ids"]) for c in calls] == [2, 2, 1]
    assert evaluated(rule) == {f"t-{i}" for i in range(5)}
    progress = online_backfill_progress(rule=rule)
    assert progress["evaluated"] == 5 and progress["finished"] and progress["percent"] == 100.0
    # Again over a wider window: only what is new is queued.
    with django_capture_on_commit_callbacks(execute=True):
        progress = online_backfill(rule=rule, since=T0 - timedelta(days=7))
    assert (progress["total"], progress["queued"]) == (6, 1)
    assert Annotation.objects.count() == 6


def test_it_shows_backfill_progress_while_chunks_are_pending(
    project, paris, django_capture_on_commit_callbacks
):
    trace_ingest(project=project, spans=[root(f"t-{i}") for i in range(3)])
    rule = online_rule_create(project=project, name="Capital QA", revision=paris)
    with django_capture_on_commit_callbacks(execute=False):
        online_backfill(rule=rule, since=T0 - timedelta(hours=1))  # queued, not yet run
    progress = online_backfill_progress(rule=rule)
    assert (progress["evaluated"], progress["total"], progress["finished"]) == (0, 3, False)


# --- paused rules -------------------------------------------------------------------------------


def test_it_evaluates_nothing_while_paused(project, paris, django_capture_on_commit_callbacks):
    rule = online_rule_create(project=project, name="Capital QA", revision=paris)
    rule = online_rule_pause(rule=rule, reason="Judge model outage")
    assert not rule.active and rule.paused_reason == "Judge model outage"
    ingest(project, django_capture_on_commit_callbacks, root("t-while-paused"))
    assert evaluated(rule) == set()
    with pytest.raises(InvalidInput):
        online_backfill(rule=rule, since=T0 - timedelta(hours=1))
    # Work queued before the pause finds the rule paused when it runs.
    trace = Trace.objects.get(trace_id="t-while-paused")
    assert online_dispatch(project_id=project.pk, trace_ids=[trace.pk]) == 0
    assert online_evaluate_traces(rule=rule, traces=[trace]) == 0
    rule = online_rule_resume(rule=rule)
    assert rule.active and rule.paused_reason == ""
    ingest(project, django_capture_on_commit_callbacks, root("t-after"))
    assert evaluated(rule) == {"t-after"}  # the paused period needs a backfill
    with django_capture_on_commit_callbacks(execute=True):
        online_backfill(rule=rule, since=T0 - timedelta(hours=1))
    assert evaluated(rule) == {"t-after", "t-while-paused"}


def test_it_refuses_evaluators_that_do_not_run(project):
    human = evaluator_create(project=project, kind="human", name="Reviewer").head
    with pytest.raises(InvalidInput) as caught:
        online_rule_create(project=project, name="Humans", revision=human)
    assert "cannot be online rules" in caught.value.fields["evaluator"][0]


# --- metrics ------------------------------------------------------------------------------------


def test_it_computes_metrics_per_time_bucket(project, paris, django_capture_on_commit_callbacks):
    rule = online_rule_create(project=project, name="Capital QA", revision=paris)
    ingest(
        project,
        django_capture_on_commit_callbacks,
        root("t-1005", start=T0 + timedelta(minutes=5)),
        root("t-1040", start=T0 + timedelta(minutes=40), outputs="Lyon"),
        root("t-1110", start=T0 + timedelta(minutes=70)),
    )
    buckets = online.online_buckets(rule=rule)
    assert [b["start"] for b in buckets] == [T0, T0 + timedelta(hours=1)]
    key = "evaluator-says-paris-v1"
    first, second = (b["data"][key]["success"] for b in buckets)
    assert (first["count"], first["true"], first["rate"]) == (2, 1, 0.5)
    assert (second["count"], second["rate"]) == (1, 1.0)
    overall = RunMetrics.objects.get(run=rule.run, scenario=None, bucket_start=None).data
    assert overall[key]["success"]["count"] == 3
    # The full refresh (metrics.buckets_refresh) writes the very same rows.
    before = {
        m.bucket_start: m.data
        for m in RunMetrics.objects.filter(run=rule.run, bucket_start__isnull=False)
    }
    metrics.run_refresh(run=rule.run)
    after = {
        m.bucket_start: m.data
        for m in RunMetrics.objects.filter(run=rule.run, bucket_start__isnull=False)
    }
    assert after == before


# --- isolation ----------------------------------------------------------------------------------


def test_it_never_evaluates_another_projects_traces(
    project, other_project, paris, django_capture_on_commit_callbacks
):
    rule = online_rule_create(project=project, name="Capital QA", revision=paris)
    theirs = ingest(other_project, django_capture_on_commit_callbacks, root("t-theirs"))
    assert online_evaluate_traces(rule=rule, traces=theirs) == 0
    assert online_dispatch(project_id=project.pk, trace_ids=[theirs[0].pk]) == 0
    assert evaluated(rule) == set() and not Annotation.objects.exists()
    ours = ingest(project, django_capture_on_commit_callbacks, root("t-theirs"))  # same id
    assert evaluated(rule) == {"t-theirs"}
    assert Annotation.objects.get().trace == ours[0]


def test_it_refuses_another_projects_evaluator(project, other_project):
    theirs = evaluator_create(
        project=other_project, kind="regex", name="X", parameters={"pattern": "x"}
    )
    with pytest.raises(InvalidInput) as caught:
        online_rule_create(project=project, name="Stolen", revision=theirs.head)
    assert "evaluator" in caught.value.fields


def test_it_pauses_a_rule_whose_model_connection_fails_authentication(
    project, llm_server, llm_connection, django_capture_on_commit_callbacks
):
    from runs.models import OnlineRule
    from tests.llm_server import failure

    judge = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Judge",
        preset="helpfulness",
        parameters={"connection": llm_connection.slug},
    ).head
    rule = online_rule_create(project=project, name="Judged", revision=judge)
    llm_server.answer = failure(401, "invalid api key")
    ingest(project, django_capture_on_commit_callbacks, root("a" * 32))
    rule = OnlineRule.objects.get(pk=rule.pk)
    assert not rule.active
    assert "failing" in rule.paused_reason and "invalid api key" in rule.paused_reason.lower()
    calls = len(llm_server.calls)
    ingest(project, django_capture_on_commit_callbacks, root("b" * 32))
    assert len(llm_server.calls) == calls  # paused: the judge is not called again
