"""Run tags: set at creation (API, page, logged runs), replaced later, validated, filtered on
(API and the runs page), and out of a viewer's reach."""

from __future__ import annotations

import pytest

from runs.engine import run_create, run_update
from runs.models import Run
from tests.runs.factories import make_testset

pytestmark = pytest.mark.django_db


def _body(capitals, column_app, exact, **extra) -> dict:
    return {
        "testset": capitals.testset.slug,
        "application": column_app.slug,
        "evaluators": [exact.slug],
        "start": False,
        **extra,
    }


def test_a_run_is_created_with_tags_and_they_are_read_back(api, capitals, column_app, exact):
    body = _body(capitals, column_app, exact, tags={"branch": "main", "pr": 482})
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["tags"] == {"branch": "main", "pr": "482"}
    run = Run.objects.get()
    assert run.tags == {"branch": "main", "pr": "482"}
    assert api.get(f"/api/v1/runs/{run.pk}").json()["tags"] == run.tags


def test_a_logged_run_takes_tags(api):
    response = api.post(
        "/api/v1/runs", {"name": "sdk", "tags": {"commit": "9f1c2e7"}}, format="json"
    )
    assert response.status_code == 201
    assert Run.objects.get().tags == {"commit": "9f1c2e7"}


@pytest.mark.parametrize(
    ("tags", "field", "reason"),
    [
        (["main"], "tags", "must be an object"),
        ({"bad name": "x"}, "tags.bad name", "a tag name is"),
        ({"branch": {"nested": 1}}, "tags.branch", "must be a text"),
        ({"branch": "x" * 201}, "tags.branch", "at most 200 characters"),
        ({f"t{i}": "x" for i in range(21)}, "tags", "at most 20 tags"),
    ],
)
def test_bad_tags_are_refused_naming_the_field(
    api, capitals, column_app, exact, tags, field, reason
):
    response = api.post(
        "/api/v1/runs", _body(capitals, column_app, exact, tags=tags), format="json"
    )
    assert response.status_code == 400
    assert reason in response.json()["error"]["fields"][field][0]
    assert not Run.objects.exists()


def test_patch_replaces_the_tags_of_a_finished_run(api, project, capitals, column_app, exact):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=column_app,
        revisions=[exact],
        tags={"branch": "feature", "stale": "yes"},
    )
    Run.objects.filter(pk=run.pk).update(status="success")
    response = api.patch(
        f"/api/v1/runs/{run.pk}", {"tags": {"branch": "main", "pr": "7"}}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["tags"] == {"branch": "main", "pr": "7"}
    run.refresh_from_db()
    assert run.tags == {"branch": "main", "pr": "7"} and run.status == "success"
    bad = api.patch(f"/api/v1/runs/{run.pk}", {"tags": {"": "x"}}, format="json")
    assert bad.status_code == 400
    run.refresh_from_db()
    assert run.tags == {"branch": "main", "pr": "7"}


def test_a_viewer_may_not_change_tags(viewer_api, project, capitals, column_app, exact):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=column_app,
        revisions=[exact],
        tags={"branch": "main"},
    )
    response = viewer_api.patch(f"/api/v1/runs/{run.pk}", {"tags": {}}, format="json")
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.tags == {"branch": "main"}


def test_another_projects_run_is_not_found(outsider_api, project, capitals, column_app, exact):
    run = run_create(
        project=project, testset_version=capitals, application=column_app, revisions=[exact]
    )
    response = outsider_api.patch(f"/api/v1/runs/{run.pk}", {"tags": {"x": "1"}}, format="json")
    assert response.status_code == 404
    run.refresh_from_db()
    assert run.tags == {}


def _tagged_runs(project, column_app, exact):
    capitals = make_testset(project, [{"outputs": "a", "correct_answer": "a"}], slug="one")
    other = make_testset(project, [{"outputs": "a", "correct_answer": "a"}], slug="two")

    def make(version, **tags):
        return run_create(
            project=project,
            testset_version=version,
            application=column_app,
            revisions=[exact],
            tags=tags,
        )

    return {
        "main": make(capitals, branch="main", commit="a1"),
        "main_later": make(capitals, branch="main", commit="b2"),
        "feature": make(capitals, branch="feature", pr="12"),
        "other_main": make(other, branch="main"),
    }


def test_runs_are_filtered_by_tags_and_testset(api, project, column_app, exact):
    runs = _tagged_runs(project, column_app, exact)

    def ids(query: str) -> list[int]:
        response = api.get(f"/api/v1/runs?{query}")
        assert response.status_code == 200, response.json()
        return [r["id"] for r in response.json()["results"]]

    assert ids("tag=branch:main&testset=one") == [runs["main_later"].pk, runs["main"].pk]
    assert ids("tag=branch:main&tag=commit:a1") == [runs["main"].pk]
    assert ids("tag=pr:12") == [runs["feature"].pk]
    assert ids(f"tag=branch:main&testset={runs['other_main'].testset_version.testset_id}") == [
        runs["other_main"].pk
    ]
    assert ids("tag=branch:nowhere") == []
    bad = api.get("/api/v1/runs?tag=branch")
    assert bad.status_code == 400
    assert "name:value" in bad.json()["error"]["fields"]["tag"][0]


def test_the_runs_page_filters_by_tag_and_shows_tags(viewer_client, project, column_app, exact):
    runs = _tagged_runs(project, column_app, exact)
    page = viewer_client.get(f"/p/{project.slug}/runs/?tag=pr:12").content.decode()
    assert f"/runs/{runs['feature'].pk}/" in page
    assert f"/runs/{runs['main'].pk}/" not in page
    assert 'class="tag" href="?tag=pr:12">pr: 12</a>' in page
    bad = viewer_client.get(f"/p/{project.slug}/runs/?tag=oops")
    assert bad.status_code == 200
    assert "write a tag as name:value (branch:main)" in bad.content.decode()


def test_a_tag_link_keeps_commas_and_colons_in_the_value(
    viewer_client, project, capitals, column_app, exact
):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=column_app,
        revisions=[exact],
        tags={"note": "a, b: c"},
    )
    page = viewer_client.get(f"/p/{project.slug}/runs/", {"tag": "note:a, b: c"}).content.decode()
    assert f"/runs/{run.pk}/" in page and "write a tag" not in page


def _new_run(client, project, capitals, column_app, exact, tags: str):
    form = {
        "testset": capitals.testset.pk,
        "application": column_app.pk,
        "evaluators": [exact.evaluator_id],
        "repeats": 1,
        "tags": tags,
    }
    return client.post(f"/p/{project.slug}/runs/new", form)


def test_the_new_run_page_sets_tags(editor_client, project, capitals, column_app, exact):
    response = _new_run(editor_client, project, capitals, column_app, exact, "branch=main, pr=482")
    assert response.status_code == 302
    assert Run.objects.get().tags == {"branch": "main", "pr": "482"}


def test_the_new_run_page_refuses_bad_tags_inline(
    editor_client, project, capitals, column_app, exact
):
    response = _new_run(editor_client, project, capitals, column_app, exact, "branch main")
    assert response.status_code == 200
    assert "write tags as branch=main, pr=12" in response.content.decode()
    assert not Run.objects.exists()


def test_run_update_renames_without_touching_tags(project, capitals, column_app, exact):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=column_app,
        revisions=[exact],
        tags={"branch": "main"},
    )
    run_update(run=run, name="Renamed")
    run.refresh_from_db()
    assert (run.name, run.tags) == ("Renamed", {"branch": "main"})


def test_the_admin_refuses_bad_tags(
    client, django_user_model, project, capitals, column_app, exact
):
    run = run_create(
        project=project,
        testset_version=capitals,
        application=column_app,
        revisions=[exact],
        tags={"branch": "main"},
    )
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(root)
    url = f"/admin/runs/run/{run.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and "branch: main" not in page.content.decode()  # a field
    form = {
        "project": project.pk,
        "name": run.name,
        "description": "",
        "query": "{}",
        "repeats": 1,
        "tags": '{"bad name": "x"}',
        "created_at_0": "2026-01-01",
        "created_at_1": "00:00:00",
        "steps-TOTAL_FORMS": 0,
        "steps-INITIAL_FORMS": 0,
    }
    response = client.post(url, form)
    assert response.status_code == 200
    assert "a tag name is 1-64 letters" in response.content.decode()
    run.refresh_from_db()
    assert run.tags == {"branch": "main"}
