"""Online evaluation pages: the list (full and as an HTMX fragment), the new-rule form, a rule's
page with its live run, buckets, pause/resume and backfill; roles and isolation."""

from __future__ import annotations

import pytest

from evaluators.services import evaluator_create
from runs.models import OnlineRule
from runs.online import online_rule_create, online_rule_pause
from runs.traces import trace_ingest
from tests.runs.test_online import T0, root

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline in these tests."""


@pytest.fixture
def paris(project):
    return evaluator_create(
        project=project, kind="regex", name="Says Paris", parameters={"pattern": "Paris"}
    )


@pytest.fixture
def rule(project, paris, django_capture_on_commit_callbacks):
    rule = online_rule_create(
        project=project, name="Prod capital QA", revision=paris.head, filter={"name": "capital_qa"}
    )
    with django_capture_on_commit_callbacks(execute=True):
        trace_ingest(project=project, spans=[root("t-good"), root("t-bad", outputs="Lyon")])
    return rule


def test_it_lists_rules_and_swaps_the_table_for_htmx(viewer_client, project, rule, paris):
    online_rule_create(project=project, name="Staging", revision=paris.head, active=False)
    page = viewer_client.get("/p/acme/online/").content.decode()
    assert "<html" in page and 'id="online-rule-table"' in page
    assert "Prod capital QA" in page and "Staging" in page and "root = capital_qa" in page
    assert "/p/acme/online/" in page and ">Online</a>" in page  # the nav link
    assert "New rule" not in page  # viewers do not create
    fragment = viewer_client.get("/p/acme/online/?state=paused", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="online-rule-table"')
    assert "<html" not in fragment and "Staging" in fragment and "Prod capital QA" not in fragment


def test_it_creates_a_rule_from_the_form(editor_client, project, paris):
    page = editor_client.get("/p/acme/online/new").content.decode()
    assert "Says Paris" in page and 'name="sampling_percent"' in page
    response = editor_client.post(
        "/p/acme/online/new",
        {
            "name": "Prod QA",
            "evaluator": paris.pk,
            "root_name": "capital_qa",
            "attributes": "ag.meta.env=prod\napp.tier = gold",
            "sampling_percent": "25",
            "bucket_seconds": "300",
        },
    )
    rule = OnlineRule.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/p/acme/online/{rule.pk}/"
    assert rule.filter["attributes"] == {"ag.meta.env": "prod", "app.tier": "gold"}
    assert (rule.sampling_rate, rule.bucket_seconds, rule.revision) == (0.25, 300, paris.head)


def test_it_edits_a_rule_from_now_on(editor_client, project, paris):
    rule = online_rule_create(
        project=project,
        name="QA",
        revision=paris.head,
        filter={"attributes": {"app.cached": True}, "since": "2026-11-20T09:00:00Z"},
    )
    page = editor_client.get(f"/p/acme/online/{rule.pk}/edit").content.decode()
    assert "app.cached=true" in page and 'value="2026-11-20T09:00"' in page
    assert 'name="evaluator"' not in page  # fixed for the rule's life
    response = editor_client.post(
        f"/p/acme/online/{rule.pk}/edit",
        {
            "name": "QA v2",
            "root_name": "capital_qa",
            "sampling_percent": "50",
            "bucket_seconds": "86400",
        },
    )
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.name, rule.filter["name"], rule.sampling_rate) == ("QA v2", "capital_qa", 0.5)
    assert rule.filter["attributes"] == {} and rule.bucket_seconds == 86400
    assert rule.run.name == "Online: QA v2"


def test_it_shows_form_errors_inline(editor_client, project, paris):
    response = editor_client.post(
        "/p/acme/online/new",
        {
            "name": "X",
            "evaluator": paris.pk,
            "attributes": "no equals sign",
            "sampling_percent": "0",
        },
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "path=value" in page and "field-error" in page
    assert not OnlineRule.objects.exists()


def test_it_does_not_offer_human_evaluators(editor_client, project, paris):
    evaluator_create(project=project, kind="human", name="Reviewer")
    page = editor_client.get("/p/acme/online/new").content.decode()
    assert "Says Paris" in page and "Reviewer" not in page


def test_it_shows_a_rule_with_its_live_run_and_buckets(viewer_client, rule):
    page = viewer_client.get(f"/p/acme/online/{rule.pk}/").content.decode()
    assert "<html" in page and "Prod capital QA" in page
    assert f"/p/acme/runs/{rule.run_id}/" in page  # the live run
    assert 'id="online-buckets"' in page and "2026-11-20 10:00" in page
    assert "50%" in page  # one of two said Paris
    assert "/p/acme/traces/t-good/" in page and "/p/acme/traces/t-bad/" in page
    assert "Pause" not in page  # viewers see no buttons
    fragment = viewer_client.get(
        f"/p/acme/online/{rule.pk}/?region=online-buckets", **HTMX
    ).content.decode()
    assert fragment.strip().startswith('<section class="card" id="online-buckets"')
    assert "<html" not in fragment and "2026-11-20 10:00" in fragment


def test_it_pauses_with_a_reason_and_resumes(editor_client, rule):
    page = editor_client.get(f"/p/acme/online/{rule.pk}/").content.decode()
    assert "Pause" in page and "Backfill" in page
    response = editor_client.post(
        f"/p/acme/online/{rule.pk}/pause", {"reason": "Judge model outage"}, follow=True
    )
    page = response.content.decode()
    assert "Paused:" in page and "Judge model outage" in page and "Resume" in page
    listing = editor_client.get("/p/acme/online/").content.decode()
    assert "paused" in listing and "Judge model outage" in listing
    page = editor_client.post(f"/p/acme/online/{rule.pk}/resume", follow=True).content.decode()
    assert "Paused:" not in page and "resumed" in page


def test_it_backfills_with_visible_progress(
    editor_client, project, paris, django_capture_on_commit_callbacks
):
    trace_ingest(project=project, spans=[root(f"t-{i}", start=T0) for i in range(3)])
    rule = online_rule_create(project=project, name="QA", revision=paris.head)
    with django_capture_on_commit_callbacks(execute=False):  # queued, not yet run
        response = editor_client.post(
            f"/p/acme/online/{rule.pk}/backfill",
            {"since": "2026-11-20T00:00", "until": "2026-11-21T00:00"},
            follow=True,
        )
    page = response.content.decode()
    assert "Backfill queued: 3 of 3" in page and "0 / 3 traces" in page
    assert 'hx-trigger="every 2s"' in page  # the progress region polls while it runs
    fragment = editor_client.get(
        f"/p/acme/online/{rule.pk}/?region=online-backfill", **HTMX
    ).content.decode()
    assert fragment.strip().startswith('<div id="online-backfill"') and "0 / 3" in fragment


def test_it_refuses_a_backfill_of_a_paused_rule(editor_client, rule):
    online_rule_pause(rule=rule, reason="maintenance")
    page = editor_client.post(
        f"/p/acme/online/{rule.pk}/backfill", {"since": "2026-11-20T00:00"}, follow=True
    ).content.decode()
    assert "resume it before backfilling" in page


def test_it_forbids_viewers_to_create_or_change(viewer_client, rule, paris):
    assert viewer_client.get("/p/acme/online/new").status_code == 403
    assert viewer_client.post("/p/acme/online/new", {"name": "X"}).status_code == 403
    assert viewer_client.post(f"/p/acme/online/{rule.pk}/pause").status_code == 403
    assert viewer_client.post(f"/p/acme/online/{rule.pk}/delete").status_code == 403
    assert OnlineRule.objects.filter(pk=rule.pk, active=True).exists()


def test_it_hides_rules_from_outsiders(outsider_client, rule):
    assert outsider_client.get("/p/acme/online/").status_code == 404
    assert outsider_client.get(f"/p/acme/online/{rule.pk}/").status_code == 404
    assert outsider_client.get(f"/p/other/online/{rule.pk}/").status_code == 404
    assert outsider_client.post(f"/p/other/online/{rule.pk}/pause").status_code == 404


def test_it_deletes_a_rule_and_keeps_its_run(owner_client, rule):
    response = owner_client.post(f"/p/acme/online/{rule.pk}/delete", follow=True)
    assert "deleted" in response.content.decode()
    assert not OnlineRule.objects.exists()
    assert owner_client.get(f"/p/acme/runs/{rule.run_id}/").status_code == 200
