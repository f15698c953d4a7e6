"""What the client tests share: a live evalsite with an editor's API key, the client on it,
and finished runs made in-process (a column application judged by exact match)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from evalsite_client import Client

from evalsite.models import Project, Role
from evalsite.services import api_key_create
from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Run
from tests.runs.factories import make_testset


@dataclass
class Site:
    url: str
    key: str
    project: Project

    @property
    def env(self) -> dict[str, str]:
        return {"EVALSITE_URL": self.url, "EVALSITE_API_KEY": self.key}


@pytest.fixture
def site(live_server, project, editor) -> Site:
    """The live server (a thread of this process, on the test database) and an editor's key."""
    _, key = api_key_create(project=project, name="cli", created_by=editor, role=Role.EDITOR)
    return Site(url=live_server.url, key=key, project=project)


@pytest.fixture
def remote(site) -> Client:
    with Client(site.url, site.key) as client:
        yield client


def questions(n: int, wrong: set[int] = frozenset()) -> list[dict]:
    """``n`` rows whose ``outputs`` column is the right answer except at the ``wrong`` indexes."""
    return [
        {"question": f"What is {i} + {i}?", "answer": str(2 * i), "outputs": str(2 * i)}
        | ({"outputs": "no idea"} if i in wrong else {})
        for i in range(n)
    ]


@pytest.fixture
def qa(project):
    """A testset ``qa``, a column application ``column`` and an exact-match evaluator
    ``exact`` (ground truth in ``answer``)."""
    version = make_testset(project, questions(40, wrong={3, 7}), slug="qa")
    app = application_create(
        project=project,
        name="Column",
        slug="column",
        kind="column",
        config={"outputs_column": "outputs"},
    )
    exact = evaluator_create(
        project=project,
        kind="exact_match",
        name="Exact",
        slug="exact",
        parameters={"correct_answer_key": "answer"},
    ).head
    return version, app, exact


def finished_run(project, version, app, revisions, *, name="run", tags=None) -> Run:
    """A run computed in this process (no worker), ended with its metrics."""
    run = run_create(
        project=project,
        name=name,
        testset_version=version,
        application=app,
        revisions=revisions,
        tags=tags or {},
    )
    return run_execute_inline(run=run)
