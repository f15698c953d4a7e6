"""Secrets boundary: the header values of webhook evaluators and HTTP applications are sealed at
rest, write-only for people (API, pages, admin), and unsealed only for the call that sends them.
Encryption keys rotate; SECRET_KEY is never a predictable value."""

from __future__ import annotations

import html
import importlib
import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from evaluators import crypto
from evaluators.crypto import MASK
from evaluators.judge.connections import model_connection_create
from evaluators.models import EvaluatorRevision, ModelConnection
from evaluators.services import evaluation_invoke, evaluator_create, evaluator_revise
from runs.applications import application_create, invoke_many
from runs.models import Application
from tests.servers import Reply

TOKEN = "Bearer tok-3f9c1d-very-secret"
NEW_TOKEN = "Bearer tok-77aa02-rotated"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def private_allowed(settings):
    settings.EVALSITE_WEBHOOK_ALLOW_PRIVATE = True
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True


@pytest.fixture
def webhook(project, http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, {"score": 1.0, "success": True})
    return evaluator_create(
        project=project,
        kind="webhook",
        name="Hook",
        parameters={"url": http_server.url, "headers": {"Authorization": TOKEN, "X-Team": "qa"}},
    )


def _raw(sql: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk])
        return cursor.fetchone()[0]


def _sent(http_server, webhook) -> str:
    result = evaluation_invoke(revision=webhook.head, inputs={}, outputs="x")
    assert result.status == "success", result.error
    return http_server.requests[-1].headers["Authorization"]


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- at rest ------------------------------------------------------------------------------------


def test_it_stores_a_webhook_header_sealed(webhook):
    stored = _raw(
        "SELECT parameters::text FROM evaluators_evaluatorrevision WHERE id = %s", webhook.head_id
    )
    assert "tok-3f9c1d" not in stored and "very-secret" not in stored
    headers = webhook.head.parameters["headers"]
    assert set(headers) == {"Authorization", "X-Team"}
    assert all(value.startswith(crypto.SEALED) for value in headers.values())


def test_it_stores_an_http_applications_header_sealed(project, http_server):
    app = application_create(
        project=project,
        name="Bot",
        kind="http",
        config={"url": http_server.url, "headers": {"Authorization": TOKEN}},
    )
    stored = _raw("SELECT config::text FROM runs_application WHERE id = %s", app.pk)
    assert "tok-3f9c1d" not in stored and crypto.SEALED in stored


def test_the_data_migrations_seal_headers_stored_in_plain_text(webhook, project, http_server):
    EvaluatorRevision.objects.filter(pk=webhook.head_id).update(
        parameters={**webhook.head.parameters, "headers": {"Authorization": TOKEN}}
    )
    app = application_create(project=project, name="Bot", kind="http", config={"url": "http://a"})
    Application.objects.filter(pk=app.pk).update(
        config={**app.config, "headers": {"Authorization": TOKEN}}
    )
    importlib.import_module("evaluators.migrations.0004_seal_webhook_headers").seal_headers(
        django_apps, None
    )
    importlib.import_module("runs.migrations.0004_seal_application_headers").seal_headers(
        django_apps, None
    )
    sql = "SELECT parameters::text FROM evaluators_evaluatorrevision WHERE id = %s"
    assert "tok-3f9c1d" not in _raw(sql, webhook.head_id)
    assert "tok-3f9c1d" not in _raw(
        "SELECT config::text FROM runs_application WHERE id = %s", app.pk
    )
    webhook.head.refresh_from_db()
    assert _sent(http_server, webhook) == TOKEN


# --- what people see ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["api", "viewer_api"])
def test_the_api_shows_each_header_name_and_never_the_value(request, webhook, who):
    client = request.getfixturevalue(who)
    for url in (
        "/api/v1/evaluators",
        "/api/v1/evaluators/hook",
        "/api/v1/evaluators/hook/revisions",
        f"/api/v1/revisions/{webhook.head.slug}",
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert "tok-3f9c1d" not in body and crypto.SEALED not in body, url
    head = client.get("/api/v1/evaluators/hook").json()["head"]
    assert head["parameters"]["headers"] == {"Authorization": MASK, "X-Team": MASK}


def test_the_settings_template_marks_headers_sealed(api):
    template = api.get("/api/v1/kinds/webhook").json()["settings_template"]
    assert template["properties"]["headers"]["x-sealed"] is True


def test_the_openapi_schema_says_headers_are_write_only(api):
    schema = api.get("/api/schema/?format=json").content.decode()
    assert "never the value" in schema and "keeps the stored one" in schema


def test_the_pages_never_show_the_value(webhook, owner, viewer, http_server):
    evaluator_revise(
        evaluator=webhook,
        parameters={"url": http_server.url, "headers": {"Authorization": NEW_TOKEN}},
    )
    for user in (owner, viewer):
        client = _client_for(user)
        for url in (
            "/p/acme/evaluators/",
            "/p/acme/evaluators/hook/",
            "/p/acme/evaluators/hook/diff?a=1&b=2",
        ):
            page = client.get(url).content.decode()
            assert "tok-3f9c1d" not in page and "tok-77aa02" not in page, url
            assert crypto.SEALED not in page, url
    detail = _client_for(owner).get("/p/acme/evaluators/hook/").content.decode()
    assert MASK in detail


def test_the_diff_says_a_header_changed_without_showing_it(webhook, owner_client, http_server):
    evaluator_revise(
        evaluator=webhook,
        parameters={"url": http_server.url, "headers": {"Authorization": NEW_TOKEN}},
    )
    page = owner_client.get("/p/acme/evaluators/hook/diff?a=1&b=2").content.decode()
    assert f"{MASK} (changed)" in page
    assert "X-Team" in page  # removed: the name shows, never a value
    assert "tok-" not in page


def test_the_admin_never_shows_the_value(webhook, project, http_server):
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
    app = application_create(
        project=project,
        name="Bot",
        kind="http",
        config={"url": http_server.url, "headers": {"Authorization": TOKEN}},
    )
    client = _client_for(admin)
    for url in (
        f"/admin/evaluators/evaluatorrevision/{webhook.head_id}/change/",
        f"/admin/runs/application/{app.pk}/change/",
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        page = response.content.decode()
        assert "tok-3f9c1d" not in page and crypto.SEALED not in page, url
        assert "Authorization" in page, url


def test_applications_show_header_names_only(project, api, viewer_client, http_server):
    response = api.post(
        "/api/v1/applications",
        {
            "name": "Bot",
            "kind": "http",
            "config": {"url": http_server.url, "headers": {"Authorization": TOKEN}},
        },
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["config"]["headers"] == {"Authorization": MASK}
    listed = api.get("/api/v1/applications").content.decode()
    page = viewer_client.get("/p/acme/applications/").content.decode()
    for body in (listed, page):
        assert "tok-3f9c1d" not in body and crypto.SEALED not in body
        assert "Authorization" in body


# --- at the point of use ----------------------------------------------------------------------------


def test_the_webhook_receives_the_real_header_value(webhook, http_server):
    assert _sent(http_server, webhook) == TOKEN
    assert http_server.requests[-1].headers["X-Team"] == "qa"
    assert "headers" not in http_server.requests[-1].json()["parameters"]


def test_an_http_application_receives_the_real_header_value(project, http_server, private_allowed):
    http_server.handler = lambda request: Reply(200, {"outputs": "ok"})
    app = application_create(
        project=project,
        name="Bot",
        kind="http",
        config={"url": http_server.url, "headers": {"Authorization": TOKEN}},
    )
    [invocation] = invoke_many(app, [{"q": 1}])
    assert invocation.ok, invocation.error
    assert http_server.requests[0].headers["Authorization"] == TOKEN


def test_a_pasted_sealed_value_is_sent_as_typed_never_decrypted(webhook, api, http_server):
    stolen = webhook.head.parameters["headers"]["Authorization"]
    response = api.post(
        "/api/v1/evaluators/invoke",
        {
            "kind": "webhook",
            "parameters": {"url": http_server.url, "headers": {"Authorization": stolen}},
            "outputs": "x",
        },
        format="json",
    )
    assert response.json()["status"] == "success"
    assert http_server.requests[-1].headers["Authorization"] == stolen


# --- updates ------------------------------------------------------------------------------------


def test_the_mask_keeps_the_stored_secret(webhook, api, http_server):
    head = api.get("/api/v1/evaluators/hook").json()["head"]["parameters"]
    response = api.put(
        "/api/v1/evaluators/hook", {"parameters": {**head, "threshold": 0.9}}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["head"]["version"] == 2
    webhook.refresh_from_db()
    assert _sent(http_server, webhook) == TOKEN


def test_sending_back_what_was_read_makes_no_new_revision(webhook, api):
    head = api.get("/api/v1/evaluators/hook").json()["head"]["parameters"]
    assert (
        api.put("/api/v1/evaluators/hook", {"parameters": head}, format="json").status_code == 200
    )
    assert (
        api.patch("/api/v1/evaluators/hook", {"parameters": {}}, format="json").status_code == 200
    )
    assert webhook.revisions.count() == 1


def test_a_new_value_replaces_the_secret_with_a_new_revision(webhook, api, http_server):
    api.patch(
        "/api/v1/evaluators/hook",
        {"parameters": {"headers": {"Authorization": NEW_TOKEN, "X-Team": MASK}}},
        format="json",
    )
    webhook.refresh_from_db()
    assert webhook.head.version == 2
    assert _sent(http_server, webhook) == NEW_TOKEN
    assert http_server.requests[-1].headers["X-Team"] == "qa"


def test_removing_a_name_removes_its_secret(webhook, api, http_server):
    api.patch(
        "/api/v1/evaluators/hook",
        {"parameters": {"headers": {"X-Team": MASK}}},
        format="json",
    )
    webhook.refresh_from_db()
    assert list(webhook.head.parameters["headers"]) == ["X-Team"]
    evaluation_invoke(revision=webhook.head, inputs={}, outputs="x")
    assert "Authorization" not in http_server.requests[-1].headers
    assert http_server.requests[-1].headers["X-Team"] == "qa"


def test_the_mask_with_nothing_stored_is_refused(project, api, http_server):
    response = api.post(
        "/api/v1/evaluators",
        {
            "name": "Hook",
            "kind": "webhook",
            "parameters": {"url": http_server.url, "headers": {"Authorization": MASK}},
        },
        format="json",
    )
    assert response.status_code == 400
    assert "parameters.headers" in response.json()["error"]["fields"]


def test_the_settings_page_saves_the_masked_form_keeping_the_secret(
    webhook, owner_client, http_server
):
    page = html.unescape(owner_client.get("/p/acme/evaluators/hook/").content.decode())
    assert f'"Authorization": "{MASK}"' in page
    response = owner_client.post(
        "/p/acme/evaluators/hook/save",
        {
            "p__url": http_server.url,
            "p__headers": f'{{"Authorization": "{MASK}", "X-Team": "{MASK}"}}',
            "p__config": "{}",
            "p__threshold": "0.8",
            "message": "stricter",
        },
    )
    assert response.status_code == 302
    webhook.refresh_from_db()
    assert webhook.head.version == 2 and webhook.head.parameters["threshold"] == 0.8
    assert _sent(http_server, webhook) == TOKEN


def test_a_value_the_http_client_would_quote_in_its_error_is_refused(project, api, http_server):
    response = api.post(
        "/api/v1/evaluators",
        {
            "name": "Hook",
            "kind": "webhook",
            "parameters": {"url": http_server.url, "headers": {"Authorization": TOKEN + " "}},
        },
        format="json",
    )
    assert response.status_code == 400
    assert "tok-3f9c1d" not in response.content.decode()


def test_trying_the_masked_draft_sends_the_stored_secret(webhook, owner_client, http_server):
    response = owner_client.post(
        "/p/acme/evaluators/hook/try",
        {
            "p__url": http_server.url,
            "p__headers": f'{{"Authorization": "{MASK}"}}',
            "p__config": "{}",
            "inputs": "{}",
            "outputs": '"x"',
            "trace": "null",
        },
    )
    assert response.status_code == 200
    assert http_server.requests[-1].headers["Authorization"] == TOKEN
    assert "tok-3f9c1d" not in response.content.decode()


# --- rotation -----------------------------------------------------------------------------------


def test_keys_rotate_and_the_command_re_encrypts_everything(
    project, settings, http_server, private_allowed
):
    http_server.handler = lambda request: Reply(200, {"score": 1.0, "outputs": "ok"})
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = True
    settings.EVALSITE_ENCRYPTION_KEY = ["key-A-" + "a" * 32]
    hook = evaluator_create(
        project=project,
        kind="webhook",
        name="Hook",
        parameters={"url": http_server.url, "headers": {"Authorization": TOKEN}},
    )
    app = application_create(
        project=project,
        name="Bot",
        kind="http",
        config={"url": http_server.url, "headers": {"Authorization": TOKEN}},
    )
    model = model_connection_create(
        project=project, name="M", base_url="http://127.0.0.1:9/v1", api_key="sk-model-1"
    )

    settings.EVALSITE_ENCRYPTION_KEY = ["key-B-" + "b" * 32, "key-A-" + "a" * 32]
    assert _sent(http_server, hook) == TOKEN  # old ciphertexts still read
    newer = crypto.seal("written-under-B")
    settings.EVALSITE_ENCRYPTION_KEY = ["key-A-" + "a" * 32]
    with pytest.raises(crypto.UndecryptableKey):
        crypto.unseal(newer)  # new writes use B

    settings.EVALSITE_ENCRYPTION_KEY = ["key-B-" + "b" * 32, "key-A-" + "a" * 32]
    out = io.StringIO()
    call_command("rotate_encryption_key", stdout=out)
    assert "evaluator revisions: 1 re-encrypted" in out.getvalue()
    assert "applications: 1 re-encrypted" in out.getvalue()

    settings.EVALSITE_ENCRYPTION_KEY = ["key-B-" + "b" * 32]  # A is gone
    hook.head.refresh_from_db()
    app.refresh_from_db()
    assert _sent(http_server, hook) == TOKEN
    [invocation] = invoke_many(app, [{}])
    assert invocation.ok and http_server.requests[-1].headers["Authorization"] == TOKEN
    assert ModelConnection.objects.get(pk=model.pk).api_key() == "sk-model-1"


def test_the_rotate_command_names_what_no_key_decrypts(project, settings, http_server):
    settings.EVALSITE_ENCRYPTION_KEY = ["key-A-" + "a" * 32]
    evaluator_create(
        project=project,
        kind="webhook",
        name="Hook",
        parameters={"url": http_server.url, "headers": {"Authorization": TOKEN}},
    )
    settings.EVALSITE_ENCRYPTION_KEY = ["key-B-" + "b" * 32]
    with pytest.raises(CommandError, match="evaluator revision"):
        call_command("rotate_encryption_key", stdout=io.StringIO())


# --- SECRET_KEY ---------------------------------------------------------------------------------


def _settings_in_a_clean_env(data_dir: Path, **extra: str) -> subprocess.CompletedProcess:
    """Load the settings in a new process with DEBUG=0 and no SECRET_KEY."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "DEBUG": "0",
        "EVALSITE_DATA_DIR": str(data_dir),
        "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://u@127.0.0.1:5432/x"),
        "CELERY_BROKER_URL": os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
        **extra,
    }
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'evalsite.settings'; "
        "from django.conf import settings; print(settings.SECRET_KEY)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_without_secret_key_the_site_makes_a_random_one_in_its_data_folder(tmp_path):
    first = _settings_in_a_clean_env(tmp_path / "a")
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert len(key) >= 50 and str(ROOT) not in key
    stored = tmp_path / "a" / "secret_key"
    assert stored.read_text().strip() == key
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert _settings_in_a_clean_env(tmp_path / "a").stdout.strip() == key  # kept
    assert _settings_in_a_clean_env(tmp_path / "b").stdout.strip() != key  # never predictable


def test_a_required_secret_key_that_is_missing_stops_start_up(tmp_path):
    result = _settings_in_a_clean_env(tmp_path, EVALSITE_REQUIRE_SECRET_KEY="1")
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr
    assert not (tmp_path / "secret_key").exists()
