"""Seed 002, reproduced first: an evaluator registered without an outputs schema, run through
the SDK-style flow, must still get columns with values in every row and real metrics, and its
annotations must be found by id and by slug alike."""

from runs.engine import read_model_refresh
from runs.models import Annotation
from tests.runs.factories import make_testset

LABELS = ["good", "bad", "good", "meh"]


def _sdk_run(api, project):
    make_testset(
        project,
        [{"country": c, "correct_answer": c[:3]} for c in ("France", "Germany", "Italy", "Spain")],
    )
    evaluator = api.post(
        "/api/v1/evaluators",
        {"name": "My judge", "slug": "my-judge", "kind": "feedback"},
        format="json",
    )
    assert evaluator.status_code == 201
    assert "outputs" not in evaluator.json()["head"]["schemas"]
    app = api.post("/api/v1/applications", {"name": "My app", "kind": "logged"}, format="json")
    assert app.status_code == 201
    run = api.post(
        "/api/v1/runs",
        {"testset": "capitals", "application": "my-app", "evaluators": ["my-judge"]},
        format="json",
    )
    assert run.status_code == 201, run.json()
    run = run.json()
    steps = {s["type"]: s["key"] for s in run["steps"]}
    results = []
    for index in range(4):
        results += [
            {"scenario": index, "step_key": steps["input"]},
            {"scenario": index, "step_key": steps["invocation"], "outputs": f"answer {index}"},
            {
                "scenario": index,
                "step_key": steps["annotation"],
                "outputs": {
                    "score": 0.25 * index,
                    "success": index % 2 == 0,
                    "label": LABELS[index],
                },
            },
        ]
    logged = api.post(f"/api/v1/runs/{run['id']}/results", {"results": results}, format="json")
    assert logged.status_code == 201, logged.json()
    return run, steps


def test_it_fills_columns_for_an_evaluator_without_a_schema(api, project):
    run, _ = _sdk_run(api, project)
    # GETs only read: the columns come from the refresh a worker runs a moment after the cells.
    assert api.get(f"/api/v1/runs/{run['id']}/scenarios").json()["columns"]
    read_model_refresh(run_id=run["id"])
    table = api.get(f"/api/v1/runs/{run['id']}/scenarios").json()
    names = {c["column"]["name"]: c for c in table["columns"]}
    assert {"my-judge.score", "my-judge.success", "my-judge.label"} <= set(names)
    assert names["my-judge.score"]["step"]["path"] == "attributes.ag.data.outputs.score"
    assert not any(c["step"]["path"].endswith("outputs.outputs") for c in table["columns"])
    for row in table["rows"]:
        assert row["values"]["my-judge.score"] == 0.25 * row["index"]
        assert row["values"]["my-judge.label"] == LABELS[row["index"]]
        assert row["values"]["outputs"] == f"answer {row['index']}"


def test_it_computes_metrics_for_an_evaluator_without_a_schema(api, project):
    run, steps = _sdk_run(api, project)
    closed = api.post(f"/api/v1/runs/{run['id']}/close")
    assert (
        closed.status_code == 200
        and closed.json()["status"] == "success"
        and closed.json()["closed"]
    )
    data = api.get(f"/api/v1/runs/{run['id']}/metrics").json()["run"][steps["annotation"]]
    assert data["score"]["mean"] == 0.375
    assert data["score"]["percentiles"]["p50"] == 0.375
    assert data["success"]["rate"] == 0.5
    assert {f["value"]: f["count"] for f in data["label"]["frequencies"]} == {
        "good": 2,
        "bad": 1,
        "meh": 1,
    }


def test_it_finds_annotations_by_evaluator_id_and_slug(api, project):
    run, _ = _sdk_run(api, project)
    evaluator_id = Annotation.objects.first().evaluator_id
    by_slug = api.get("/api/v1/annotations?evaluator=my-judge").json()["results"]
    by_id = api.get(f"/api/v1/annotations?evaluator={evaluator_id}").json()["results"]
    assert len(by_slug) == len(by_id) == 4
    assert {a["id"] for a in by_slug} == {a["id"] for a in by_id}
    assert by_slug[0]["evaluator"] == {"id": evaluator_id, "slug": "my-judge"}
    assert len(api.get(f"/api/v1/annotations?run={run['id']}").json()["results"]) == 4


def test_it_registers_a_feedback_evaluator_for_an_unknown_slug(api, project):
    response = api.post(
        "/api/v1/annotations", {"evaluator": "thumbs", "outputs": {"up": True}}, format="json"
    )
    assert response.status_code == 201
    assert response.json()["evaluator"]["slug"] == "thumbs"
    assert project.evaluators.get(slug="thumbs").kind == "feedback"


def test_it_refuses_outputs_the_schema_refuses_with_422(api, project):
    api.post("/api/v1/evaluators", {"name": "Stars", "kind": "human"}, format="json")
    response = api.post(
        "/api/v1/annotations", {"evaluator": "stars", "outputs": {"score": "lots"}}, format="json"
    )
    assert response.status_code == 422
    assert "score" in response.json()["error"]["message"]
    assert not Annotation.objects.exists()


def test_it_refuses_an_unknown_evaluator_id(api):
    response = api.post(
        "/api/v1/annotations", {"evaluator": "999999", "outputs": {"a": 1}}, format="json"
    )
    assert response.status_code == 400
    assert "evaluator" in response.json()["error"]["fields"]


def test_it_refuses_results_for_an_unknown_step_naming_it(api, project):
    run, _ = _sdk_run(api, project)
    response = api.post(
        f"/api/v1/runs/{run['id']}/results",
        {"results": [{"scenario": 0, "step_key": "nope"}]},
        format="json",
    )
    assert response.status_code == 400
    assert "results.0.step_key" in response.json()["error"]["fields"]


def test_it_hides_runs_of_other_projects(api, outsider_api, project):
    run, _ = _sdk_run(api, project)
    assert outsider_api.get(f"/api/v1/runs/{run['id']}").status_code == 404
    assert (
        outsider_api.post(
            f"/api/v1/runs/{run['id']}/results", {"results": []}, format="json"
        ).status_code
        == 404
    )


def test_it_names_a_malformed_paging_parameter(api, project):
    run, _ = _sdk_run(api, project)
    response = api.get(f"/api/v1/runs/{run['id']}/scenarios?offset=null")
    assert response.status_code == 400
    assert "offset" in response.json()["error"]["fields"]
