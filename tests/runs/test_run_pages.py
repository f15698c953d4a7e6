"""Run pages: list with polling, new-run form, the run page with its sortable, filterable table,
the scenario drill-in and human annotation. Full pages and HTMX fragments."""

import pytest

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Annotation, Result, Run
from tests.runs.factories import CAPITALS, make_testset

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def finished_run(project):
    version = make_testset(project, CAPITALS)
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    similar = evaluator_create(
        project=project, kind="similarity", name="Similar", parameters={"threshold": 0.5}
    ).head
    run = run_create(
        project=project,
        name="Nightly",
        testset_version=version,
        application=app,
        revisions=[exact, similar],
    )
    return run_execute_inline(run=run)


def test_it_lists_runs_and_polls_only_while_one_is_active(owner_client, finished_run, project):
    page = owner_client.get("/p/acme/runs/").content.decode()
    assert "Nightly" in page and 'hx-trigger="every 2s"' not in page
    Run.objects.filter(pk=finished_run.pk).update(status="running")
    fragment = owner_client.get("/p/acme/runs/", **HTMX).content.decode()
    assert (
        fragment.strip().startswith('<div id="run-table"') and 'hx-trigger="every 2s"' in fragment
    )


def test_it_creates_and_queues_a_run_from_the_form(owner_client, project):
    make_testset(project, CAPITALS)
    evaluator = evaluator_create(project=project, kind="exact_match", name="Exact")
    testset = project.testsets.get()
    response = owner_client.post(
        "/p/acme/runs/new",
        {
            "testset": testset.pk,
            "outputs_column": "outputs",
            "evaluators": [evaluator.pk],
            "repeats": 1,
        },
    )
    assert response.status_code == 302
    run = Run.objects.get()
    assert run.status in ("queued", "running", "success") and run.application.config == {
        "outputs_column": "outputs"
    }


def test_it_names_a_missing_outputs_column_inline(owner_client, project):
    make_testset(project, CAPITALS)
    testset = project.testsets.get()
    response = owner_client.post(
        "/p/acme/runs/new", {"testset": testset.pk, "outputs_column": "answer", "repeats": 1}
    )
    assert response.status_code == 200
    assert "no column &#x27;answer&#x27;" in response.content.decode()
    assert not Run.objects.exists()


def test_it_shows_metric_cards_and_the_table(owner_client, finished_run):
    page = owner_client.get(f"/p/acme/runs/{finished_run.pk}/").content.decode()
    assert "exact.success" in page and "data-chart" in page
    assert "France" in page and "/scenarios/0/" in page


def test_it_sorts_the_table_by_a_metric_column(owner_client, finished_run):
    scores = {
        r.scenario.inputs["country"]: r.annotation.outputs["score"]
        for r in Result.objects.filter(
            run=finished_run, step_key="evaluator-similar-v1"
        ).select_related("annotation", "scenario")
    }
    fragment = owner_client.get(
        f"/p/acme/runs/{finished_run.pk}/?sort=-similar.score",
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="run-scenarios",
    ).content.decode()
    assert fragment.strip().startswith('<section class="card" id="run-scenarios">')
    shown = sorted(scores, key=fragment.index)
    assert [scores[c] for c in shown] == sorted(scores.values(), reverse=True)
    ascending = owner_client.get(
        f"/p/acme/runs/{finished_run.pk}/?sort=similar.score"
    ).content.decode()
    assert [scores[c] for c in sorted(scores, key=ascending.index)] == sorted(scores.values())


def test_it_filters_failed_scenarios_and_searches_text(owner_client, finished_run):
    failed = owner_client.get(f"/p/acme/runs/{finished_run.pk}/?failed=1").content.decode()
    assert "Italy" in failed and "Spain" in failed and "Germany" not in failed
    searched = owner_client.get(f"/p/acme/runs/{finished_run.pk}/?q=milan").content.decode()
    assert "Italy" in searched and "France" not in searched


def test_it_filters_by_a_metric_range(owner_client, finished_run):
    page = owner_client.get(
        f"/p/acme/runs/{finished_run.pk}/?column=similar.score&low=0.99"
    ).content.decode()
    assert "France" in page and "Spain" not in page


def test_it_shows_errors_as_errors_never_zero(owner_client, project):
    version = make_testset(project, [{"country": "France", "outputs": "Paris"}], slug="no-truth")
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    run = run_execute_inline(
        run=run_create(project=project, testset_version=version, application=app, revisions=[exact])
    )
    page = owner_client.get(f"/p/acme/runs/{run.pk}/").content.decode()
    assert "missing_ground_truth" in page and "badge-error" in page
    errors_only = owner_client.get(f"/p/acme/runs/{run.pk}/?errors=1").content.decode()
    assert "France" in errors_only


def test_it_drills_into_a_scenario_with_every_evaluator(owner_client, finished_run):
    page = owner_client.get(f"/p/acme/runs/{finished_run.pk}/scenarios/2/").content.decode()
    assert "Italy" in page and "Milan" in page and "ground truth" in page
    assert "Exact" in page and "Similar" in page and "exact-v1" in page
    assert (
        'data-hotkey="j ArrowRight"' in page and "/scenarios/3/" in page and "/scenarios/1/" in page
    )
    assert "span-tree" in page


def test_it_corrects_a_judgement_and_keeps_the_history(owner_client, owner, finished_run):
    step = finished_run.steps.get(key="evaluator-exact-v1")
    response = owner_client.post(
        f"/p/acme/runs/{finished_run.pk}/scenarios/2/annotate",
        {"evaluator": step.revision.evaluator_id, f"s{step.pk}-success": "on"},
    )
    assert response.status_code == 302
    result = Result.objects.get(run=finished_run, scenario__index=2, step_key=step.key)
    assert result.annotation.outputs == {"success": True}
    assert result.annotation.origin == "human" and result.annotation.updated_by == owner
    assert result.annotation.history[0]["outputs"] == {"success": False}


def test_it_annotates_with_a_human_evaluator_not_yet_in_the_run(
    owner_client, project, finished_run
):
    stars = evaluator_create(project=project, kind="human", name="Stars", preset="five_stars")
    page = owner_client.get(f"/p/acme/runs/{finished_run.pk}/scenarios/0/").content.decode()
    assert "Annotate with Stars" in page
    response = owner_client.post(
        f"/p/acme/runs/{finished_run.pk}/scenarios/0/annotate",
        {"evaluator": stars.pk, "prefix": "new", "new-score": "4"},
    )
    assert response.status_code == 302
    annotation = Annotation.objects.get(evaluator=stars)
    assert annotation.outputs["score"] == 4 and annotation.trace is not None
    run = Run.objects.get(pk=finished_run.pk)
    assert any(m["column"]["name"] == "stars.score" for m in run.mappings)
    assert run.status == "success"  # cells people fill in are never waited for


def test_it_forbids_a_viewer_to_annotate(viewer_client, finished_run):
    step = finished_run.steps.get(key="evaluator-exact-v1")
    response = viewer_client.post(
        f"/p/acme/runs/{finished_run.pk}/scenarios/2/annotate",
        {"evaluator": step.revision.evaluator_id, f"s{step.pk}-success": "on"},
    )
    assert response.status_code == 403


def test_it_hides_runs_of_other_projects(outsider_client, finished_run):
    assert outsider_client.get(f"/p/acme/runs/{finished_run.pk}/").status_code == 404
    assert outsider_client.get(f"/p/acme/runs/{finished_run.pk}/scenarios/0/").status_code == 404


def test_it_renders_the_progress_fragment(owner_client, finished_run):
    fragment = owner_client.get(f"/p/acme/runs/{finished_run.pk}/progress", **HTMX).content.decode()
    assert fragment.strip().startswith('<section id="run-progress"') and "<html" not in fragment


def test_it_opens_the_code_playground_prefilled_with_a_scenario(owner_client, project):
    version = make_testset(project, CAPITALS)
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    code = evaluator_create(project=project, kind="code", name="Custom", preset="multi_metric").head
    run = run_execute_inline(
        run=run_create(project=project, testset_version=version, application=app, revisions=[code])
    )
    drill_in = owner_client.get(f"/p/acme/runs/{run.pk}/scenarios/2/").content.decode()
    assert f"/p/acme/evaluators/custom/?run={run.pk}&amp;scenario=2#try-panel" in drill_in
    page = owner_client.get(f"/p/acme/evaluators/custom/?run={run.pk}&scenario=2").content.decode()
    assert "Italy" in page and "Milan" in page and "trace_id" in page
    outsider_run = owner_client.get(
        "/p/acme/evaluators/custom/?run=999999&scenario=2"
    ).content.decode()
    assert "Italy" not in outsider_run  # no such run in this project: the usual sample instead


def test_it_shows_an_agents_trajectory_beside_its_scores(owner_client, project):
    import json
    from pathlib import Path

    case = json.loads(
        (
            Path(__file__).resolve().parents[2] / "examples/agents/retries_and_failure.json"
        ).read_text()
    )
    version = make_testset(project, [{**case["inputs"], "outputs": case["outputs"]}], slug="agents")
    app = application_create(
        project=project, name="Agent", kind="column", config={"outputs_column": "outputs"}
    )
    scorer = evaluator_create(project=project, kind="agent_score", name="Agent score").head
    run = run_execute_inline(
        run=run_create(
            project=project, testset_version=version, application=app, revisions=[scorer]
        )
    )
    page = owner_client.get(f"/p/acme/runs/{run.pk}/scenarios/0/").content.decode()
    assert 'class="table trajectory"' in page
    assert "get_forecast" in page and ">retry<" in page and "badge-error" in page
