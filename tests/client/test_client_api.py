"""The client against a live evalsite: typed answers, uploads as testset versions, tags and the
baseline lookup, estimates, comparisons, and the SDK flow of LoggedRun (closed at the end,
cancelled and closed when the block raises)."""

from __future__ import annotations

import json

import pytest
from evalsite_client import ApiError, LoggedRun, models
from evalsite_client.cli import baseline_find

from evaluators.services import evaluator_create
from runs import testsets
from runs.models import Run, Testset
from tests.client.conftest import finished_run, questions
from tests.client.drift import live_drift

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_reads_the_keys_project(remote, site):
    project = remote.project()
    assert project.slug == site.project.slug and project.role == "editor"


def test_it_uploads_a_file_as_a_new_testset_then_as_its_next_version(remote, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in questions(5)))
    created = remote.testset_upload("arith", rows)
    assert (created.slug, created.version, created.row_count) == ("arith", 1, 5)
    table = tmp_path / "rows.csv"
    table.write_text("question,answer\nOne?,1\nTwo?,2\n")
    revised = remote.testset_upload("arith", table)
    assert (revised.version, revised.row_count) == (2, 2)
    assert revised.head.columns == ["question", "answer"]
    assert Testset.objects.get(slug="arith").versions.count() == 2


def test_it_names_the_bad_row_of_an_upload(remote, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ApiError) as caught:
        remote.testset_upload("broken", bad)
    assert caught.value.status == 400 and "file" in caught.value.message


def test_it_estimates_a_run_and_creates_nothing(remote, qa):
    estimate = remote.run_estimate(
        testset="qa", application="column", evaluators=["exact"], repeats=2
    )
    assert (estimate.scenarios, estimate.repeats) == (40, 2)
    assert {s.type for s in estimate.steps} == {"input", "invocation", "annotation"}
    assert estimate.judge_calls == 0 and estimate.cost_usd == 0 and not estimate.over_cap
    assert not Run.objects.exists()


def test_it_creates_a_tagged_run_and_finds_it_by_its_tags(remote, qa, project):
    run = remote.run_create(
        testset="qa",
        application="column",
        evaluators=["exact"],
        start=False,
        tags={"branch": "main", "commit": "9f1c2e7"},
    )
    assert run.tags == {"branch": "main", "commit": "9f1c2e7"} and run.status == "pending"
    assert [r.id for r in remote.runs(tags={"branch": "main"})] == [run.id]
    assert list(remote.runs(tags={"branch": "feature"})) == []
    retagged = remote.run_update(run.id, tags={"branch": "feature", "pr": "12"})
    assert retagged.tags == {"branch": "feature", "pr": "12"}
    assert [r.id for r in remote.runs(testset="qa", tags={"pr": "12"})] == [run.id]


def test_the_baseline_is_the_newest_finished_run_of_the_testset_with_the_tags(remote, qa, project):
    version, app, exact = qa
    older = finished_run(project, version, app, [exact], tags={"branch": "main"})
    newer = finished_run(project, version, app, [exact], tags={"branch": "main"})
    finished_run(project, version, app, [exact], tags={"branch": "feature"})
    pending = remote.run_create(
        testset="qa",
        application="column",
        evaluators=["exact"],
        start=False,
        tags={"branch": "main"},
    )
    candidate = remote.run(finished_run(project, version, app, [exact], name="candidate").pk)
    found = baseline_find(remote, candidate, {"branch": "main"})
    assert found.id == newer.pk != older.pk and pending.id > found.id
    assert baseline_find(remote, candidate, {"branch": "release"}) is None
    # The candidate itself is never its own baseline.
    assert baseline_find(remote, remote.run(newer.pk), {"branch": "main"}).id == older.pk


def test_it_reads_a_comparison_as_typed_models(remote, qa, project):
    version, app, exact = qa
    base = finished_run(project, version, app, [exact])
    cand = finished_run(project, version, app, [exact])
    comparison = remote.compare(base.pk, cand.pk, filter="regressions")
    assert comparison.baseline == base.pk and [r.id for r in comparison.runs] == [base.pk, cand.pk]
    (metric,) = comparison.metrics
    assert metric.metric == "exact.success" and metric.type == "binary"
    assert metric.summary(base.pk).value == pytest.approx(38 / 40)
    test = metric.test_of(cand.pk)
    assert test.n == 40 and test.verdict == "inconclusive" and test.difference == 0
    assert comparison.count == 0 and comparison.rows == []


def test_it_reads_every_page_of_the_scenario_table(remote, qa, project):
    version, app, exact = qa
    run = finished_run(project, version, app, [exact])
    pages = list(remote.scenario_tables(run.pk))
    rows = [row for page in pages for row in page.rows]
    assert [r.index for r in rows] == list(range(40))
    assert rows[3].values["exact.success"] is False and rows[4].values["exact.success"] is True


def test_a_logged_run_logs_scenarios_outputs_traces_and_scores_and_closes(remote, project):
    evaluator_create(project=project, kind="feedback", name="Helpful", slug="helpful")
    trace = {
        "trace_id": "b1e5c0de00000000000000000000000a",
        "spans": {
            "root": {
                "span_id": "root",
                "name": "agent",
                "start_time": "2026-11-20T10:00:00Z",
                "end_time": "2026-11-20T10:00:01Z",
                "attributes": {"ag": {"data": {"inputs": {"q": "traced"}}}},
            }
        },
    }
    with LoggedRun(
        remote, name="from code", evaluators=["helpful"], tags={"branch": "main"}, batch_size=2
    ) as run:
        run.log(inputs={"q": "one"}, outputs="1", scores={"helpful": True})
        run.log(inputs={"q": "two"}, outputs="2", scores={"helpful": False})
        run.log(inputs={"q": "traced"}, outputs="3", trace=trace, scores={"helpful": 0.5})
        run.log(inputs={"q": "broken"}, error=RuntimeError("the app timed out"))
    assert run.run.closed and run.run.status == "errors" and run.logged == 4
    assert run.run.tags == {"branch": "main"}
    table = remote.scenario_table(run.run.id)
    values = {r.index: r.values for r in table.rows}
    assert values[0]["outputs"] == "1" and values[1]["outputs"] == "2"
    assert values[2]["outputs"] == "3"  # put into the trace's root span, which had none
    assert values[0]["helpful.success"] is True and values[1]["helpful.success"] is False
    assert table.rows[3].errors["outputs"]["message"] == "the app timed out"
    assert Run.objects.get(pk=run.run.id).application.slug == "sdk"


def test_a_logged_run_whose_block_raises_is_cancelled_and_closed_keeping_what_was_logged(
    remote, project
):
    with pytest.raises(ZeroDivisionError), LoggedRun(remote, name="crashy") as run:
        run.log(inputs={"q": "one"}, outputs="1")
        1 / 0
    stored = Run.objects.get(pk=run.run.id)
    assert stored.status == "cancelled" and stored.closed
    assert stored.scenarios.count() == 1
    assert "ZeroDivisionError" in stored.description


def test_a_logged_run_refuses_an_evaluator_it_does_not_have(remote, project):
    with LoggedRun(remote, name="strict") as run, pytest.raises(ValueError, match="No evaluator"):
        run.log(inputs={}, outputs="x", scores={"nope": True})


def test_a_logged_run_refuses_an_application_that_is_not_logged(remote, qa):
    with pytest.raises(ValueError, match="column application"):
        LoggedRun(remote, application="column").start()
    assert not Run.objects.exists()


def test_an_api_error_carries_the_fields_and_reasons(remote):
    with pytest.raises(ApiError) as caught:
        remote.run_create(testset="nope", application="column")
    assert caught.value.status == 400
    assert "testset" in caught.value.message and "nope" in caught.value.message


def test_the_free_form_parts_of_live_answers_carry_every_field_the_models_read(remote, qa, project):
    """What the OpenAPI schema leaves free-form (JSON fields) is checked against real answers:
    the run's testset and application, the estimate's tokens and caps, the comparison's runs,
    metrics, tests and rows, the scenario table's rows."""
    version, app, exact = qa
    base = finished_run(project, version, app, [exact])
    worse = testsets.testset_revise(testset=version.testset, rows=questions(40, wrong={1, 2, 3, 7}))
    cand = finished_run(project, worse, app, [exact])
    answers = [
        (models.Run, remote.get(f"runs/{cand.pk}"), ()),
        (
            models.Estimate,
            remote.post(
                "runs",
                {
                    "testset": "qa",
                    "application": "column",
                    "evaluators": ["exact"],
                    "dry_run": True,
                },
            )["estimate"],
            ("Estimate.steps.judge",),  # LLM judges only
        ),
        (
            models.Comparison,
            remote.get("runs/compare", runs=f"{base.pk},{cand.pk}", filter="regressions"),
            (),
        ),
        (models.ScenarioTable, remote.get(f"runs/{cand.pk}/scenarios"), ()),
    ]
    for model, answer, optional in answers:
        assert live_drift(model, answer, optional=optional) == [], model.__name__
    comparison = models.Comparison.model_validate(answers[2][1])
    assert [r.index for r in comparison.rows] == [1, 2]
