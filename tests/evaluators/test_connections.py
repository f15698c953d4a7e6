"""Model connections: API, pages, admin, the encrypted key that never comes back, and the
"test connection" button."""

import pytest

from evaluators import crypto
from evaluators.judge.connections import model_connection_create
from evaluators.models import ModelConnection
from evaluators.services import evaluation_invoke
from tests.llm_server import MODEL_API_KEY, failure

HTMX = {"HTTP_HX_REQUEST": "true"}
NEW = {
    "name": "OpenAI prod",
    "base_url": "https://104.18.7.192/v1",  # a public address, no DNS needed
    "api_key": "sk-live-abcdefghijklmnop",
    "models": ["gpt-4o-mini", "gpt-4o"],
    "prices": {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}},
    "rate_limit_rpm": 500,
}


# --- API ----------------------------------------------------------------------------------------


def test_it_creates_a_connection_and_never_returns_the_key(api, project):
    response = api.post("/api/v1/model-connections", NEW, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["slug"] == "openai-prod"
    assert data["models"] == ["gpt-4o-mini", "gpt-4o"]
    assert data["has_api_key"] is True
    assert "api_key" not in data
    assert NEW["api_key"] not in response.content.decode()
    connection = ModelConnection.objects.get(slug="openai-prod")
    assert NEW["api_key"] not in connection.api_key_encrypted
    assert connection.api_key() == NEW["api_key"]
    for url in ("/api/v1/model-connections", "/api/v1/model-connections/openai-prod"):
        body = api.get(url).content.decode()
        assert "openai-prod" in body
        assert NEW["api_key"] not in body and connection.api_key_encrypted not in body


def test_an_update_keeps_replaces_or_removes_the_key(api, llm_connection):
    url = f"/api/v1/model-connections/{llm_connection.slug}"
    assert api.patch(url, {"rate_limit_rpm": 50, "api_key": ""}, format="json").status_code == 200
    llm_connection.refresh_from_db()
    assert llm_connection.rate_limit_rpm == 50
    assert llm_connection.api_key() == MODEL_API_KEY
    llm_connection.mark_failing("HTTP 401")
    response = api.patch(url, {"api_key": "sk-new"}, format="json")
    assert response.json()["failing_reason"] == ""
    llm_connection.refresh_from_db()
    assert llm_connection.api_key() == "sk-new"
    api.patch(url, {"clear_api_key": True}, format="json")
    llm_connection.refresh_from_db()
    assert not llm_connection.has_api_key


def test_it_validates_the_settings(api, project):
    bad = {**NEW, "base_url": "ftp://104.18.7.192", "prices": {"gpt-4o": {"prompt": -1}}}
    response = api.post("/api/v1/model-connections", bad, format="json")
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert "base_url" in fields
    assert any(name.startswith("prices.gpt-4o") for name in fields)
    assert not ModelConnection.objects.exists()


def test_it_refuses_private_addresses_unless_allowed(api, settings):
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = False
    response = api.post(
        "/api/v1/model-connections", {**NEW, "base_url": "http://127.0.0.1:11434/v1"}, format="json"
    )
    assert response.status_code == 400
    assert "EVALSITE_MODELS_ALLOW_PRIVATE" in response.json()["error"]["fields"]["base_url"][0]
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = True
    response = api.post(
        "/api/v1/model-connections", {**NEW, "base_url": "http://127.0.0.1:11434/v1"}, format="json"
    )
    assert response.status_code == 201


def test_slugs_are_unique_in_a_project(api, llm_connection):
    response = api.post(
        "/api/v1/model-connections",
        {**NEW, "slug": "local", "base_url": llm_connection.base_url},
        format="json",
    )
    assert response.status_code == 400
    assert "slug" in response.json()["error"]["fields"]


def test_viewers_read_editors_write_outsiders_see_nothing(viewer_api, outsider_api, llm_connection):
    assert viewer_api.get("/api/v1/model-connections/local").status_code == 200
    assert viewer_api.delete("/api/v1/model-connections/local").status_code == 403
    assert outsider_api.get("/api/v1/model-connections/local").status_code == 404
    assert outsider_api.get("/api/v1/model-connections").json()["results"] == []


def test_deleting_a_connection(api, llm_connection):
    assert api.delete("/api/v1/model-connections/local").status_code == 204
    assert not ModelConnection.objects.exists()


def test_the_test_action_calls_the_model(api, llm_connection, llm_server):
    llm_server.answer = "OK"
    response = api.post("/api/v1/model-connections/local/test", {}, format="json")
    assert response.status_code == 200
    data = response.json()
    assert data["ok"] is True and data["model"] == "judge-1" and data["answer"] == "OK"
    assert data["tokens"] == {"prompt": 100, "completion": 20}
    body = llm_server.calls[0].json()
    assert body["max_tokens"] == 16 and "response_format" not in body


def test_a_refused_key_marks_the_connection_failing_with_its_reason(
    api, llm_connection, llm_server
):
    llm_server.answer = failure(401, "Incorrect API key provided: sk-tes***")
    data = api.post(
        "/api/v1/model-connections/local/test", {"model": "judge-2"}, format="json"
    ).json()
    assert data["ok"] is False
    assert data["error"]["code"] == "connection_auth_failed"
    connection = api.get("/api/v1/model-connections/local").json()
    assert "HTTP 401" in connection["failing_reason"]
    assert "Incorrect API key provided" in connection["failing_reason"]
    llm_server.answer = "OK"
    assert api.post("/api/v1/model-connections/local/test", {}, format="json").json()["ok"] is True
    assert api.get("/api/v1/model-connections/local").json()["failing_reason"] == ""


def test_an_unreachable_endpoint_is_reported(api, project, settings):
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = True
    model_connection_create(
        project=project, name="Dead", base_url="http://127.0.0.1:9/v1", model_names=["m"]
    )
    data = api.post("/api/v1/model-connections/dead/test", {}, format="json").json()
    assert data["ok"] is False
    assert data["error"]["code"] == "model_unreachable"


# --- encryption ---------------------------------------------------------------------------------


def test_keys_are_encrypted_with_a_key_derived_from_the_secret(settings):
    token = crypto.encrypt("sk-one")
    assert "sk-one" not in token
    assert crypto.decrypt(token) == "sk-one"
    settings.EVALSITE_ENCRYPTION_KEY = "a-dedicated-key"
    assert crypto.decrypt(token) == "sk-one"  # SECRET_KEY stays a fallback
    newer = crypto.encrypt("sk-two")
    settings.EVALSITE_ENCRYPTION_KEY = ""
    with pytest.raises(crypto.UndecryptableKey):
        crypto.decrypt(newer)


def test_a_key_that_no_longer_decrypts_is_a_clear_error(
    project, llm_connection, llm_server, settings
):
    settings.SECRET_KEY = "a-completely-different-secret"
    result = evaluation_invoke(
        kind="llm_judge",
        parameters={"connection": "local"},
        inputs={"correct_answer": "x"},
        outputs="x",
        project=project,
    )
    assert result.error["code"] == "no_key"
    assert "Enter the key again" in result.error["message"]
    assert llm_server.calls == []


# --- pages --------------------------------------------------------------------------------------


def test_the_list_page_and_its_fragment(owner_client, llm_connection):
    page = owner_client.get("/p/acme/connections/").content.decode()
    assert "<html" in page and "Local" in page and "judge-1, judge-2" in page
    assert 'href="/p/acme/connections/"' in page  # the nav link
    fragment = owner_client.get("/p/acme/connections/", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="connection-table">')
    assert "<html" not in fragment and "Local" in fragment


def test_a_connection_is_added_from_the_page(editor_client, project, llm_server):
    response = editor_client.post(
        "/p/acme/connections/new",
        {
            "name": "Local vLLM",
            "base_url": llm_server.url,
            "api_key": "sk-from-the-page",
            "model_names": "llama-3\nqwen-2",
            "prices": '{"llama-3": {"prompt": 0.1, "completion": 0.2}}',
            "rate_limit_rpm": 120,
            "timeout_seconds": 30,
        },
    )
    assert response.status_code == 302
    connection = ModelConnection.objects.get(slug="local-vllm")
    assert connection.model_names == ["llama-3", "qwen-2"]
    assert connection.api_key() == "sk-from-the-page"
    page = editor_client.get(response["Location"]).content.decode()
    assert "sk-from-the-page" not in page and connection.api_key_encrypted not in page
    assert "key set" in page


def test_the_edit_page_never_renders_the_key_and_keeps_it_when_left_empty(
    owner_client, llm_connection
):
    page = owner_client.get("/p/acme/connections/local/").content.decode()
    assert MODEL_API_KEY not in page and llm_connection.api_key_encrypted not in page
    form = {
        "name": "Local",
        "slug": "local",
        "base_url": llm_connection.base_url,
        "api_key": "",
        "model_names": "judge-1",
        "prices": "",
        "rate_limit_rpm": 60,
        "timeout_seconds": 5,
    }
    assert owner_client.post("/p/acme/connections/local/", form).status_code == 302
    llm_connection.refresh_from_db()
    assert llm_connection.api_key() == MODEL_API_KEY
    assert llm_connection.rate_limit_rpm == 60


def test_the_page_shows_form_errors(owner_client, llm_connection):
    response = owner_client.post(
        "/p/acme/connections/local/",
        {
            "name": "Local",
            "base_url": "not a url",
            "prices": "{",
            "rate_limit_rpm": 1,
            "timeout_seconds": 5,
        },
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "Not valid JSON" in page


def test_the_test_button_answers_with_a_fragment(owner_client, llm_connection, llm_server):
    llm_server.answer = "OK"
    fragment = owner_client.post("/p/acme/connections/local/test", {"model": "judge-2"}, **HTMX)
    html = fragment.content.decode()
    assert html.strip().startswith('<section class="card" id="connection-test">')
    assert "<html" not in html and "judge-2" in html and "badge-success" in html
    assert llm_server.calls[0].json()["model"] == "judge-2"


def test_the_test_button_works_without_javascript(owner_client, llm_connection, llm_server):
    llm_server.answer = failure(403, "model not allowed for this key")
    page = owner_client.post("/p/acme/connections/local/test", {}).content.decode()
    assert "<html" in page
    assert "connection_auth_failed" in page and "model not allowed" in page
    assert "Failing since" not in page or "HTTP 403" in page
    assert "HTTP 403" in owner_client.get("/p/acme/connections/local/").content.decode()


def test_viewers_see_connections_but_cannot_change_them(viewer_client, llm_connection):
    page = viewer_client.get("/p/acme/connections/local/").content.decode()
    assert "Test connection" not in page and "Delete this connection" not in page
    assert viewer_client.post("/p/acme/connections/local/delete").status_code == 403
    assert viewer_client.post("/p/acme/connections/local/test").status_code == 403


def test_outsiders_get_404(outsider_client, llm_connection):
    assert outsider_client.get("/p/acme/connections/").status_code == 404
    assert outsider_client.get("/p/acme/connections/local/").status_code == 404


def test_a_connection_is_deleted_from_the_page(owner_client, llm_connection):
    response = owner_client.post("/p/acme/connections/local/delete")
    assert response.status_code == 302
    assert not ModelConnection.objects.exists()


# --- admin --------------------------------------------------------------------------------------


def test_the_admin_never_shows_the_key(client, llm_connection, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(admin)
    page = client.get(f"/admin/evaluators/modelconnection/{llm_connection.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert MODEL_API_KEY not in html and llm_connection.api_key_encrypted not in html
    listing = client.get("/admin/evaluators/modelconnection/").content.decode()
    assert "Local" in listing and MODEL_API_KEY not in listing
