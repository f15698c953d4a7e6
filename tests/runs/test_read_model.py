"""The read model of per-scenario values (``ScenarioValue``): written with the per-scenario
statistics, one row per scenario and numeric or boolean metric, errors counted, never zeroed."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from evaluators.services import evaluator_create
from runs import metrics
from runs.engine import run_create, run_execute_inline
from runs.models import Result, ScenarioValue
from tests.runs.factories import make_testset


def _values(run):
    return {
        (v.index, v.step_key, v.key): (v.value, v.errors)
        for v in ScenarioValue.objects.filter(run=run)
    }


def test_it_holds_each_scenarios_metric_values_and_errors(project, column_app):
    rows = [
        {"country": "France", "outputs": "Paris", "correct_answer": "Paris"},
        {"country": "Italy", "outputs": "Milan", "correct_answer": "Rome"},
        {"country": "Spain", "outputs": "Madrid"},  # no ground truth: exact match errors
    ]
    version = make_testset(project, rows, slug="three")
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    similar = evaluator_create(
        project=project, kind="similarity", name="Similar", parameters={"threshold": 0.5}
    ).head
    run = run_execute_inline(
        run=run_create(
            project=project,
            testset_version=version,
            application=column_app,
            revisions=[exact, similar],
        )
    )
    values = _values(run)
    exact_key = next(k for k in run.steps.values_list("key", flat=True) if "exact" in k)
    assert values[(0, exact_key, "success")] == (1.0, 0)
    assert values[(1, exact_key, "success")] == (0.0, 0)
    # The errored cell is an error with no value, not a 0.
    assert values[(2, exact_key, "success")] == (None, 1)
    similar_scores = {
        r.scenario.index: r.annotation.outputs["score"]
        for r in Result.objects.filter(run=run, step_key__contains="similar").select_related(
            "annotation", "scenario"
        )
        if r.annotation_id
    }
    similar_key = next(k for k in run.steps.values_list("key", flat=True) if "similar" in k)
    for index, score in similar_scores.items():
        assert values[(index, similar_key, "score")][0] == score


def test_a_refresh_rewrites_changed_values_only_and_keeps_one_row_per_cell(
    project, column_app, capitals, exact
):
    run = run_execute_inline(
        run=run_create(
            project=project, testset_version=capitals, application=column_app, revisions=[exact]
        )
    )
    before = _values(run)
    assert before
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    assert _values(run) == before
    assert ScenarioValue.objects.filter(run=run).count() == len(before)
    # A key the schema no longer has leaves the read model on the next refresh.
    row = ScenarioValue.objects.filter(run=run).first()
    ScenarioValue.objects.create(
        run=run, scenario_id=row.scenario_id, index=row.index, step_key=row.step_key, key="gone"
    )
    metrics.scenarios_refresh(run=run, scenario_ids=[row.scenario_id])
    assert not ScenarioValue.objects.filter(run=run, key="gone").exists()


@pytest.mark.django_db(transaction=True)
def test_migrating_an_existing_database_builds_the_read_model_of_its_runs(
    project, column_app, capitals, exact
):
    run = run_execute_inline(
        run=run_create(
            project=project, testset_version=capitals, application=column_app, revisions=[exact]
        )
    )
    expected = _values(run)
    assert expected
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    _migrate([("runs", "0010_span_trace_no_constraint")])  # the table goes, RunMetrics stays
    _migrate(latest)
    assert _values(run) == expected


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
