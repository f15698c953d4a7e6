"""Pages and GET endpoints of runs only read: no INSERT, UPDATE or DELETE, no row or advisory
lock, no work queued, for a finished run and for one whose metrics are stale (a person corrected
a cell; the refresh is queued, not done). Their query counts do not grow with the scenarios."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline, scenario_annotate
from runs.models import RunMetrics
from tests.runs.factories import CAPITALS, make_testset

HTMX = {"HTTP_HX_REQUEST": "true"}
API = {"HTTP_X_PROJECT": "acme"}  # a session names its project; no API key to touch
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b|pg_advisory", re.I)


TABLE = {**HTMX, "HTTP_HX_TARGET": "run-scenarios"}
ROWS = {**HTMX, "HTTP_HX_TARGET": "compare-rows"}


def compared(base, cand) -> str:
    return f"compare?runs={base.pk},{cand.pk}"


# Each read: (url, headers) for a base run and a candidate run of the same testset.
READS = {
    "run-page": lambda b, c: (f"/p/acme/runs/{b.pk}/", {}),
    "run-table-fragment": lambda b, c: (f"/p/acme/runs/{b.pk}/", TABLE),
    "run-progress-fragment": lambda b, c: (f"/p/acme/runs/{b.pk}/progress", HTMX),
    "scenario-drill-in": lambda b, c: (f"/p/acme/runs/{b.pk}/scenarios/2/", {}),
    "compare-page": lambda b, c: (f"/p/acme/runs/{compared(b, c)}", {}),
    "compare-rows-fragment": lambda b, c: (f"/p/acme/runs/{compared(b, c)}", ROWS),
    "api-run": lambda b, c: (f"/api/v1/runs/{b.pk}", API),
    "api-run-scenarios": lambda b, c: (f"/api/v1/runs/{b.pk}/scenarios", API),
    "api-run-metrics": lambda b, c: (f"/api/v1/runs/{b.pk}/metrics", API),
    "api-compare": lambda b, c: (f"/api/v1/runs/{compared(b, c)}", API),
}


@pytest.fixture
def evaluators(project):
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    similar = evaluator_create(
        project=project, kind="similarity", name="Similar", parameters={"threshold": 0.5}
    ).head
    return [exact, similar]


@pytest.fixture
def make_pair(project, evaluators):
    """Two finished runs of one testset of ``rows`` rows: answers from the ``outputs`` column
    (half right) and from the ``correct_answer`` column (all right)."""
    apps = [
        application_create(
            project=project, name=f"From {c}", kind="column", config={"outputs_column": c}
        )
        for c in ("outputs", "correct_answer")
    ]

    def make(rows: int):
        data = [dict(CAPITALS[i % 4], n=i) for i in range(rows)]
        version = make_testset(project, data, slug=f"rows-{rows}")
        return tuple(
            run_execute_inline(
                run=run_create(
                    project=project, testset_version=version, application=app, revisions=evaluators
                )
            )
            for app in apps
        )

    return make


def made_stale(run, exact):
    """A person corrects Italy's exact cell: the cell changes, the stored metrics do not."""
    before = RunMetrics.objects.get(run=run, scenario=None).data
    italy = run.scenarios.get(index=2)
    scenario_annotate(run=run, scenario=italy, revision=exact, outputs={"success": True})
    assert RunMetrics.objects.get(run=run, scenario=None).data == before
    return run


@pytest.fixture(params=["finished", "stale"])
def make_read_pair(request, make_pair, evaluators):
    """A finished pair, or one whose base run's metrics are stale."""

    def make(rows: int):
        base, cand = make_pair(rows)
        if request.param == "stale":
            made_stale(base, evaluators[0])
        return base, cand

    return make


def session_bookkeeping(sql: str) -> bool:
    # project_view remembers the project a person looked at last in their session
    # (request.session["project"] = slug), so every project page saves django_session. That
    # is the session's own row, not the run's data; test_it_does_not_rewrite_the_session_...
    # below holds the page to not rewriting it when nothing changed.
    return '"django_session"' in sql


def writes(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if WRITE.search(q["sql"]) and not session_bookkeeping(q["sql"])
    ]


def get(client, url: str, headers: dict, capture) -> tuple[list[str], int]:
    """GET the url; returns the writes it issued and how many queries it made."""
    with CaptureQueriesContext(connection) as captured, capture() as queued:
        response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.content[:500])
    assert queued == [], f"{url} queued work after its commit"
    return writes(captured), len(captured)


def test_it_reads_without_writing(
    viewer_client, make_read_pair, django_capture_on_commit_callbacks
):
    base, cand = make_read_pair(4)
    found = {}
    for name, read in READS.items():
        url, headers = read(base, cand)
        for visit in ("first", "later"):
            issued, _ = get(viewer_client, url, headers, django_capture_on_commit_callbacks)
            if issued:
                found[f"{name}, {visit} visit"] = issued
    assert found == {}


def test_it_reads_in_queries_that_do_not_grow_with_the_scenarios(
    viewer_client, make_read_pair, django_capture_on_commit_callbacks
):
    pairs = {rows: make_read_pair(rows) for rows in (5, 50)}
    counts: dict[str, list[int]] = {}
    for name, read in READS.items():
        for pair in pairs.values():
            url, headers = read(*pair)
            get(viewer_client, url, headers, django_capture_on_commit_callbacks)  # warm caches
            _, count = get(viewer_client, url, headers, django_capture_on_commit_callbacks)
            counts.setdefault(name, []).append(count)
    assert len(counts) == len(READS) and all(five > 0 for five, _ in counts.values())
    grown = {name: f"{five} -> {fifty}" for name, (five, fifty) in counts.items() if five != fifty}
    assert grown == {}


def test_it_does_not_rewrite_the_session_when_the_project_did_not_change(viewer_client, make_pair):
    base, _ = make_pair(4)
    viewer_client.get(f"/p/acme/runs/{base.pk}/")  # the first visit remembers the project
    with CaptureQueriesContext(connection) as captured:
        viewer_client.get(f"/p/acme/runs/{base.pk}/progress", **HTMX)
    assert [q["sql"] for q in captured.captured_queries if WRITE.search(q["sql"])] == []
