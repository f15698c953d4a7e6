"""A testset with planted histories, built by real runs: a column application per run reads
that run's answers, and exact match judges them against ``correct_answer``."""

from __future__ import annotations

import pytest

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Application
from tests.runs.factories import make_testset

# Per case: the answer of each run (r1 .. r5); "Paris" is right, anything else wrong, None
# means the row has no answer for that run (the application errors, so the evaluator does).
PLANTED = {
    "stable pass": ["Paris", "Paris", "Paris", "Paris", "Paris"],
    "stable fail": ["Lyon", "Lyon", "Lyon", "Lyon", "Lyon"],
    "flaky": ["Paris", "Lyon", "Paris", "Paris", "Paris"],
    "regressed": ["Paris", "Paris", "Paris", "Lyon", "Paris"],
    "fixed": ["Lyon", "Lyon", "Lyon", "Paris", "Paris"],
    "errored": ["Paris", "Paris", "Paris", None, "Paris"],
}
CASES = list(PLANTED)  # testcase index -> name
MAIN = {"branch": "main"}
TAGS = [MAIN | {"commit": f"c{i}"} for i in range(1, 5)] + [{"branch": "feature", "commit": "f1"}]


def planted_rows() -> list[dict]:
    rows = []
    for name, answers in PLANTED.items():
        row = {"case": name, "correct_answer": "Paris"}
        row |= {f"r{i}": a for i, a in enumerate(answers, 1) if a is not None}
        rows.append(row)
    return rows


def column_run(project, version, revisions, column: str, tags: dict, name: str = ""):
    app = Application.objects.filter(project=project, slug=f"reads-{column}").first()
    app = app or application_create(
        project=project, name=f"Reads {column}", kind="column", config={"outputs_column": column}
    )
    run = run_create(
        project=project,
        name=name or f"run {column}",
        testset_version=version,
        application=app,
        revisions=revisions,
        tags=tags,
    )
    return run_execute_inline(run=run)


@pytest.fixture
def exact(project):
    return evaluator_create(project=project, kind="exact_match", name="Exact", slug="exact")


@pytest.fixture
def planted(project, exact):
    """Five finished runs of one testset: r1..r4 on branch main, r5 on a feature branch."""
    version = make_testset(project, planted_rows(), slug="planted")
    runs = [
        column_run(project, version, [exact.head], f"r{i}", tags) for i, tags in enumerate(TAGS, 1)
    ]
    return version.testset, runs
