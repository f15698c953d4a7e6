"""Management commands and the embedded start-up path."""

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from evalsite.management.commands.up import url_without_credentials
from evalsite.models import ApiKey, Project

ROOT = Path(__file__).resolve().parents[2]


def test_it_creates_project_user_and_key_from_the_command(db):
    out = StringIO()
    call_command("create_api_key", "--project", "ops", "--user", "robot", stdout=out)
    raw = out.getvalue().strip()
    project = Project.objects.get(slug="ops")
    assert project.role_of(ApiKey.objects.get(project=project).created_by) == "owner"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/project").json()["slug"] == "ops"


def test_it_loads_demo_data_idempotently(db):
    call_command("demo_data", stdout=StringIO())
    call_command("demo_data", stdout=StringIO())
    project = Project.objects.get(slug="demo")
    assert project.evaluators.count() >= 2
    assert project.memberships.filter(user__username="demo", role="owner").exists()


@pytest.mark.slow
def test_it_starts_embedded_postgres_and_redis_with_nothing_configured(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")
    }
    env["EVALSITE_DATA_DIR"] = str(tmp_path / "data")
    script = (
        "from evalsite.health import check_all; from django.conf import settings; "
        "print(settings.DATABASES['default']['HOST']); print(settings.CELERY_BROKER_URL); print(check_all())"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    host, broker, report = result.stdout.strip().splitlines()[-3:]
    assert host.startswith(str(tmp_path))
    assert broker.startswith("redis+socket://" + str(tmp_path))
    assert report == "{'database': 'ok', 'broker': 'ok'}"
    subprocess.run(["pkill", "-f", str(tmp_path)], check=False)


def test_it_fails_loudly_on_a_malformed_setting():
    env = {**os.environ, "DEBUG": "maybe"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in result.stderr


def test_it_prints_where_the_broker_is_without_its_credentials():
    assert url_without_credentials("amqp://alice:s3cret@rabbit.internal:5672//") == (
        "amqp://rabbit.internal:5672"
    )
    assert url_without_credentials("redis+socket:///srv/.data/redis/redis.sock") == (
        "redis+socket://local socket"
    )
