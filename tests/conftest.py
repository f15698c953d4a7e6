"""The cast every test can use: a project with an owner, an editor, a viewer, and an outsider
who owns another project. API clients authenticate with real API keys."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from evalsite.celery import app
from evalsite.models import Role
from evalsite.redis_client import client as redis_client
from evalsite.redis_client import glob_escape, site_key
from evalsite.services import api_key_create, membership_set, project_create, user_get_or_create

pytest_plugins = ["tests.servers", "tests.llm_server", "tests.workers"]


@pytest.fixture(scope="session", autouse=True)
def _no_keys_of_earlier_runs(django_db_setup, django_db_blocker):
    """Keys in the shared Redis carry the database's name, and every test run's database has
    the same one and starts its ids at 1 again: a debounce or a pending set an earlier run left
    would hold back or join this run's work."""
    with django_db_blocker.unblock():
        prefix = site_key("")
    client = redis_client()
    for key in client.scan_iter(match=glob_escape(prefix) + "*", count=1000):
        client.delete(key)


@pytest.fixture(autouse=True)
def _plain_static_files(settings):
    # Pages render {% static %} without a collectstatic manifest in tests.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def owner(db):
    return user_get_or_create(username="alice", password="pw-alice-123")


@pytest.fixture
def project(owner):
    return project_create(name="Acme QA", slug="acme", owner=owner)


@pytest.fixture
def editor(project):
    user = user_get_or_create(username="bob", password="pw-bob-123")
    membership_set(project=project, user=user, role=Role.EDITOR)
    return user


@pytest.fixture
def viewer(project):
    user = user_get_or_create(username="carol", password="pw-carol-123")
    membership_set(project=project, user=user, role=Role.VIEWER)
    return user


@pytest.fixture
def outsider(db):
    user = user_get_or_create(username="mallory", password="pw-mallory-123")
    project_create(name="Other Co", slug="other", owner=user)
    return user


@pytest.fixture
def other_project(outsider):
    return outsider.memberships.get().project


def api_client_for(project, user=None, role=Role.EDITOR) -> APIClient:
    _, raw = api_key_create(project=project, name="test", created_by=user, role=role)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def api(project, editor) -> APIClient:
    """An editor's API client in the project."""
    return api_client_for(project, editor, Role.EDITOR)


@pytest.fixture
def viewer_api(project, viewer) -> APIClient:
    return api_client_for(project, viewer, Role.VIEWER)


@pytest.fixture
def outsider_api(other_project, outsider) -> APIClient:
    return api_client_for(other_project, outsider, Role.OWNER)


@pytest.fixture
def owner_client(client, owner, project):
    client.force_login(owner)
    return client


@pytest.fixture
def editor_client(client, editor):
    client.force_login(editor)
    return client


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture
def outsider_client(client, outsider):
    client.force_login(outsider)
    return client


@pytest.fixture
def celery_eager(settings):
    """Tasks run inline where they are sent: nothing reaches the real broker. Ingested traces
    are due for online rules at once (the delay is the dispatch's to keep, and it runs now)."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.EVALSITE_ONLINE_DELAY_SECONDS = 0
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False
