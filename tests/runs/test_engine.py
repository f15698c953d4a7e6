"""The run engine end to end with tasks executed inline (eager); tests/runs/test_reliability.py
runs the same flow through real worker processes and the real broker."""

import pytest

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_add_evaluators, run_create, run_retry_failed, run_start
from runs.models import Annotation, Result, Run, Scenario
from tests.runs.factories import CAPITALS, make_testset


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline in these tests."""


@pytest.fixture
def polite(project):
    return evaluator_create(project=project, kind="regex", name="Polite", preset="no_apology").head


def test_it_runs_every_cell_once_and_finishes(
    project, capitals, column_app, exact, polite, django_capture_on_commit_callbacks
):
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact, polite]
    )
    assert run.total_cells == 4 * (1 + 1 + 2)
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    run.refresh_from_db()
    assert run.status == "success"
    assert (run.done_cells, run.error_cells) == (16, 0)
    assert Result.objects.filter(run=run).count() == 16
    exact_results = Result.objects.filter(run=run, step_key="evaluator-exact-v1").select_related(
        "annotation"
    )
    successes = {
        r.scenario.inputs["country"]: r.annotation.outputs["success"] for r in exact_results
    }
    assert successes == {"France": True, "Germany": True, "Italy": False, "Spain": False}
    annotation = Annotation.objects.filter(evaluator_slug="exact").first()
    assert annotation.revision == exact and annotation.trace is not None
    assert set(Scenario.objects.filter(run=run).values_list("status", flat=True)) == {"success"}


def test_it_maps_columns_to_paths_the_evaluators_produce(project, capitals, column_app, exact):
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    columns = {m["column"]["name"]: m["step"]["path"] for m in run.mappings}
    assert columns["exact.success"] == "attributes.ag.data.outputs.success"
    assert columns["outputs"] == "attributes.ag.data.outputs"
    assert columns["country"] == "data.country"
    assert not any(path.endswith("outputs.outputs") for path in columns.values())


def test_it_records_errors_as_errors_and_still_finishes(
    project, column_app, django_capture_on_commit_callbacks
):
    version = make_testset(project, [{"country": "France", "outputs": "Paris"}], slug="no-truth")
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    run = run_create(
        project=project, testset_version=version, application=column_app, revisions=[exact]
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    run.refresh_from_db()
    assert run.status == "errors"
    result = Result.objects.get(run=run, step_key="evaluator-exact-v1")
    assert result.status == "error" and result.annotation is None
    assert result.error["code"] == "missing_ground_truth"
    stats = run.metrics.get(scenario=None).data["evaluator-exact-v1"]
    assert stats["success"]["count"] == 0 and stats["success"]["errors"] == 1
    assert stats["success"]["rate"] is None  # no score of 0 from an error


def test_it_computes_run_metrics_when_it_ends(
    project, capitals, column_app, exact, django_capture_on_commit_callbacks
):
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    data = Run.objects.get(pk=run.pk).metrics.get(scenario=None).data
    assert data["evaluator-exact-v1"]["success"] == {
        "type": "binary",
        "count": 4,
        "true": 2,
        "false": 2,
        "rate": 0.5,
        "errors": 0,
    }
    assert data["application-capital-qa"]["errors"]["count"] == 0


def test_it_adds_an_evaluator_to_a_finished_run_without_reinvoking(
    project, capitals, column_app, exact, polite, django_capture_on_commit_callbacks
):
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    traces_before = set(
        Result.objects.filter(run=run, step_key="application-capital-qa").values_list(
            "trace_id", flat=True
        )
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_add_evaluators(run=run, revisions=[polite])
    run.refresh_from_db()
    assert run.status == "success" and run.done_cells == run.total_cells == 4 * 4
    traces_after = set(
        Result.objects.filter(run=run, step_key="application-capital-qa").values_list(
            "trace_id", flat=True
        )
    )
    assert traces_before == traces_after
    polite_results = Result.objects.filter(run=run, step_key="evaluator-polite-v1").select_related(
        "annotation"
    )
    assert sorted(r.annotation.outputs["success"] for r in polite_results) == [
        False,
        True,
        True,
        True,
    ]


def test_it_retries_failed_cells(project, column_app, django_capture_on_commit_callbacks):
    version = make_testset(project, [{"country": "France", "outputs": "Paris"}], slug="no-truth")
    evaluator = evaluator_create(
        project=project,
        kind="exact_match",
        name="Exact",
        parameters={"correct_answer_key": "country"},
    )
    run = run_create(
        project=project, testset_version=version, application=column_app, revisions=[evaluator.head]
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    assert Result.objects.filter(run=run, status="success").count() == 3
    # nothing failed, so nothing to retry
    assert run_retry_failed(run=Run.objects.get(pk=run.pk)) == 0


def test_it_refuses_an_outputs_column_the_testset_lacks(project, capitals, exact):
    from evalsite.errors import InvalidInput

    app = application_create(
        project=project, name="Wrong", kind="column", config={"outputs_column": "answer"}
    )
    with pytest.raises(InvalidInput) as caught:
        run_create(project=project, testset_version=capitals, application=app, revisions=[exact])
    assert "answer" in caught.value.fields["application"][0]
    assert not Run.objects.exists()


def test_it_links_judge_calls_and_counts_their_tokens_and_cost(
    project, capitals, column_app, llm_server, llm_connection, django_capture_on_commit_callbacks
):
    judge = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Judge",
        preset="correctness",
        parameters={"connection": llm_connection.slug},
    ).head
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[judge]
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    run.refresh_from_db()
    errors = list(Result.objects.filter(run=run, status="error").values_list("error", flat=True))
    assert run.status == "success", errors
    annotations = Annotation.objects.filter(revision=judge)
    assert annotations.count() == 4
    assert all(
        a.judge_trace is not None and "rendered_prompt" not in a.details.get("details", {})
        for a in annotations
    )
    stats = run.metrics.get(scenario=None).data[f"evaluator-{judge.slug}"]
    assert stats["tokens"]["sum"] == 4 * 120
    assert stats["costs"]["sum"] > 0


def test_it_adds_an_evaluator_in_queries_that_do_not_grow_with_the_scenarios(
    project, column_app, exact, polite, django_capture_on_commit_callbacks
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries_to_add(rows: int, slug: str) -> int:
        version = make_testset(
            project, [dict(CAPITALS[i % 4], n=i) for i in range(rows)], slug=slug
        )
        run = run_create(
            project=project, testset_version=version, application=column_app, revisions=[exact]
        )
        with django_capture_on_commit_callbacks(execute=True):
            run_start(run=run)
        with (
            CaptureQueriesContext(connection) as captured,
            django_capture_on_commit_callbacks(execute=True),
        ):
            run_add_evaluators(run=run, revisions=[polite])
        assert (
            Run.objects.get(pk=run.pk).status == "errors"
            or Run.objects.get(pk=run.pk).done_cells == rows * 4
        )
        return len(captured)

    assert queries_to_add(40, "forty") == queries_to_add(10, "ten")
