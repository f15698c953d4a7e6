"""Evaluators REST API: CRUD, revisions, kinds, presets and invoke."""

from evaluators.services import evaluator_create


def test_it_lists_kinds_with_settings_template_and_presets(api):
    kinds = {k["key"]: k for k in api.get("/api/v1/kinds").json()}
    assert {"exact_match", "regex"} <= set(kinds)
    regex = kinds["regex"]
    assert regex["settings_template"]["properties"]["pattern"]["x-widget"] == "regex"
    assert "starts_with" in [p["slug"] for p in regex["presets"]]
    assert api.get("/api/v1/kinds/nope").status_code == 404


def test_it_creates_with_the_same_defaults_as_the_ui(api, project, editor):
    response = api.post(
        "/api/v1/evaluators", {"name": "Exact", "kind": "exact_match"}, format="json"
    )
    assert response.status_code == 201
    ui_made = evaluator_create(project=project, kind="exact_match", name="Exact UI")
    assert response.json()["head"]["parameters"] == ui_made.head.parameters
    assert response.json()["head"]["author"] == "bob"


def test_it_creates_from_a_preset(api):
    response = api.post(
        "/api/v1/evaluators",
        {"name": "Starts", "kind": "regex", "preset": "starts_with"},
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["head"]["parameters"]["pattern"] == "^Answer:"


def test_it_names_the_invalid_parameter(api, project):
    response = api.post(
        "/api/v1/evaluators",
        {"name": "Bad", "kind": "regex", "parameters": {"pattern": "("}},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()["error"]
    assert "parameters.pattern" in body["fields"]
    assert body["message"].startswith("parameters.pattern:")
    assert not project.evaluators.exists()


def test_it_refuses_a_duplicate_slug(api):
    api.post(
        "/api/v1/evaluators",
        {"name": "A", "slug": "same", "kind": "regex", "parameters": {"pattern": "a"}},
        format="json",
    )
    response = api.post(
        "/api/v1/evaluators",
        {"name": "B", "slug": "same", "kind": "regex", "parameters": {"pattern": "a"}},
        format="json",
    )
    assert response.status_code == 400
    assert "slug" in response.json()["error"]["fields"]


def test_it_revises_by_patch_and_lists_revisions(api):
    api.post(
        "/api/v1/evaluators",
        {"name": "D", "kind": "regex", "parameters": {"pattern": "a"}},
        format="json",
    )
    response = api.patch(
        "/api/v1/evaluators/d", {"parameters": {"pattern": "b"}, "message": "b now"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["head"]["slug"] == "d-v2"
    assert response.json()["head"]["parameters"]["case_sensitive"] is True
    revisions = api.get("/api/v1/evaluators/d/revisions").json()["results"]
    assert [r["version"] for r in revisions] == [2, 1]
    assert revisions[0]["evaluator"]["slug"] == "d"
    assert api.get("/api/v1/revisions/d-v1").json()["parameters"]["pattern"] == "a"


def test_it_replaces_parameters_by_put(api):
    api.post(
        "/api/v1/evaluators",
        {"name": "D", "kind": "regex", "parameters": {"pattern": "a", "case_sensitive": False}},
        format="json",
    )
    response = api.put("/api/v1/evaluators/d", {"parameters": {"pattern": "z"}}, format="json")
    assert response.json()["head"]["parameters"]["case_sensitive"] is True


def test_it_archives_on_delete(api):
    api.post(
        "/api/v1/evaluators",
        {"name": "D", "kind": "regex", "parameters": {"pattern": "a"}},
        format="json",
    )
    assert api.delete("/api/v1/evaluators/d").status_code == 204
    assert api.get("/api/v1/evaluators").json()["results"] == []
    assert api.get("/api/v1/evaluators?archived=true").json()["results"][0]["archived"] is True


def test_it_invokes_an_ad_hoc_kind(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"kind": "regex", "parameters": {"pattern": "^Par"}, "inputs": {}, "outputs": "Paris"},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["status"] == "success"
    assert response.json()["outputs"] == {"success": True}


def test_it_invokes_a_stored_evaluator_by_slug_and_revision(api, project):
    evaluator = evaluator_create(
        project=project, kind="regex", name="R", parameters={"pattern": "a"}
    )
    from evaluators.services import evaluator_revise

    evaluator_revise(evaluator=evaluator, parameters={"pattern": "z"})
    body = {"evaluator": "r", "inputs": {}, "outputs": "abc"}
    assert (
        api.post("/api/v1/evaluators/invoke", body, format="json").json()["outputs"]["success"]
        is False
    )
    body["revision"] = "1"
    assert (
        api.post("/api/v1/evaluators/invoke", body, format="json").json()["outputs"]["success"]
        is True
    )


def test_it_answers_a_failing_evaluation_as_an_error_result(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"kind": "exact_match", "inputs": {"q": 1}, "outputs": "x"},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["status"] == "error"
    assert response.json()["error"]["code"] == "missing_ground_truth"


def test_it_refuses_invoke_without_an_evaluator(api):
    response = api.post("/api/v1/evaluators/invoke", {"outputs": "x"}, format="json")
    assert response.status_code == 400
    assert "evaluator" in response.json()["error"]["fields"]


def test_it_refuses_invoke_of_another_projects_evaluator(outsider_api, project):
    evaluator_create(project=project, kind="regex", name="Secret", parameters={"pattern": "a"})
    response = outsider_api.post(
        "/api/v1/evaluators/invoke", {"evaluator": "secret", "outputs": "a"}, format="json"
    )
    assert response.status_code == 400
    assert "No evaluator" in response.json()["error"]["fields"]["evaluator"][0]


def test_it_refuses_inputs_that_are_not_an_object(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"kind": "regex", "parameters": {"pattern": "a"}, "inputs": [1], "outputs": "a"},
        format="json",
    )
    assert response.status_code == 400
    assert "inputs" in response.json()["error"]["fields"]


def test_it_refuses_parameters_that_are_not_an_object_and_saves_nothing(api, project):
    evaluator_create(project=project, kind="regex", name="R", parameters={"pattern": "a"})
    response = api.patch(
        "/api/v1/evaluators/r", {"name": "Renamed", "parameters": 0}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["parameters"] == ["must be a JSON object"]
    assert project.evaluators.get().name == "R"  # nothing saved half-way
