"""Hostile input boundary: bodies and evaluator outputs built to crash the site get a 4xx or an
evaluation error naming the limit, never a 500."""

from __future__ import annotations

import io
import json

import pytest
from django.test import override_settings

from evalsite.jsonsafe import MAX_DEPTH
from evaluators.services import evaluation_invoke, evaluator_create

pytestmark = pytest.mark.django_db


def _deep_list(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_it_refuses_a_body_nested_five_thousand_levels_with_a_400_naming_the_limit(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        data=_deep_list(5000),
        content_type="application/json",
    )
    assert response.status_code == 400
    assert f"nested deeper than {MAX_DEPTH} levels" in response.json()["error"]["message"]


def test_it_refuses_a_body_nested_just_past_the_limit_on_any_endpoint(api):
    body = json.dumps({"name": "x", "kind": "exact_match", "parameters": {}}).replace(
        '{"name"', '{"deep": ' + _deep_list(MAX_DEPTH + 1) + ', "name"'
    )
    for path in ("/api/v1/evaluators", "/api/v1/testsets", "/api/v1/runs"):
        response = api.post(path, data=body, content_type="application/json")
        assert response.status_code == 400, path
        assert "nested deeper" in response.json()["error"]["message"]


def test_it_accepts_a_body_nested_to_the_limit(api):
    inner = _deep_list(MAX_DEPTH - 1)  # the body object is the first level
    body = '{"kind": "exact_match", "inputs": {"x": 1}, "outputs": ' + inner + "}"
    response = api.post("/api/v1/evaluators/invoke", data=body, content_type="application/json")
    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_it_refuses_non_json_constants_with_a_400(api, constant):
    body = '{"kind": "exact_match", "inputs": {}, "outputs": ' + constant + "}"
    response = api.post("/api/v1/evaluators/invoke", data=body, content_type="application/json")
    assert response.status_code == 400
    assert constant.lstrip("-") in response.json()["error"]["message"]


def test_it_refuses_a_body_over_the_size_limit_with_a_413_not_a_500(api):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10_000):
        response = api.post(
            "/api/v1/evaluators/invoke",
            data=json.dumps({"kind": "exact_match", "inputs": {}, "outputs": "x" * 20_000}),
            content_type="application/json",
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_an_evaluator_returning_a_list_nested_nine_hundred_levels_is_an_evaluation_error(api):
    code = (
        "def evaluate(inputs, outputs, trace):\n"
        "    value = []\n"
        "    for _ in range(900):\n"
        "        value = [value]\n"
        "    return {'score': 1, 'deep': value}\n"
    )
    response = api.post(
        "/api/v1/evaluators/invoke",
        data={
            "kind": "code",
            "parameters": {"runtime": "python", "code": code, "version": "2"},
            "inputs": {},
            "outputs": "x",
        },
        format="json",
    )
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "error"
    assert f"nested deeper than {MAX_DEPTH} levels" in result["error"]["message"]
    assert result["outputs"] is None


def test_an_evaluator_returning_a_dict_nested_past_the_limit_is_an_evaluation_error(project):
    value: dict = {}
    for _ in range(MAX_DEPTH + 5):
        value = {"next": value}
    result = evaluation_invoke(
        kind="code",
        parameters={
            "runtime": "python",
            "version": "2",
            "code": f"def evaluate(inputs, outputs, trace):\n    return {json.dumps(value)}\n",
        },
        inputs={},
        outputs="x",
        project=project,
    )
    assert result.status == "error"
    assert "nested deeper than" in result.error["message"]


def test_a_page_form_with_json_nested_five_thousand_levels_shows_an_inline_message(
    owner_client, project
):
    evaluator_create(project=project, kind="exact_match", name="E")
    response = owner_client.post(
        "/p/acme/evaluators/e/try",
        {"inputs": "{}", "outputs": _deep_list(5000)},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 400
    assert f"nested deeper than {MAX_DEPTH} levels" in response.content.decode()


def test_a_testset_file_nested_five_thousand_levels_is_refused_naming_the_limit(api):
    upload = io.BytesIO(("[" + _deep_list(5000) + "]").encode())
    upload.name = "rows.json"
    response = api.post("/api/v1/testsets", {"name": "deep", "file": upload}, format="multipart")
    assert response.status_code == 400
    assert "nested deeper than" in response.json()["error"]["message"]


@pytest.mark.parametrize("ref", ["¹", "²³", "٣"])
def test_a_reference_made_of_unicode_digits_is_not_found_rather_than_a_500(api, ref):
    # "¹".isdigit() is True and int("¹") raises: found by schemathesis.
    assert api.get(f"/api/v1/revisions/{ref}").status_code == 404
    assert api.get(f"/api/v1/evaluators/{ref}").status_code == 404
