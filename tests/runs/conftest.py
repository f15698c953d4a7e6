"""Fixtures the engine tests share: the capitals testset, a column application, exact match."""

import pytest

from evaluators.services import evaluator_create
from runs.applications import application_create
from tests.runs.factories import CAPITALS, make_testset


@pytest.fixture
def capitals(project):
    return make_testset(project, CAPITALS)


@pytest.fixture
def column_app(project):
    return application_create(
        project=project, name="Capital QA", kind="column", config={"outputs_column": "outputs"}
    )


@pytest.fixture
def exact(project):
    return evaluator_create(project=project, kind="exact_match", name="Exact").head
