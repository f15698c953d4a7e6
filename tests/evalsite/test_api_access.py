"""Project isolation, roles and the API key lifecycle through the REST API."""

from rest_framework.test import APIClient

from evalsite.models import ApiKey
from evaluators.services import evaluator_create


def test_it_answers_the_current_project_with_the_key_role(api, project):
    response = api.get("/api/v1/project")
    assert response.status_code == 200
    assert response.json()["slug"] == project.slug
    assert response.json()["role"] == "editor"


def test_it_refuses_a_missing_key():
    response = APIClient().get("/api/v1/project")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["status"] == response.status_code


def test_it_refuses_a_wrong_key(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer es_deadbeef_nope")
    response = client.get("/api/v1/project")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "Invalid API key."


def test_it_refuses_a_malformed_key(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer garbage")
    response = client.get("/api/v1/project")
    assert response.status_code == 401
    assert "Malformed" in response.json()["error"]["message"]


def test_it_creates_lists_and_revokes_keys_as_owner(project, owner):
    from tests.conftest import api_client_for

    client = api_client_for(project, owner, "owner")
    created = client.post("/api/v1/api-keys", {"name": "ci", "role": "viewer"}, format="json")
    assert created.status_code == 201
    raw = created.json()["key"]
    assert raw.startswith("es_")
    key = ApiKey.objects.get(pk=created.json()["id"])
    assert raw not in (key.key_hash, key.prefix)  # only the hash is stored

    listed = client.get("/api/v1/api-keys").json()["results"]
    assert all("key" not in item for item in listed)  # never shown again

    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert fresh.get("/api/v1/project").json()["role"] == "viewer"
    key.refresh_from_db()
    assert key.last_used_at is not None

    assert client.delete(f"/api/v1/api-keys/{key.pk}").status_code == 204
    revoked = fresh.get("/api/v1/project")
    assert revoked.status_code == 401
    assert "revoked" in revoked.json()["error"]["message"]


def test_it_forbids_key_management_to_an_editor(api):
    response = api.post("/api/v1/api-keys", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert "owner" in response.json()["error"]["message"]


def test_it_forbids_writes_to_a_viewer(viewer_api):
    response = viewer_api.post("/api/v1/evaluators", {"name": "x", "kind": "regex"}, format="json")
    assert response.status_code == 403


def test_it_lets_a_viewer_read(viewer_api, project, owner):
    evaluator_create(
        project=project, kind="regex", name="Has digits", parameters={"pattern": r"\d"}
    )
    response = viewer_api.get("/api/v1/evaluators")
    assert response.status_code == 200
    assert [e["slug"] for e in response.json()["results"]] == ["has-digits"]


def test_it_hides_another_projects_objects(outsider_api, project):
    evaluator = evaluator_create(
        project=project, kind="regex", name="Secret", parameters={"pattern": "x"}
    )
    assert outsider_api.get(f"/api/v1/evaluators/{evaluator.pk}").status_code == 404
    assert outsider_api.get("/api/v1/evaluators/secret").status_code == 404
    assert outsider_api.get("/api/v1/evaluators").json()["results"] == []
    response = outsider_api.patch(
        f"/api/v1/evaluators/{evaluator.pk}", {"name": "pwned"}, format="json"
    )
    assert response.status_code == 404
    evaluator.refresh_from_db()
    assert evaluator.name == "Secret"


def test_it_hides_another_projects_keys(outsider, other_project, project, owner):
    from tests.conftest import api_client_for

    victim_key = api_client_for(project, owner, "owner")
    mine = api_client_for(other_project, outsider, "owner")
    victim_id = ApiKey.objects.filter(project=project).first().pk
    assert mine.delete(f"/api/v1/api-keys/{victim_id}").status_code == 404
    assert victim_key.get("/api/v1/project").status_code == 200


def test_it_resolves_the_project_of_a_browser_session(client, owner, project, outsider):
    client.force_login(owner)
    assert client.get("/api/v1/project").json()["slug"] == "acme"
    assert client.get("/api/v1/project", HTTP_X_PROJECT="other").status_code == 404


def test_it_asks_a_member_of_several_projects_to_name_one(client, owner, project):
    from evalsite.services import project_create

    project_create(name="Second", slug="second", owner=owner)
    client.force_login(owner)
    response = client.get("/api/v1/project")
    assert response.status_code == 400
    assert "project" in response.json()["error"]["fields"]
    assert client.get("/api/v1/project?project=second").json()["slug"] == "second"


def test_it_names_the_field_of_a_malformed_body(api):
    response = api.post("/api/v1/evaluators", {"kind": "regex"}, format="json")
    assert response.status_code == 400
    assert "name" in response.json()["error"]["fields"]


def test_it_answers_invalid_json_with_a_400(api):
    response = api.post("/api/v1/evaluators", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"


def test_it_answers_a_nul_character_in_a_filter_with_a_400(api):
    response = api.get("/api/v1/annotations?trace_id=%00abc")
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]["message"]


def test_it_answers_a_row_deleted_under_a_request_with_a_404(api, project):
    from django.http import HttpRequest
    from rest_framework.request import Request

    from evalsite.rest import exception_handler
    from evaluators.models import Evaluator

    response = exception_handler(Evaluator.DoesNotExist(), {"request": Request(HttpRequest())})
    assert response.status_code == 404
    assert response.data["error"]["code"] == "not_found"
