"""API keys resolved once per KEY_CACHE_SECONDS in a web process: a revoked or changed key,
project or user is looked up again at once in this process, and within the cache time
elsewhere; every request still checks the secret."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient, APIRequestFactory

from evalsite import auth
from evalsite.models import ApiKey, Project, Role
from evalsite.services import api_key_create


@pytest.fixture
def key(project, editor):
    key, raw = api_key_create(project=project, name="cached", created_by=editor, role=Role.EDITOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return key, raw, client


def key_lookups(queries) -> int:
    return sum(1 for query in queries if query["sql"].startswith('SELECT "evalsite_apikey"'))


def test_it_resolves_a_key_from_the_database_once_then_from_the_cache(key):
    _, _, client = key
    with CaptureQueriesContext(connection) as first:
        assert client.get("/api/v1/project").status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get("/api/v1/project").status_code == 200
    assert key_lookups(first.captured_queries) == 1
    assert key_lookups(second.captured_queries) == 0


def test_a_wrong_secret_behind_a_cached_prefix_is_refused(key):
    _, raw, client = key
    assert client.get("/api/v1/project").status_code == 200  # cached now
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION=f"Bearer {raw[:-4]}xxxx")
    response = forged.get("/api/v1/project")
    assert response.status_code == 401
    assert "Invalid API key" in response.json()["error"]["message"]


def test_a_key_revoked_in_this_process_stops_working_at_once(key):
    api_key, _, client = key
    assert client.get("/api/v1/project").status_code == 200
    api_key.revoke()
    response = client.get("/api/v1/project")
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_a_key_revoked_elsewhere_stops_working_within_the_cache_time(key, monkeypatch):
    monkeypatch.setattr(auth, "KEY_CACHE_SECONDS", 0.2)
    api_key, _, client = key
    assert client.get("/api/v1/project").status_code == 200
    # Another process revokes it: no signal reaches this one.
    ApiKey.objects.filter(pk=api_key.pk).update(revoked_at=timezone.now())
    assert client.get("/api/v1/project").status_code == 200  # still cached here
    time.sleep(0.3)
    assert client.get("/api/v1/project").status_code == 401


def test_a_role_changed_in_this_process_applies_at_once(key):
    api_key, _, client = key
    assert client.post("/api/v1/traces", {"spans": []}, format="json").status_code == 200
    api_key.role = Role.VIEWER
    api_key.save()
    response = client.post("/api/v1/traces", {"spans": []}, format="json")
    assert response.status_code == 403
    assert client.get("/api/v1/project").json()["role"] == "viewer"


def test_a_project_changed_in_this_process_is_read_fresh(key, project):
    _, _, client = key
    assert client.get("/api/v1/project").json()["name"] == "Acme QA"
    project.name = "Acme Support"
    project.save()
    assert client.get("/api/v1/project").json()["name"] == "Acme Support"


def test_requests_get_their_own_copies_of_the_cached_key_and_project(key):
    _, raw, _ = key
    factory = APIRequestFactory()

    def authenticated() -> ApiKey:
        request = factory.get("/api/v1/project", HTTP_AUTHORIZATION=f"Bearer {raw}")
        _, resolved = auth.ApiKeyAuthentication().authenticate(request)
        return resolved

    first, second = authenticated(), authenticated()
    assert first.pk == second.pk and first.project.pk == second.project.pk
    assert first is not second and first.project is not second.project
    first.project.name = "changed by one request"
    assert second.project.name == "Acme QA"
    assert authenticated().project.name == "Acme QA"


def test_a_deleted_project_takes_its_cached_keys_with_it(key, project):
    _, _, client = key
    assert client.get("/api/v1/project").status_code == 200
    Project.objects.filter(pk=project.pk).get().delete()
    assert client.get("/api/v1/project").status_code == 401
