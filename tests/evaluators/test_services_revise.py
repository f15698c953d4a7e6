"""Revising an evaluator with its whole configuration sent again (what `evalsite evaluators push`
does): only a real change makes a revision; example cases that must pass refuse the save."""

from evaluators.models import Evaluator, EvaluatorRevision

SCHEMA = {
    "type": "object",
    "properties": {"success": {"type": "boolean"}, "label": {"type": "string"}},
    "required": ["success"],
}
EXAMPLES = [{"name": "paris", "inputs": {}, "outputs": "Paris", "expected": {"success": True}}]


def create(api, **body):
    body = {"name": "Capital", "slug": "capital", "kind": "regex", **body}
    response = api.post("/api/v1/evaluators", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_it_makes_no_revision_when_the_same_configuration_is_put_again(api):
    create(api, parameters={"pattern": "^Par"}, outputs_schema=SCHEMA, examples=EXAMPLES)
    same = {"parameters": {"pattern": "^Par"}, "outputs_schema": SCHEMA, "examples": EXAMPLES}

    response = api.put("/api/v1/evaluators/capital", same, format="json")

    assert response.status_code == 200
    assert response.json()["head"]["version"] == 1
    assert EvaluatorRevision.objects.count() == 1


def test_it_makes_exactly_one_revision_when_the_schema_changes(api):
    create(api, parameters={"pattern": "^Par"}, outputs_schema=SCHEMA, examples=EXAMPLES)
    changed = {**SCHEMA, "required": ["success", "label"]}
    body = {"parameters": {"pattern": "^Par"}, "outputs_schema": changed, "examples": EXAMPLES}

    first = api.put("/api/v1/evaluators/capital", body, format="json")
    again = api.put("/api/v1/evaluators/capital", body, format="json")

    assert first.json()["head"]["schemas"]["outputs"] == changed
    assert again.json()["head"]["version"] == 2
    assert EvaluatorRevision.objects.count() == 2


def test_it_compares_parameters_after_filling_their_defaults(api):
    create(api, parameters={"pattern": "^Par"})
    stored = api.get("/api/v1/evaluators/capital").json()["head"]["parameters"]
    assert len(stored) > 1  # the defaults were filled in

    fewer = api.put(
        "/api/v1/evaluators/capital", {"parameters": {"pattern": "^Par"}}, format="json"
    )
    full = api.put("/api/v1/evaluators/capital", {"parameters": stored}, format="json")
    changed = api.put(
        "/api/v1/evaluators/capital", {"parameters": {"pattern": "^P"}}, format="json"
    )

    assert (fewer.json()["head"]["version"], full.json()["head"]["version"]) == (1, 1)
    assert changed.json()["head"]["version"] == 2
    assert EvaluatorRevision.objects.count() == 2


def test_it_says_which_outputs_schema_the_kind_derives(api):
    plain = create(api, parameters={"pattern": "^Par"})["head"]
    assert plain["kind_outputs_schema"] == plain["schemas"]["outputs"]

    given = create(api, slug="given", parameters={"pattern": "^Par"}, outputs_schema=SCHEMA)
    assert given["head"]["schemas"]["outputs"] == SCHEMA
    assert given["head"]["kind_outputs_schema"] == plain["schemas"]["outputs"]


def test_it_refuses_a_new_evaluator_whose_example_fails_when_examples_must_pass(api, project):
    failing = [{"name": "rome", "inputs": {}, "outputs": "Rome", "expected": {"success": True}}]

    response = api.post(
        "/api/v1/evaluators",
        {
            "name": "Capital",
            "kind": "regex",
            "parameters": {"pattern": "^Par"},
            "examples": EXAMPLES + failing,
            "examples_must_pass": True,
        },
        format="json",
    )

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "examples.1": ["rome: success False, expected True"]
    }
    assert not Evaluator.objects.exists()


def test_it_refuses_a_revision_whose_example_fails_when_examples_must_pass(api):
    create(api, parameters={"pattern": "^Par"}, examples=EXAMPLES)

    response = api.patch(
        "/api/v1/evaluators/capital",
        {"parameters": {"pattern": "^Rom"}, "name": "Renamed", "examples_must_pass": True},
        format="json",
    )

    assert response.status_code == 400
    assert "examples.0" in response.json()["error"]["fields"]
    assert EvaluatorRevision.objects.count() == 1
    assert Evaluator.objects.get().name == "Capital"


def test_it_keeps_a_revision_whose_example_fails_by_default(api):
    create(api, parameters={"pattern": "^Par"}, examples=EXAMPLES)

    response = api.patch(
        "/api/v1/evaluators/capital", {"parameters": {"pattern": "^Rom"}}, format="json"
    )

    assert response.status_code == 200
    assert response.json()["head"]["examples_report"][0]["passed"] is False
