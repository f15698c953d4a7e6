"""The whole API under schemathesis: every operation of the OpenAPI schema gets generated
requests (valid and invalid per the schema, a bounded number each) with an editor's key, and
none may answer with a server error."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from evalsite.models import Role
from evalsite.services import api_key_create
from evaluators.services import evaluator_create
from runs import testsets

EXAMPLES_PER_OPERATION = 5

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))


@pytest.fixture
def editor_key(project, editor, settings) -> str:
    # Examples that create runs send work to Celery: run it here, not on a worker that
    # outlives the test's transaction. Quotas have their own test; hypothesis calls in a loop.
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.EVALSITE_INTERACTIVE_SLOTS = 0
    evaluator_create(project=project, kind="exact_match", name="Exact")
    testsets.testset_create(
        project=project, name="Capitals", rows=[{"country": "France"}], author=editor
    )
    return api_key_create(project=project, name="fuzz", created_by=editor, role=Role.EDITOR)[1]


@pytest.fixture
def wsgi_app():
    # The WSGI handler closes the database connection after each request, and the test's
    # transaction lives on it: unhook that, as Django's own test client does.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_operation_answers_with_a_server_error(case, editor_key, wsgi_app):
    response = case.call(app=wsgi_app, headers={"Authorization": f"Bearer {editor_key}"})
    case.validate_response(response, checks=[not_a_server_error])
