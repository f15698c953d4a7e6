"""The online rules REST API: create, read, change, pause/resume, backfill, delete; roles and
isolation."""

from __future__ import annotations

import pytest

from evaluators.services import evaluator_create
from runs.models import OnlineRule, Run
from runs.traces import trace_ingest
from tests.runs.test_online import T0, root


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline in these tests."""


@pytest.fixture
def paris(project):
    return evaluator_create(
        project=project, kind="regex", name="Says Paris", parameters={"pattern": "Paris"}
    )


BODY = {
    "name": "Prod capital QA",
    "evaluator": "says-paris",
    "filter": {"name": "capital_qa", "attributes": {"ag.meta.env": "prod"}},
    "sampling_rate": 0.5,
    "bucket_seconds": 300,
}


def test_it_creates_a_rule_with_its_live_run(api, paris):
    response = api.post("/api/v1/online-rules", BODY, format="json")
    assert response.status_code == 201, response.json()
    rule = response.json()
    assert rule["evaluator"] == {"id": paris.pk, "slug": "says-paris"}
    assert rule["revision"] == {"id": paris.head.pk, "slug": "says-paris-v1", "version": 1}
    assert rule["filter"] == {
        "name": "capital_qa",
        "attributes": {"ag.meta.env": "prod"},
        "since": None,
        "until": None,
    }
    assert (rule["sampling_rate"], rule["bucket_seconds"], rule["active"]) == (0.5, 300, True)
    assert rule["slug"] == "prod-capital-qa" and rule["backfill"] is None
    run = api.get(f"/api/v1/runs/{rule['run']}").json()
    assert run["is_online"] and run["status"] == "running"
    assert [(s["key"], s["type"]) for s in run["steps"]] == [
        ("query-prod-capital-qa", "input"),
        ("evaluator-says-paris-v1", "annotation"),
    ]
    assert run["steps"][0]["references"] == {"query": {"id": rule["id"], "slug": "prod-capital-qa"}}
    listed = api.get("/api/v1/online-rules").json()["results"]
    assert [r["id"] for r in listed] == [rule["id"]]


def test_it_refuses_human_feedback_evaluators_with_a_clear_400(api, project):
    evaluator_create(project=project, kind="human", name="Reviewer")
    response = api.post(
        "/api/v1/online-rules", {"name": "Humans", "evaluator": "reviewer"}, format="json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert "cannot be online rules" in error["fields"]["evaluator"][0]
    assert not OnlineRule.objects.exists()


def test_it_names_bad_fields(api, paris):
    response = api.post(
        "/api/v1/online-rules",
        {**BODY, "filter": {"attributes": {"": "x"}}, "sampling_rate": 0},
        format="json",
    )
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert "sampling_rate" in fields or any(k.startswith("filter") for k in fields)
    response = api.post("/api/v1/online-rules", {**BODY, "evaluator": "nope"}, format="json")
    assert response.status_code == 400 and "evaluator" in response.json()["error"]["fields"]


def test_it_changes_pauses_resumes_and_deletes_a_rule(api, paris):
    rule = api.post("/api/v1/online-rules", BODY, format="json").json()
    url = f"/api/v1/online-rules/{rule['id']}"
    changed = api.patch(url, {"sampling_rate": 1.0, "filter": {"name": "other"}}, format="json")
    assert changed.status_code == 200
    assert changed.json()["sampling_rate"] == 1.0 and changed.json()["filter"]["name"] == "other"
    paused = api.post(f"{url}/pause", {"reason": "Judge outage"}, format="json").json()
    assert (paused["active"], paused["paused_reason"]) == (False, "Judge outage")
    backfill = api.post(f"{url}/backfill", {"since": "2026-11-20T00:00:00Z"}, format="json")
    assert backfill.status_code == 400  # a paused rule evaluates nothing
    resumed = api.post(f"{url}/resume").json()
    assert (resumed["active"], resumed["paused_reason"]) == (True, "")
    assert api.delete(url).status_code == 204
    assert api.get(url).status_code == 404
    run = Run.objects.get(pk=rule["run"])
    assert run.closed and run.status == "success"  # kept, read-only


def test_it_backfills_and_reports_progress(api, project, paris, django_capture_on_commit_callbacks):
    trace_ingest(project=project, spans=[root(f"t-{i}", start=T0) for i in range(4)])
    rule = api.post("/api/v1/online-rules", {**BODY, "sampling_rate": 1.0}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            f"/api/v1/online-rules/{rule['id']}/backfill",
            {"since": "2026-11-20T00:00:00Z", "until": "2026-11-21T00:00:00Z"},
            format="json",
        )
    assert response.status_code == 202, response.json()
    assert (response.json()["total"], response.json()["queued"]) == (4, 4)
    progress = api.get(f"/api/v1/online-rules/{rule['id']}").json()["backfill"]
    assert (progress["evaluated"], progress["percent"], progress["finished"]) == (4, 100.0, True)
    buckets = api.get(f"/api/v1/runs/{rule['run']}/metrics?buckets=true").json()["buckets"]
    assert len(buckets) == 1 and buckets[0]["start"].startswith("2026-11-20T10:00:00")
    assert buckets[0]["data"]["evaluator-says-paris-v1"]["success"]["rate"] == 1.0


def test_it_lets_a_viewer_read_but_not_write(api, viewer_api, paris):
    rule = api.post("/api/v1/online-rules", BODY, format="json").json()
    assert viewer_api.get(f"/api/v1/online-rules/{rule['id']}").status_code == 200
    assert viewer_api.post("/api/v1/online-rules", BODY, format="json").status_code == 403
    assert viewer_api.post(f"/api/v1/online-rules/{rule['id']}/pause").status_code == 403
    assert viewer_api.delete(f"/api/v1/online-rules/{rule['id']}").status_code == 403


def test_it_hides_rules_from_other_projects(api, outsider_api, paris):
    rule = api.post("/api/v1/online-rules", BODY, format="json").json()
    url = f"/api/v1/online-rules/{rule['id']}"
    assert outsider_api.get(url).status_code == 404
    assert outsider_api.post(f"{url}/pause").status_code == 404
    assert outsider_api.delete(url).status_code == 404
    assert outsider_api.get("/api/v1/online-rules").json()["results"] == []
    # Their evaluator slug means nothing in our project, and ours nothing in theirs.
    assert outsider_api.post("/api/v1/online-rules", BODY, format="json").status_code == 400
