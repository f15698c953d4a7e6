"""Seed 002's second half: a code evaluator whose revision has no outputs schema still gets
columns and metrics (inferred from every output), and the backfill page repairs it for good."""

import pytest

from evaluators.models import EvaluatorRevision
from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Run
from tests.runs.factories import CAPITALS, make_testset

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def _eager(settings):
    from evalsite.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def legacy_run(project):
    """A dict-returning code evaluator (score, success, label) run over the capitals."""
    version = make_testset(project, CAPITALS)
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    evaluator = evaluator_create(
        project=project, kind="code", name="Quality", preset="multi_metric"
    )
    assert evaluator.head.outputs_schema is None
    run = run_create(
        project=project, testset_version=version, application=app, revisions=[evaluator.head]
    )
    return run_execute_inline(run=run), evaluator.head


def test_it_infers_columns_and_metrics_without_a_schema(legacy_run):
    run, revision = legacy_run
    names = {m["column"]["name"] for m in run.mappings}
    assert {"quality.score", "quality.success", "quality.label", "quality.length"} <= names
    data = run.metrics.get(scenario=None).data[f"evaluator-{revision.slug}"]
    assert data["score"]["mean"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert data["success"]["rate"] == 0.5
    assert {f["value"] for f in data["label"]["frequencies"]} == {"exact", "wrong"}
    assert data["length"]["type"] == "discrete"


def test_it_lists_revisions_without_a_schema_with_their_use(owner_client, legacy_run):
    _, revision = legacy_run
    page = owner_client.get("/p/acme/schemas/").content.decode()
    assert revision.slug in page and "missing" in page
    candidates = owner_client.get("/api/v1/schemas/backfill").json()
    row = next(c for c in candidates if c["revision"]["slug"] == revision.slug)
    assert (row["annotations"], row["runs"]) == (4, 1)


def test_it_shows_the_inferred_schema_with_agreement(owner_client, legacy_run):
    _, revision = legacy_run
    body = owner_client.get(f"/api/v1/revisions/{revision.slug}/schema").json()
    props = body["schema"]["properties"]
    assert props["score"]["type"] == "number" and props["success"]["type"] == "boolean"
    assert props["label"] == {"type": "string", "enum": ["exact", "wrong"]}
    assert props["length"]["type"] == "integer"
    assert all(f["agree"] == 4 for f in body["fields"])


def test_it_applies_a_schema_once_and_refreshes_the_runs(
    owner_client, owner, legacy_run, django_capture_on_commit_callbacks
):
    run, revision = legacy_run
    schema = owner_client.get(f"/api/v1/revisions/{revision.slug}/schema").json()["schema"]
    schema["properties"]["label"]["enum"].append("partial")
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_client.post(
            f"/api/v1/revisions/{revision.slug}/schema",
            {"schema": schema},
            content_type="application/json",
        )
    assert response.status_code == 200
    revision = EvaluatorRevision.objects.get(pk=revision.pk)
    assert revision.outputs_schema == schema
    assert revision.schema_inferred_by == owner and revision.schema_inferred_at
    assert response.json()["progress"]["total"] == 1
    again = owner_client.get(f"/api/v1/revisions/{revision.slug}/schema").json()
    assert again["progress"] == {"total": 1, "done": 1}
    run = Run.objects.get(pk=run.pk)
    assert run.metrics_refreshed_at >= revision.schema_inferred_at
    stamp = revision.schema_inferred_at
    owner_client.post(
        f"/api/v1/revisions/{revision.slug}/schema",
        {"schema": schema},
        content_type="application/json",
    )
    assert (
        EvaluatorRevision.objects.get(pk=revision.pk).schema_inferred_at == stamp
    )  # twice: no change


def test_it_lists_outputs_that_disagree_instead_of_dropping_them(owner_client, legacy_run):
    _, revision = legacy_run
    schema = {
        "type": "object",
        "properties": {"score": {"type": "number"}, "label": {"type": "string", "enum": ["exact"]}},
    }
    response = owner_client.post(
        f"/api/v1/revisions/{revision.slug}/schema",
        {"schema": schema},
        content_type="application/json",
    )
    disagreeing = response.json()["disagreeing"]
    assert (disagreeing["count"], disagreeing["checked"]) == (2, 4)
    assert disagreeing["examples"][0]["where"] == "label"


def test_it_refuses_an_invalid_schema_inline(owner_client, legacy_run):
    _, revision = legacy_run
    response = owner_client.post(
        f"/p/acme/schemas/{revision.slug}/",
        {"schema": '{"type": "object", "properties": {"a": {"type": 12}}}'},
    )
    assert response.status_code == 400
    assert "Not a valid JSON Schema" in response.content.decode()
    assert EvaluatorRevision.objects.get(pk=revision.pk).outputs_schema is None


def test_it_never_replaces_a_schema_saved_with_the_revision(owner_client, project):
    evaluator = evaluator_create(
        project=project,
        kind="code",
        name="Typed",
        outputs_schema={"type": "object", "properties": {"score": {"type": "number"}}},
    )
    response = owner_client.post(
        f"/api/v1/revisions/{evaluator.head.slug}/schema",
        {"schema": {"type": "object", "properties": {"x": {"type": "number"}}}},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "cannot be replaced" in response.json()["error"]["message"]


def test_it_renders_the_backfill_page_and_its_progress_fragment(owner_client, legacy_run):
    _, revision = legacy_run
    page = owner_client.get(f"/p/acme/schemas/{revision.slug}/").content.decode()
    assert "Inferred from 4 stored outputs" in page and "<html" in page
    fragment = owner_client.get(
        f"/p/acme/schemas/{revision.slug}/progress", **HTMX
    ).content.decode()
    assert (
        fragment.strip().startswith('<section class="card" id="backfill-progress"')
        and "<html" not in fragment
    )


def test_it_hides_other_projects_revisions(outsider_client, legacy_run):
    _, revision = legacy_run
    assert outsider_client.get(f"/p/acme/schemas/{revision.slug}/").status_code == 404
