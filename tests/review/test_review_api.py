"""The annotation queue and reliability REST API: queues made and changed, items added three
ways, reservations handed out by `next`, reviews settling into gold labels (unanimous or by an
adjudicator), blindness, refusals that change nothing, the agreement report, gold labels out
(CSV, JSONL, a testset version), reliability records of an automatic evaluator against the
gold, and the online feed."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from evalsite.models import Role
from evaluators.models import ReliabilityRecord
from evaluators.services import evaluator_create, evaluator_revise
from runs import review
from runs.annotations import annotation_create
from runs.api import review as review_api
from runs.applications import application_create
from runs.engine import run_add_evaluators, run_create, run_start
from runs.models import (
    AnnotationQueue,
    ItemStatus,
    QueueItem,
    Review,
    ReviewStatus,
    TestsetVersion,
)
from tests.conftest import api_client_for
from tests.review.conftest import chat_span
from tests.runs.factories import CAPITALS, make_testset

QUEUES = "/api/v1/annotation-queues"


def url(queue, tail: str = "") -> str:
    return f"{QUEUES}/{queue.slug}{tail}"


def item_url(queue, item_id: int, tail: str = "") -> str:
    return url(queue, f"/items/{item_id}{tail}")


def first_item(queue) -> QueueItem:
    return QueueItem.objects.filter(queue=queue).order_by("position").first()


def submit(client, queue, item_id: int, **outputs):
    return client.post(item_url(queue, item_id, "/review"), {"outputs": outputs}, format="json")


@pytest.fixture
def owner_api(project, owner):
    return api_client_for(project, owner, Role.OWNER)


@pytest.fixture
def capitals_run(project, celery_eager, django_capture_on_commit_callbacks):
    """A finished run of exact match over the capitals (France and Germany pass, Italy and
    Spain fail), made by the real engine with its tasks run inline."""
    version = make_testset(project, CAPITALS)
    app = application_create(
        project=project, name="Capital QA", kind="column", config={"outputs_column": "outputs"}
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact")
    run = run_create(
        project=project, testset_version=version, application=app, revisions=[exact.head]
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_start(run=run)
    run.refresh_from_db()
    assert run.status == "success"
    return run


def run_queue(api, human_evaluator, run, **settings) -> AnnotationQueue:
    """A queue over every scenario of the run, made and filled through the API."""
    body = {"name": "Capitals review", "evaluator": human_evaluator.slug, **settings}
    response = api.post(QUEUES, body, format="json")
    assert response.status_code == 201, response.json()
    queue = AnnotationQueue.objects.get(pk=response.json()["id"])
    added = api.post(url(queue, "/items"), {"run": run.pk, "selection": {}}, format="json")
    assert added.status_code == 201, added.json()
    return queue


# --- queues --------------------------------------------------------------------------------------


def test_it_creates_lists_reads_and_changes_a_queue(api, human_evaluator, owner, editor, viewer):
    body = {
        "name": "Support answers",
        "evaluator": human_evaluator.slug,
        "reviewers_per_item": 3,
        "blind": False,
        "min_agreement": 0.5,
        "reservation_seconds": 600,
        "reviewers": ["bob", "carol", "alice"],
        "adjudicators": ["alice"],
        "instructions": "Judge the answer only.",
    }
    response = api.post(QUEUES, body, format="json")
    assert response.status_code == 201, response.json()
    queue = response.json()
    assert queue["slug"] == "support-answers"
    assert queue["evaluator"] == {"id": human_evaluator.pk, "slug": "answer-review"}
    assert queue["revision"]["version"] == 1
    assert (queue["reviewers_per_item"], queue["blind"], queue["min_agreement"]) == (3, False, 0.5)
    assert sorted(queue["reviewers"]) == ["alice", "bob", "carol"]
    assert queue["adjudicators"] == ["alice"] and queue["created_by"] == "bob"
    assert [field["name"] for field in queue["form"]] == ["correct", "tone", "comment"]
    assert queue["progress"]["items"] == 0 and queue["progress"]["reviews_needed"] == 0

    listed = api.get(QUEUES).json()["results"]
    assert [q["slug"] for q in listed] == ["support-answers"]
    assert api.get(f"{QUEUES}/{queue['id']}").json()["slug"] == "support-answers"

    changed = api.patch(
        f"{QUEUES}/support-answers",
        {"reviewers_per_item": 2, "reviewers": ["bob"], "name": "Support"},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["reviewers_per_item"] == 2 and changed.json()["reviewers"] == ["bob"]
    assert changed.json()["name"] == "Support" and changed.json()["blind"] is False

    api.patch(f"{QUEUES}/support-answers", {"archived": True}, format="json")
    assert api.get(QUEUES).json()["results"] == []
    archived = api.get(QUEUES, {"archived": "true"}).json()["results"]
    assert [q["slug"] for q in archived] == ["support-answers"]


def test_it_refuses_an_automatic_evaluator_as_the_form_naming_evaluator(api, project):
    evaluator_create(project=project, kind="exact_match", name="Exact")
    response = api.post(QUEUES, {"name": "Q", "evaluator": "exact"}, format="json")
    assert response.status_code == 400
    assert "human-feedback" in response.json()["error"]["fields"]["evaluator"][0]
    assert not AnnotationQueue.objects.exists()


def test_it_refuses_six_reviewers_per_item_naming_the_field(api, human_evaluator, queue):
    body = {"name": "Q", "evaluator": human_evaluator.slug, "reviewers_per_item": 6}
    response = api.post(QUEUES, body, format="json")
    assert response.status_code == 400
    assert "reviewers_per_item" in response.json()["error"]["fields"]
    assert AnnotationQueue.objects.count() == 1

    response = api.patch(url(queue), {"reviewers_per_item": 6}, format="json")
    assert response.status_code == 400
    assert "reviewers_per_item" in response.json()["error"]["fields"]
    queue.refresh_from_db()
    assert queue.reviewers_per_item == 2


def test_it_refuses_a_reviewer_who_is_not_a_member(api, human_evaluator, outsider):
    body = {"name": "Q", "evaluator": human_evaluator.slug, "reviewers": ["bob", "mallory"]}
    response = api.post(QUEUES, body, format="json")
    assert response.status_code == 400
    assert "'mallory' is not a member" in response.json()["error"]["fields"]["reviewers"][0]
    assert not AnnotationQueue.objects.exists()


def test_it_names_trace_filter_when_the_feed_filter_is_bad(api, human_evaluator):
    body = {"name": "Q", "evaluator": human_evaluator.slug, "trace_filter": {"nope": 1}}
    response = api.post(QUEUES, body, format="json")
    assert response.status_code == 400
    assert all(name.startswith("trace_filter") for name in response.json()["error"]["fields"])
    assert not AnnotationQueue.objects.exists()


def test_an_outsider_gets_404_and_changes_nothing(outsider_api, queue, human_evaluator, traces):
    before = QueueItem.objects.count()
    assert outsider_api.get(url(queue)).status_code == 404
    assert outsider_api.get(f"{QUEUES}/{queue.pk}/items").status_code == 404
    assert outsider_api.patch(url(queue), {"name": "Mine"}, format="json").status_code == 404
    added = outsider_api.post(
        url(queue, "/items"), {"trace_ids": [traces[0].trace_id]}, format="json"
    )
    assert added.status_code == 404
    assert outsider_api.post(url(queue, "/next")).status_code == 404
    assert (
        outsider_api.get(f"/api/v1/evaluators/{human_evaluator.pk}/reliability").status_code == 404
    )
    # Naming our evaluator from their own project finds nothing to build on.
    made = outsider_api.post(QUEUES, {"name": "Q", "evaluator": human_evaluator.pk}, format="json")
    assert made.status_code == 400 and "evaluator" in made.json()["error"]["fields"]
    queue.refresh_from_db()
    assert queue.name == "Chat answers" and QueueItem.objects.count() == before
    assert AnnotationQueue.objects.count() == 1


def test_a_viewer_may_not_make_or_change_a_queue(viewer_api, human_evaluator, queue):
    made = viewer_api.post(QUEUES, {"name": "Q", "evaluator": human_evaluator.slug}, format="json")
    assert made.status_code == 403
    assert viewer_api.patch(url(queue), {"name": "Mine"}, format="json").status_code == 403
    queue.refresh_from_db()
    assert queue.name == "Chat answers" and AnnotationQueue.objects.count() == 1


# --- items ---------------------------------------------------------------------------------------


def test_it_adds_items_three_ways(api, project, human_evaluator, capitals_run, traces):
    response = api.post(QUEUES, {"name": "Mixed", "evaluator": human_evaluator.slug}, format="json")
    queue = AnnotationQueue.objects.get(pk=response.json()["id"])
    items = url(queue, "/items")

    failed = api.post(
        items, {"run": capitals_run.pk, "selection": {"select": "failed"}}, format="json"
    )
    assert failed.status_code == 201 and failed.json() == {"added": 2}  # Italy and Spain
    by_index = api.post(items, {"run": capitals_run.pk, "scenarios": [0, 3]}, format="json")
    assert by_index.json() == {"added": 1}  # Spain is in already
    by_trace = api.post(items, {"trace_ids": [t.trace_id for t in traces]}, format="json")
    assert by_trace.status_code == 201 and by_trace.json() == {"added": 3}
    again = api.post(items, {"trace_ids": [traces[0].trace_id]}, format="json")
    assert again.json() == {"added": 0}

    listed = api.get(items).json()["results"]
    assert [row["position"] for row in listed] == [1, 2, 3, 4, 5, 6]
    assert [row["source"] for row in listed] == ["run", "run", "api", "api", "api", "api"]
    assert [row["scenario"] for row in listed[:3]] == [2, 3, 0]
    assert listed[0]["run"] == capitals_run.pk and listed[3]["run"] is None
    assert [row["trace_id"] for row in listed[3:]] == [t.trace_id for t in traces]
    assert {row["status"] for row in listed} == {"open"}
    assert listed[0]["gold"] is None and listed[0]["settled_by"] == ""
    assert len(api.get(items, {"status": "open"}).json()["results"]) == 6
    assert api.get(items, {"status": "gold"}).json()["results"] == []
    assert api.get(url(queue)).json()["progress"]["items"] == 6


def test_it_names_what_is_wrong_with_an_addition_and_adds_nothing(api, queue, capitals_run, traces):
    items = url(queue, "/items")
    before = QueueItem.objects.count()
    cases = [
        ({}, "run"),
        ({"trace_ids": [traces[0].trace_id], "run": capitals_run.pk}, "trace_ids"),
        ({"run": capitals_run.pk, "selection": {}, "scenarios": [0]}, "scenarios"),
        ({"trace_ids": ["f" * 32]}, "trace_ids"),
        ({"run": capitals_run.pk + 1000}, "run"),
        ({"run": capitals_run.pk, "selection": {"select": "sometimes"}}, "selection.select"),
        ({"run": capitals_run.pk, "scenarios": [9]}, "indexes"),
    ]
    for body, field in cases:
        response = api.post(items, body, format="json")
        assert response.status_code == 400, body
        assert field in response.json()["error"]["fields"], (body, response.json())
    assert api.get(items, {"status": "maybe"}).status_code == 400
    assert QueueItem.objects.count() == before


# --- reservations ----------------------------------------------------------------------------------


def test_next_hands_two_reviewers_the_same_item_and_a_third_the_second(
    api, viewer_api, owner_api, queue
):
    queue.reviewers.add(*queue.adjudicators.all())  # alice reviews too
    bob = api.post(url(queue, "/next"))
    carol = viewer_api.post(url(queue, "/next"))
    alice = owner_api.post(url(queue, "/next"))
    assert (bob.status_code, carol.status_code, alice.status_code) == (200, 200, 200)
    assert bob.json()["position"] == carol.json()["position"] == 1
    assert alice.json()["position"] == 2
    assert bob.json()["reserved_until"] is not None
    assert bob.json()["inputs"] == {"question": "What is the capital of France?"}
    assert bob.json()["outputs"] == "Paris"
    assert bob.json()["trace"]["name"] == "chat"
    assert [field["name"] for field in bob.json()["form"]] == ["correct", "tone", "comment"]
    # Asking again hands back the item you hold.
    assert api.post(url(queue, "/next")).json()["id"] == bob.json()["id"]


def test_a_lapsed_reservation_frees_its_place(api, viewer_api, owner_api, queue):
    queue.reviewers.add(*queue.adjudicators.all())
    first = api.post(url(queue, "/next")).json()
    viewer_api.post(url(queue, "/next"))
    Review.objects.filter(item_id=first["id"], reviewer__username="bob").update(
        reserved_until=timezone.now() - timedelta(seconds=1)
    )
    assert owner_api.post(url(queue, "/next")).json()["id"] == first["id"]
    # Bob's lapsed place was taken: he moves on to the next item.
    assert api.post(url(queue, "/next")).json()["position"] == 2


def test_next_answers_204_when_nothing_is_left(api, viewer_api, queue):
    for item in QueueItem.objects.filter(queue=queue):
        assert submit(api, queue, item.pk, correct=True).status_code == 201
    assert api.post(url(queue, "/next")).status_code == 204


def test_a_skipped_item_goes_to_someone_else(api, queue):
    item = api.post(url(queue, "/next")).json()
    skipped = api.post(item_url(queue, item["id"], "/review"), {"skip": True}, format="json")
    assert skipped.status_code == 201 and skipped.json()["status"] == "skipped"
    assert api.post(url(queue, "/next")).json()["position"] == 2


def test_a_key_without_a_person_gets_403_naming_reviewer(project, queue):
    keyless = api_client_for(project, None, Role.EDITOR)  # its creator was deleted
    response = keyless.post(url(queue, "/next"))
    assert response.status_code == 403
    assert "reviewer" in response.json()["error"]["fields"]
    response = submit(keyless, queue, first_item(queue).pk, correct=True)
    assert response.status_code == 403 and "reviewer" in response.json()["error"]["fields"]
    assert not Review.objects.exists()


# --- reviews, settling, adjudication -----------------------------------------------------------------


def test_agreeing_reviews_settle_the_item_as_a_unanimous_gold_label(api, viewer_api, queue):
    item = first_item(queue)
    bob = submit(api, queue, item.pk, correct=True, tone="friendly")
    assert bob.status_code == 201, bob.json()
    assert bob.json()["status"] == "submitted" and bob.json()["reviewer"] == "bob"
    assert submit(viewer_api, queue, item.pk, correct=True, tone="friendly").status_code == 201
    settled = api.get(item_url(queue, item.pk)).json()
    assert settled["status"] == "gold" and settled["settled_by"] == "unanimous"
    assert settled["agreement"] == 1.0
    assert settled["gold"]["outputs"] == {"correct": True, "tone": "friendly"}
    assert settled["gold"]["origin"] == "gold"
    gold_rows = api.get(url(queue, "/items"), {"status": "gold"}).json()["results"]
    assert [row["id"] for row in gold_rows] == [item.pk]


def test_disagreement_goes_to_the_adjudicator_who_settles_it(api, viewer_api, owner_api, queue):
    item = first_item(queue)
    bob = submit(api, queue, item.pk, correct=True).json()
    carol = submit(viewer_api, queue, item.pk, correct=False).json()
    waiting = api.get(url(queue, "/items"), {"status": "adjudication"}).json()["results"]
    assert [row["id"] for row in waiting] == [item.pk]
    assert waiting[0]["agreement"] == 0.0  # apart on `correct`; two blank `tone`s do not count

    refused = viewer_api.post(
        item_url(queue, item.pk, "/adjudicate"), {"outputs": {"correct": False}}, format="json"
    )
    assert refused.status_code == 403 and "adjudicator" in refused.json()["error"]["fields"]

    response = owner_api.post(
        item_url(queue, item.pk, "/adjudicate"), {"outputs": {"correct": False}}, format="json"
    )
    assert response.status_code == 200, response.json()
    gold = response.json()
    assert gold["outputs"] == {"correct": False} and gold["channel"] == "api"
    assert gold["details"]["settled_by"] == "adjudicator"
    assert sorted(gold["details"]["reviews"]) == sorted([bob["id"], carol["id"]])
    settled = api.get(item_url(queue, item.pk)).json()
    assert settled["status"] == "gold" and settled["settled_by"] == "adjudicator"
    assert settled["adjudicated_by"] == "alice" and settled["gold"]["id"] == gold["id"]


def test_an_open_item_cannot_be_adjudicated_yet(owner_api, queue):
    response = owner_api.post(
        item_url(queue, first_item(queue).pk, "/adjudicate"),
        {"outputs": {"correct": True}},
        format="json",
    )
    assert response.status_code == 409
    assert first_item(queue).status == ItemStatus.OPEN


def test_a_blind_queue_hides_the_other_reviews_until_you_submit(api, viewer_api, project, queue):
    item = first_item(queue)
    exact = evaluator_create(project=project, kind="exact_match", name="Exact")
    annotation_create(
        project=project,
        evaluator=exact.slug,
        outputs={"success": True},
        trace=item.trace,
        origin="auto",
    )
    submit(api, queue, item.pk, correct=True, comment="looks right")
    before = viewer_api.post(url(queue, "/next")).json()
    assert before["id"] == item.pk and before["others_visible"] is False
    assert before["reviews"] == [] and before["auto"] == []
    assert viewer_api.get(item_url(queue, item.pk)).json()["reviews"] == []

    submit(viewer_api, queue, item.pk, correct=True)
    after = viewer_api.get(item_url(queue, item.pk)).json()
    assert after["others_visible"] is True
    assert sorted(r["reviewer"] for r in after["reviews"]) == ["bob", "carol"]
    assert [v["evaluator"] for v in after["auto"]] == ["exact"]


def test_an_open_queue_shows_the_other_reviews_at_once(api, viewer_api, queue):
    queue.blind = False
    queue.save(update_fields=["blind"])
    item = first_item(queue)
    submit(api, queue, item.pk, correct=True)
    seen = viewer_api.post(url(queue, "/next")).json()
    assert seen["others_visible"] is True and [r["reviewer"] for r in seen["reviews"]] == ["bob"]


def test_a_review_of_a_settled_item_is_a_409_and_changes_nothing(api, viewer_api, queue):
    item = first_item(queue)
    submit(api, queue, item.pk, correct=True)
    submit(viewer_api, queue, item.pk, correct=True)
    response = submit(api, queue, item.pk, correct=False)
    assert response.status_code == 409
    assert "already settled" in response.json()["error"]["message"]
    item.refresh_from_db()
    assert item.gold.outputs == {"correct": True}
    assert Review.objects.get(item=item, reviewer__username="bob").outputs == {"correct": True}


def test_outputs_that_break_the_form_are_a_422_naming_outputs(api, queue):
    item = first_item(queue)
    response = submit(api, queue, item.pk, correct="yes")
    assert response.status_code == 422
    assert "outputs" in response.json()["error"]["fields"]
    response = submit(api, queue, item.pk, correct=True, tone="grumpy")
    assert response.status_code == 422
    response = api.post(item_url(queue, item.pk, "/review"), {}, format="json")
    assert response.status_code == 400 and "outputs" in response.json()["error"]["fields"]
    assert not Review.objects.filter(status=ReviewStatus.SUBMITTED).exists()


def test_a_listed_viewer_reviews_and_an_unlisted_one_gets_403(api, viewer_api, viewer, queue):
    item = first_item(queue)
    assert submit(viewer_api, queue, item.pk, correct=True).status_code == 201  # carol is listed
    queue.reviewers.remove(viewer)
    Review.objects.all().delete()
    response = submit(viewer_api, queue, item.pk, correct=True)
    assert response.status_code == 403
    assert "not a reviewer" in response.json()["error"]["fields"]["reviewer"][0]
    assert viewer_api.post(url(queue, "/next")).status_code == 403
    assert not Review.objects.exists()


# --- agreement and gold ------------------------------------------------------------------------------


def test_the_agreement_report_follows_the_reviews(
    api, viewer_api, queue, celery_eager, django_capture_on_commit_callbacks
):
    answers = [(True, True), (False, False), (True, False)]
    with django_capture_on_commit_callbacks(execute=True):
        for item, (bob, carol) in zip(QueueItem.objects.filter(queue=queue), answers, strict=True):
            submit(api, queue, item.pk, correct=bob)
            submit(viewer_api, queue, item.pk, correct=carol)
    response = api.get(url(queue, "/agreement"))
    assert response.status_code == 200
    report = response.json()
    assert report["refreshed_at"] is not None and report["fresh"] is False
    assert report["agreement"]["reviewers"] == ["bob", "carol"]
    correct = report["agreement"]["fields"]["correct"]
    assert correct["percent_agreement"]["value"] == pytest.approx(2 / 3)
    assert {"cohen_kappa", "krippendorff_alpha", "pairs"} <= set(correct)
    assert "comment" not in report["agreement"]["fields"]  # free text is not agreed on
    fresh = api.get(url(queue, "/agreement"), {"fresh": "true"}).json()
    assert fresh["fresh"] is True and fresh["agreement"] == report["agreement"]


def test_a_fresh_agreement_of_a_large_queue_is_left_to_the_background(
    api, viewer_api, queue, monkeypatch
):
    monkeypatch.setattr(review_api, "MAX_FRESH_REVIEWS", 1)
    item = first_item(queue)
    submit(api, queue, item.pk, correct=True)
    submit(viewer_api, queue, item.pk, correct=True)
    response = api.get(url(queue, "/agreement"), {"fresh": "true"})
    assert response.status_code == 400 and "fresh" in response.json()["error"]["fields"]


def settle_all(api, viewer_api, queue, answers):
    for item, value in zip(QueueItem.objects.filter(queue=queue), answers, strict=True):
        submit(api, queue, item.pk, correct=value, comment=f"note, {item.position}")
        submit(viewer_api, queue, item.pk, correct=value)


def test_it_exports_the_gold_labels_as_json_csv_and_jsonl(api, viewer_api, queue, traces):
    settle_all(api, viewer_api, queue, [True, False, True])
    page = api.get(url(queue, "/gold"), {"limit": 2}).json()
    assert page["count"] == 3 and page["previous"] is None and "offset=2" in page["next"]
    assert [row["trace_id"] for row in page["results"]] == [t.trace_id for t in traces[:2]]
    assert page["results"][0]["settled_by"] == "unanimous"
    assert page["results"][1]["correct"] is False
    assert page["columns"][-3:] == ["correct", "tone", "comment"]
    assert len(api.get(page["next"]).json()["results"]) == 1

    response = viewer_api.get(url(queue, "/gold"), {"format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [row["correct"] for row in rows] == ["true", "false", "true"]
    assert rows[0]["comment"] == "note, 1" and rows[0]["trace_id"] == traces[0].trace_id

    response = api.get(url(queue, "/gold"), {"format": "jsonl"})
    assert response["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [line["correct"] for line in lines] == [True, False, True]


def test_it_writes_the_gold_labels_into_a_new_testset_version(
    api, project, human_evaluator, capitals_run
):
    queue = run_queue(api, human_evaluator, capitals_run, reviewers_per_item=1)
    for item, value in zip(
        QueueItem.objects.filter(queue=queue), [True, True, False, True], strict=True
    ):
        assert submit(api, queue, item.pk, correct=value).status_code == 201
    response = api.post(
        url(queue, "/gold/testset"), {"testset": "capitals", "prefix": "human_"}, format="json"
    )
    assert response.status_code == 201, response.json()
    version = response.json()
    assert version["version"] == 2 and "human_correct" in version["columns"]
    rows = TestsetVersion.objects.get(pk=version["id"]).testcases.order_by("index")
    assert [row.data["human_correct"] for row in rows] == [True, True, False, True]
    missing = api.post(url(queue, "/gold/testset"), {"testset": "nope"}, format="json")
    assert missing.status_code == 400 and "testset" in missing.json()["error"]["fields"]


# --- reliability ----------------------------------------------------------------------------------------


def test_it_measures_an_automatic_evaluator_against_the_gold_labels(
    api, project, human_evaluator, capitals_run, django_capture_on_commit_callbacks
):
    queue = run_queue(api, human_evaluator, capitals_run, reviewers_per_item=1)
    # Exact match says France, Germany pass and Italy, Spain fail; people pass Spain too.
    with django_capture_on_commit_callbacks(execute=True):
        for item, value in zip(
            QueueItem.objects.filter(queue=queue).order_by("scenario__index"),
            [True, True, False, True],
            strict=True,
        ):
            submit(api, queue, item.pk, correct=value)

    response = api.get("/api/v1/evaluators/exact/reliability")
    assert response.status_code == 200
    body = response.json()
    assert body["evaluator"]["slug"] == "exact" and body["compare"] == []
    [revision] = body["revisions"]
    assert revision["revision"]["version"] == 1
    [record] = revision["records"]
    assert (record["gold_evaluator"], record["output_field"], record["gold_field"]) == (
        "answer-review",
        "success",
        "correct",
    )
    assert record["type"] == "binary" and record["items"] == 4
    assert record["figures"]["confusion"] == {"tp": 2, "fp": 0, "fn": 1, "tn": 1}

    # A second revision judges the same traces; refreshing it answers its records.
    exact = capitals_run.steps.get(key="evaluator-exact-v1").revision.evaluator
    v2 = evaluator_revise(evaluator=exact, parameters={"case_sensitive": False}, partial=True)
    with django_capture_on_commit_callbacks(execute=True):
        run_add_evaluators(run=capitals_run, revisions=[v2])
    refreshed = api.post(
        "/api/v1/evaluators/exact/reliability/refresh", {"revision": "2"}, format="json"
    )
    assert refreshed.status_code == 200, refreshed.json()
    assert refreshed.json()["revision"]["version"] == 2
    assert refreshed.json()["records"][0]["items"] == 4

    body = api.get("/api/v1/evaluators/exact/reliability").json()
    assert [r["revision"]["version"] for r in body["revisions"]] == [2, 1]
    [pairing] = body["compare"]
    assert pairing["type"] == "binary" and pairing["gold_field"] == "correct"
    assert [r["revision"]["version"] for r in pairing["revisions"]] == [2, 1]
    assert {"kappa", "f1", "items"} <= set(pairing["revisions"][0])
    one = api.get("/api/v1/evaluators/exact/reliability", {"revision": "exact-v1"}).json()
    assert [r["revision"]["version"] for r in one["revisions"]] == [1]
    unknown = api.get("/api/v1/evaluators/exact/reliability", {"revision": "9"})
    assert unknown.status_code == 400 and "revision" in unknown.json()["error"]["fields"]


def test_a_reliability_refresh_needs_an_editor_and_a_bounded_revision(
    api, viewer_api, project, monkeypatch, capitals_run, human_evaluator
):
    assert viewer_api.post("/api/v1/evaluators/exact/reliability/refresh").status_code == 403
    queue = run_queue(api, human_evaluator, capitals_run, reviewers_per_item=1)
    for item in QueueItem.objects.filter(queue=queue):
        submit(api, queue, item.pk, correct=True)
    monkeypatch.setattr(review, "INLINE_VERDICTS", 3)
    response = api.post("/api/v1/evaluators/exact/reliability/refresh")
    assert response.status_code == 400 and "revision" in response.json()["error"]["fields"]
    assert not ReliabilityRecord.objects.exists()


# --- the online feed ------------------------------------------------------------------------------------


def test_a_queue_with_a_trace_filter_gets_matching_new_traces(
    api, human_evaluator, celery_eager, django_capture_on_commit_callbacks
):
    body = {
        "name": "Live chats",
        "evaluator": human_evaluator.slug,
        "trace_filter": {"name": "chat"},
    }
    created = api.post(QUEUES, body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["trace_filter"]["name"] == "chat"
    spans = [
        chat_span("a" * 32, question="Hi?", answer="Hello"),
        chat_span("b" * 32, question="Find x", answer="x", name="search"),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        ingested = api.post("/api/v1/traces", {"spans": spans}, format="json")
    assert ingested.status_code == 200, ingested.json()
    items = api.get(f"{QUEUES}/live-chats/items").json()["results"]
    assert [(row["trace_id"], row["source"]) for row in items] == [("a" * 32, "rule")]
