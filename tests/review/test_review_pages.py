"""Annotation queue pages: the queues, a queue's page (progress, agreement, items, gold), its
settings, items from a run, one item, the review page (reserve, submit, skip, change an answer,
blind), adjudication into gold, and the gold out. Each page in full and as an HTMX fragment;
who may review or adjudicate, and that a refusal changes nothing.

The shared queue (tests/review/conftest.py): blind, two reviews an item, bob (editor) and
carol (viewer) review, alice (owner) adjudicates; three chat traces, items 1 to 3."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from evalsite.models import Role
from evalsite.services import membership_set, user_get_or_create
from evaluators.services import evaluator_create
from runs import review
from runs.annotations import annotation_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import (
    Annotation,
    AnnotationQueue,
    ItemStatus,
    Origin,
    QueueItem,
    Review,
    ReviewStatus,
    SettledBy,
)
from runs.traces import trace_ingest
from tests.review.conftest import chat_span
from tests.runs.factories import CAPITALS, make_testset

HTMX = {"HTTP_HX_REQUEST": "true"}
QUEUE = "/p/acme/queues/chat-answers/"


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline where they are sent."""


@pytest.fixture
def dave(project):
    """A viewer of the project who is not among the queue's reviewers."""
    user = user_get_or_create(username="dave", password="pw-dave-123")
    membership_set(project=project, user=user, role=Role.VIEWER)
    return user


@pytest.fixture
def capitals_run(project):
    """A finished run over CAPITALS with exact match: Italy and Spain fail."""
    version = make_testset(project, CAPITALS)
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    run = run_create(
        project=project, name="Nightly", testset_version=version, application=app, revisions=[exact]
    )
    return run_execute_inline(run=run)


def items(queue) -> list[QueueItem]:
    return list(QueueItem.objects.filter(queue=queue).order_by("position"))


def review_url(item) -> str:
    return f"{QUEUE}review/{item.pk}"


def submit(client, item, **values):
    body = {"action": "submit", **{f"f-{name}": value for name, value in values.items()}}
    return client.post(review_url(item), body)


def checked(page: str, field: str) -> list[str]:
    """The values of the checked radio buttons of a review form field."""
    return re.findall(rf'name="f-{field}" value="([^"]*)" id="[^"]*"(?: required)? checked', page)


def disagree(queue, editor, viewer) -> QueueItem:
    """Bob says item 1 is correct, carol says it is not: it waits for an adjudicator."""
    first = items(queue)[0]
    review.review_submit(item=first, reviewer=editor, outputs={"correct": True})
    review.review_submit(item=first, reviewer=viewer, outputs={"correct": False})
    first.refresh_from_db()
    assert first.status == ItemStatus.ADJUDICATION
    return first


# --- the queues ---------------------------------------------------------------------------------


def test_it_lists_queues_with_progress_and_swaps_the_table_for_htmx(
    viewer_client, queue, editor, viewer
):
    disagree(queue, editor, viewer)
    page = viewer_client.get("/p/acme/queues/").content.decode()
    assert "<html" in page and 'id="queue-table"' in page and ">Queues</a>" in page
    assert "Chat answers" in page and "2 / 6" in page and "33%" in page
    assert "/p/acme/queues/chat-answers/adjudicate" in page  # one item needs adjudication
    assert "New queue" not in page  # viewers do not create
    fragment = viewer_client.get("/p/acme/queues/?q=nothing", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="queue-table"') and "<html" not in fragment
    assert "Chat answers" not in fragment and "No queues match" in fragment


def test_it_offers_editors_a_new_queue(editor_client, queue):
    page = editor_client.get("/p/acme/queues/").content.decode()
    assert "/p/acme/queues/new" in page and "New queue" in page


def test_it_creates_a_queue_from_the_form(editor_client, project, human_evaluator, editor, viewer):
    page = editor_client.get("/p/acme/queues/new").content.decode()
    assert "Answer review" in page and 'name="blind"' in page and "checked" in page
    response = editor_client.post(
        "/p/acme/queues/new",
        {
            "name": "Support replies",
            "evaluator": human_evaluator.pk,
            "reviewers_per_item": "3",
            "min_agreement": "0.6",
            "reservation_minutes": "30",
            "reviewers": [editor.pk, viewer.pk],
            "adjudicators": [editor.pk],
            "instructions": "Read the **whole** reply.",
            "feed_name": "support_reply",
            "feed_percent": "25",
        },
    )
    queue = AnnotationQueue.objects.get(slug="support-replies")
    assert response.status_code == 302 and response["Location"] == "/p/acme/queues/support-replies/"
    assert (queue.reviewers_per_item, queue.min_agreement, queue.reservation_seconds) == (
        3,
        0.6,
        1800,
    )
    assert queue.blind is False  # an unticked checkbox
    assert queue.trace_filter == {"name": "support_reply"} and queue.sampling_rate == 0.25
    assert {u.username for u in queue.reviewers.all()} == {"bob", "carol"}
    assert [u.username for u in queue.adjudicators.all()] == ["bob"]
    assert queue.revision == human_evaluator.head and queue.created_by.username == "bob"


def test_it_names_a_service_refusal_inline_on_its_field(editor_client, project):
    notes = evaluator_create(
        project=project,
        kind="human",
        name="Notes only",
        parameters={"fields": [{"name": "note", "type": "string"}]},
    )
    response = editor_client.post(
        "/p/acme/queues/new",
        {
            "name": "Notes",
            "evaluator": notes.pk,
            "reviewers_per_item": "2",
            "min_agreement": "1",
            "reservation_minutes": "15",
            "blind": "on",
        },
    )
    page = response.content.decode()
    assert response.status_code == 400 and not AnnotationQueue.objects.exists()
    error = page[page.index('name="evaluator"') :]
    assert "only free-text fields: nothing to agree on" in error[: error.index("</div>")]


def test_it_edits_a_queue_but_never_its_form(editor_client, queue, owner):
    page = editor_client.get(f"{QUEUE}edit").content.decode()
    assert 'value="Chat answers"' in page and 'name="evaluator"' not in page
    assert 'name="reservation_minutes" value="15"' in page
    response = editor_client.post(
        f"{QUEUE}edit",
        {
            "name": "Chat answers v2",
            "reviewers_per_item": "1",
            "min_agreement": "0.5",
            "reservation_minutes": "5",
            "adjudicators": [owner.pk],
            "instructions": "New words.",
        },
    )
    assert response.status_code == 302 and response["Location"] == QUEUE
    queue.refresh_from_db()
    assert (queue.name, queue.reviewers_per_item, queue.reservation_seconds) == (
        "Chat answers v2",
        1,
        300,
    )
    assert queue.blind is False and queue.reviewers.count() == 0 and queue.trace_filter is None


def test_a_viewer_may_not_open_the_queue_forms(viewer_client, queue):
    assert viewer_client.get("/p/acme/queues/new").status_code == 403
    before = AnnotationQueue.objects.values_list("name", flat=True).get()
    assert viewer_client.post(f"{QUEUE}edit", {"name": "Mine"}).status_code == 403
    assert AnnotationQueue.objects.values_list("name", flat=True).get() == before


# --- a queue's page -----------------------------------------------------------------------------


def test_it_shows_the_queue_with_progress_agreement_and_items(owner_client, queue, editor, viewer):
    second, third = items(queue)[1:]
    for item, carol in (
        (second, {"correct": True, "tone": "neutral"}),
        (third, {"correct": False}),
    ):
        review.review_submit(
            item=item, reviewer=editor, outputs={"correct": True, "tone": "neutral"}
        )
        review.review_submit(item=item, reviewer=viewer, outputs=carol)
    review.queue_agreement_refresh(queue=queue)
    response = owner_client.get(QUEUE)
    page = response.content.decode()
    assert response.status_code == 200 and "<html" in page
    assert "<p>Is the answer correct?</p>" in page  # the instructions, as markdown
    status = page[page.index('id="queue-status"') : page.index('id="queue-items"')]
    assert 'hx-trigger="every 5s"' in status  # item 1 is still open
    assert "Percent agreement" in status and "Cohen's kappa" in status
    assert "Krippendorff's alpha (nominal)" in status and "95% CI" in status
    assert "Reviewer × reviewer" in status and "bob" in status and "carol" in status
    listed = page[page.index('id="queue-items"') :]
    assert "settled" in listed and "waiting for an adjudicator" in listed
    assert "collecting reviews" in listed and "unanimous" in listed
    assert f"{QUEUE}items/{third.pk}/adjudicate" in listed  # alice adjudicates
    assert "Adjudicate (1)" in page and "Start reviewing" not in page  # alice does not review
    assert f"{QUEUE}gold?format=csv" in page and f"{QUEUE}gold?format=jsonl" in page
    assert f"{QUEUE}items/add" in page and f"{QUEUE}gold/testset" in page


def test_it_swaps_the_queue_regions_for_htmx(viewer_client, queue):
    status = viewer_client.get(f"{QUEUE}?region=queue-status", **HTMX).content.decode()
    assert status.strip().startswith('<section class="card" id="queue-status"')
    assert "<html" not in status and "No agreement yet" in status
    listed = viewer_client.get(f"{QUEUE}?region=queue-items&status=gold", **HTMX).content.decode()
    assert listed.strip().startswith('<section class="card" id="queue-items"')
    assert "No item is gold." in listed


def test_it_shows_reviewers_their_button_and_hides_the_editors_forms_from_viewers(
    viewer_client, queue
):
    page = viewer_client.get(QUEUE).content.decode()
    assert "Start reviewing" in page and "Adjudicate (" not in page
    assert f"{QUEUE}items/add" not in page and f"{QUEUE}gold/testset" not in page


def test_it_renders_instructions_without_raw_html_or_script_links(owner_client, queue):
    review.queue_update(
        queue=queue,
        instructions="**Careful**\n\n- one\n- two\n\n<script>alert(1)</script>\n\n[x](javascript:alert(1))",
    )
    page = owner_client.get(QUEUE).content.decode()
    assert "<strong>Careful</strong>" in page and "<li>one</li>" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert 'href="javascript:' not in page


# --- items from a run ----------------------------------------------------------------------------


def test_it_adds_the_failed_scenarios_of_a_run(editor_client, queue, capitals_run):
    page = editor_client.get(f"{QUEUE}items/add?run={capitals_run.pk}").content.decode()
    assert f'<option value="{capitals_run.pk}" selected>#{capitals_run.pk} Nightly' in page
    response = editor_client.post(
        f"{QUEUE}items/add", {"run": capitals_run.pk, "select": "failed", "seed": "0"}, follow=True
    )
    assert response.redirect_chain == [(QUEUE, 302)]
    assert "Added 2 items." in response.content.decode()
    added = QueueItem.objects.filter(queue=queue, run=capitals_run).order_by("position")
    assert [item.scenario.inputs["country"] for item in added] == ["Italy", "Spain"]
    assert [item.position for item in added] == [4, 5] and {i.source for i in added} == {"run"}


def test_it_names_an_unknown_step_inline(editor_client, queue, capitals_run):
    response = editor_client.post(
        f"{QUEUE}items/add",
        {"run": capitals_run.pk, "select": "metric_range", "step": "nope", "min": "0.5"},
    )
    page = response.content.decode()
    assert response.status_code == 400 and QueueItem.objects.filter(queue=queue).count() == 3
    error = page[page.index('name="step"') :]
    assert "No evaluator step &#x27;nope&#x27; in this run" in error[: error.index("</div>")]


def test_a_viewer_may_not_add_items(viewer_client, queue, capitals_run):
    response = viewer_client.post(f"{QUEUE}items/add", {"run": capitals_run.pk, "select": "all"})
    assert response.status_code == 403 and QueueItem.objects.filter(queue=queue).count() == 3


# --- one item ------------------------------------------------------------------------------------


def test_it_shows_an_item_with_its_trace_and_reviews(owner_client, queue, editor, viewer):
    first = disagree(queue, editor, viewer)
    page = owner_client.get(f"{QUEUE}items/{first.pk}").content.decode()
    assert "<html" in page and "What is the capital of France?" in page and "Paris" in page
    assert f"/p/acme/traces/{first.trace.trace_id}/" in page
    reviews = page[page.index('id="queue-item-reviews"') :]
    assert "bob" in reviews and "carol" in reviews and "differ" in reviews
    assert f"{QUEUE}items/{first.pk}/adjudicate" in page
    fragment = owner_client.get(
        f"{QUEUE}items/{first.pk}?region=queue-item-reviews", **HTMX
    ).content.decode()
    assert fragment.strip().startswith('<div class="stack" id="queue-item-reviews"')
    assert "<html" not in fragment and 'hx-trigger="every 10s"' not in fragment  # not open


def test_it_links_an_item_from_a_run_to_its_scenario(viewer_client, queue, capitals_run):
    review.items_add_from_run(queue=queue, run=capitals_run, selection={"select": "failed"})
    italy = items(queue)[3]
    page = viewer_client.get(f"{QUEUE}items/{italy.pk}").content.decode()
    index = italy.scenario.index
    assert f"/p/acme/runs/{capitals_run.pk}/scenarios/{index}/" in page and "Milan" in page


# --- reviewing -----------------------------------------------------------------------------------


def test_a_viewer_who_reviews_reserves_the_next_item_and_submits(viewer_client, queue, viewer):
    first, second, _ = items(queue)
    response = viewer_client.get(f"{QUEUE}review")
    assert response.status_code == 302 and response["Location"] == review_url(first)
    held = Review.objects.get(item=first, reviewer=viewer)
    assert held.status == ReviewStatus.RESERVED and held.reserved_until is not None
    page = viewer_client.get(review_url(first)).content.decode()
    assert "<html" in page and "What is the capital of France?" in page
    assert 'name="f-correct" value="true"' in page and "Yes" in page and "<kbd" in page
    assert "js/review.js" in page and 'id="review-help"' in page and "<kbd>s</kbd> skip" in page
    response = submit(viewer_client, first, correct="true", tone="friendly", comment="Fine.")
    assert response.status_code == 302 and response["Location"] == f"{QUEUE}review"
    held.refresh_from_db()
    assert held.status == ReviewStatus.SUBMITTED
    assert held.outputs == {"correct": True, "tone": "friendly", "comment": "Fine."}
    assert viewer_client.get(f"{QUEUE}review")["Location"] == review_url(second)


def test_the_review_region_swaps_for_htmx(viewer_client, queue, viewer):
    first, second, _ = items(queue)
    fragment = viewer_client.get(f"{QUEUE}review", **HTMX)
    text = fragment.content.decode()
    assert fragment.status_code == 200 and fragment["HX-Push-Url"] == review_url(first)
    assert text.strip().startswith('<div id="review-item"') and "<html" not in text
    assert 'hx-post="' + review_url(first) + '"' in text
    response = viewer_client.post(
        review_url(first), {"action": "submit", "f-correct": "false"}, **HTMX
    )
    text = response.content.decode()
    assert response.status_code == 200 and response["HX-Push-Url"] == review_url(second)
    assert text.strip().startswith('<div id="review-item"') and "Item 2" in text
    assert Review.objects.get(item=first, reviewer=viewer).outputs == {"correct": False}


def test_a_viewer_not_among_the_reviewers_gets_403_and_changes_nothing(client, queue, dave):
    client.force_login(dave)
    first = items(queue)[0]
    assert client.get(f"{QUEUE}review").status_code == 403
    assert client.post(f"{QUEUE}review").status_code == 403
    assert client.get(review_url(first)).status_code == 403
    assert submit(client, first, correct="true").status_code == 403
    assert client.post(review_url(first), {"action": "skip"}).status_code == 403
    assert not Review.objects.exists()
    assert "Start reviewing" not in client.get(QUEUE).content.decode()


def test_a_blind_queue_hides_other_reviews_and_verdicts_until_submitted(
    viewer_client, project, queue, editor, viewer
):
    first = items(queue)[0]
    judge = evaluator_create(project=project, kind="exact_match", name="Auto judge")
    annotation_create(
        project=project,
        evaluator=judge.slug,
        outputs={"success": False, "score": 0.0},
        trace=first.trace,
        origin=Origin.AUTO,
    )
    review.review_submit(item=first, reviewer=editor, outputs={"correct": True, "comment": "Bob's"})
    before = viewer_client.get(review_url(first)).content.decode()
    assert "Blind review" in before and "Bob&#x27;s" not in before and "auto-judge" not in before
    item_page = viewer_client.get(f"{QUEUE}items/{first.pk}").content.decode()
    assert "Blind review" in item_page and "Bob&#x27;s" not in item_page
    assert "auto-judge" not in item_page
    submit(viewer_client, first, correct="false", tone="neutral")
    after = viewer_client.get(f"{QUEUE}items/{first.pk}").content.decode()
    assert "Blind review" not in after and "Bob&#x27;s" in after and "auto-judge" in after
    assert "success = false" in after


def test_an_open_queue_shows_others_at_once(viewer_client, queue, editor):
    review.queue_update(queue=queue, blind=False)
    first = items(queue)[0]
    review.review_submit(item=first, reviewer=editor, outputs={"correct": True, "comment": "Bob's"})
    page = viewer_client.get(review_url(first)).content.decode()
    assert "Blind review" not in page and "Other reviews" in page and "Bob&#x27;s" in page


def test_a_missing_required_field_is_named_inline_and_saves_nothing(viewer_client, queue, viewer):
    first = items(queue)[0]
    response = submit(viewer_client, first, tone="friendly")
    page = response.content.decode()
    assert response.status_code == 400
    fieldset = page[page.index('data-choice-field="f-correct"') :]
    assert "This field is required." in fieldset[: fieldset.index("</fieldset>")]
    assert checked(page, "tone") == ["friendly"]
    assert not Review.objects.filter(status=ReviewStatus.SUBMITTED).exists()


def test_it_converts_posted_values_by_type_and_names_a_bad_one(viewer_client, project, viewer):
    scale = evaluator_create(
        project=project,
        kind="human",
        name="Scale",
        parameters={
            "fields": [
                {"name": "stars", "type": "integer", "min": 1, "max": 5},
                {"name": "confidence", "type": "number", "min": 0, "max": 1},
                {"name": "tokens", "type": "integer", "min": 0, "max": 10000, "required": False},
            ]
        },
    )
    scaled = review.queue_create(
        project=project, name="Scale", evaluator=scale, reviewers_per_item=1
    )
    trace_ingest(project=project, spans=[chat_span("ab" * 16, question="Q", answer="A")])
    review.items_add_traces(queue=scaled, trace_ids=["ab" * 16])
    item = scaled.items.get()
    url = f"/p/acme/queues/scale/review/{item.pk}"
    page = viewer_client.get(url).content.decode()
    assert 'name="f-stars" value="5"' in page and 'type="number" name="f-confidence"' in page
    bad = viewer_client.post(url, {"action": "submit", "f-stars": "4", "f-confidence": "lots"})
    assert bad.status_code == 400 and "Enter a number." in bad.content.decode()
    assert not Review.objects.filter(status=ReviewStatus.SUBMITTED).exists()
    viewer_client.post(
        url, {"action": "submit", "f-stars": "4", "f-confidence": "0.75", "f-tokens": ""}
    )
    assert Review.objects.get().outputs == {"stars": 4, "confidence": 0.75}


def test_it_skips_an_item_and_hands_out_the_next(viewer_client, queue, viewer):
    first, second, _ = items(queue)
    response = viewer_client.post(review_url(first), {"action": "skip"})
    assert response.status_code == 302 and response["Location"] == f"{QUEUE}review"
    assert Review.objects.get(item=first, reviewer=viewer).status == ReviewStatus.SKIPPED
    assert viewer_client.get(f"{QUEUE}review")["Location"] == review_url(second)


def test_it_goes_back_to_the_previous_review_to_change_the_answer(viewer_client, queue, viewer):
    first, second, _ = items(queue)
    submit(viewer_client, first, correct="true")
    viewer_client.get(f"{QUEUE}review")
    page = viewer_client.get(review_url(second)).content.decode()
    assert f'data-review-nav="prev" href="{review_url(first)}"' in page
    before = viewer_client.get(review_url(first)).content.decode()
    assert "Your answer" in before and checked(before, "correct") == ["true"]
    assert "Change answer" in before and 'value="skip"' not in before
    submit(viewer_client, first, correct="false")
    assert Review.objects.get(item=first, reviewer=viewer).outputs == {"correct": False}


def test_a_settled_item_cannot_change_and_says_so(viewer_client, queue, editor, viewer):
    first = disagree(queue, editor, viewer)
    page = viewer_client.get(review_url(first)).content.decode()
    assert "waiting for an adjudicator: answers can no longer change" in page
    response = submit(viewer_client, first, correct="true")
    assert (
        response.status_code == 409
        and "already waiting for an adjudicator" in response.content.decode()
    )
    assert Review.objects.get(item=first, reviewer=viewer).outputs == {"correct": False}


def test_it_says_when_nothing_is_left_to_review(viewer_client, queue, viewer):
    for item in items(queue):
        submit(viewer_client, item, correct="true")
    response = viewer_client.get(f"{QUEUE}review")
    page = response.content.decode()
    assert response.status_code == 200 and "Nothing left to review" in page and "<html" in page
    assert f'data-review-nav="prev" href="{review_url(items(queue)[2])}"' in page
    fragment = viewer_client.get(f"{QUEUE}review", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="review-item"') and "Nothing left" in fragment


# --- adjudicating --------------------------------------------------------------------------------


def test_an_adjudicator_settles_a_disagreement_into_gold(
    owner_client, queue, editor, viewer, owner
):
    first = disagree(queue, editor, viewer)
    response = owner_client.get(f"{QUEUE}adjudicate")
    assert (
        response.status_code == 302
        and response["Location"] == f"{QUEUE}items/{first.pk}/adjudicate"
    )
    page = owner_client.get(response["Location"]).content.decode()
    assert "<html" in page and 'class="differ"' in page and "bob" in page and "carol" in page
    assert checked(page, "correct") == []  # a tie prefills nothing
    response = owner_client.post(
        f"{QUEUE}items/{first.pk}/adjudicate", {"f-correct": "true", "f-tone": "neutral"}
    )
    assert response.status_code == 302 and response["Location"] == f"{QUEUE}adjudicate"
    first.refresh_from_db()
    gold = Annotation.objects.get(origin=Origin.GOLD)
    assert gold.outputs == {"correct": True, "tone": "neutral"} and first.gold == gold
    assert first.status == ItemStatus.GOLD and first.settled_by == SettledBy.ADJUDICATOR
    assert first.adjudicated_by == owner and gold.trace == first.trace
    done = owner_client.get(f"{QUEUE}adjudicate").content.decode()
    assert "Nothing to adjudicate" in done


def test_the_adjudication_region_swaps_for_htmx(owner_client, queue, editor, viewer):
    first = disagree(queue, editor, viewer)
    fragment = owner_client.get(f"{QUEUE}adjudicate", **HTMX)
    text = fragment.content.decode()
    assert fragment["HX-Push-Url"] == f"{QUEUE}items/{first.pk}/adjudicate"
    assert text.strip().startswith('<div id="adjudicate-item"') and "<html" not in text
    response = owner_client.post(
        f"{QUEUE}items/{first.pk}/adjudicate", {"f-correct": "false"}, **HTMX
    )
    assert "Nothing to adjudicate" in response.content.decode()
    assert Annotation.objects.get(origin=Origin.GOLD).outputs == {"correct": False}


def test_the_adjudication_form_is_prefilled_with_the_majority(
    client, project, queue, editor, viewer, owner
):
    review.queue_update(queue=queue, reviewers_per_item=3, min_agreement=1.0, reviewers=[])
    third_reviewer = user_get_or_create(username="erin", password="pw-erin-123")
    membership_set(project=project, user=third_reviewer, role=Role.VIEWER)
    first = items(queue)[0]
    for user, correct in ((editor, True), (viewer, False), (third_reviewer, True)):
        review.review_submit(item=first, reviewer=user, outputs={"correct": correct})
    first.refresh_from_db()
    assert first.status == ItemStatus.ADJUDICATION  # 2 of 3 is below 1.0
    client.force_login(owner)
    page = client.get(f"{QUEUE}items/{first.pk}/adjudicate").content.decode()
    assert checked(page, "correct") == ["true"]


def test_only_adjudicators_adjudicate(viewer_client, queue, editor, viewer):
    first = disagree(queue, editor, viewer)
    assert viewer_client.get(f"{QUEUE}adjudicate").status_code == 403
    assert viewer_client.get(f"{QUEUE}items/{first.pk}/adjudicate").status_code == 403
    response = viewer_client.post(f"{QUEUE}items/{first.pk}/adjudicate", {"f-correct": "true"})
    assert (
        response.status_code == 403 and not Annotation.objects.filter(origin=Origin.GOLD).exists()
    )


# --- gold out ------------------------------------------------------------------------------------


def test_it_exports_the_gold_labels_as_csv_and_jsonl(
    viewer_client, owner_client, queue, editor, viewer
):
    first = disagree(queue, editor, viewer)
    owner_client.post(
        f"{QUEUE}items/{first.pk}/adjudicate", {"f-correct": "true", "f-comment": "=1+1"}
    )
    second = items(queue)[1]
    review.review_submit(item=second, reviewer=editor, outputs={"correct": False})
    review.review_submit(item=second, reviewer=viewer, outputs={"correct": False})
    response = viewer_client.get(f"{QUEUE}gold?format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="chat-answers-gold.csv"'
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert list(rows[0]) == review.gold_columns(queue)
    assert [(r["item"], r["settled_by"], r["correct"], r["adjudicated_by"]) for r in rows] == [
        (str(first.pk), "adjudicator", "true", "alice"),
        (str(second.pk), "unanimous", "false", ""),
    ]
    assert rows[0]["comment"] == "'=1+1"  # a spreadsheet formula stays text
    assert rows[0]["trace_id"] == first.trace.trace_id and rows[1]["agreement"] == "1.0"
    lines = b"".join(viewer_client.get(f"{QUEUE}gold?format=jsonl").streaming_content).decode()
    parsed = [json.loads(line) for line in lines.splitlines()]
    assert [(p["item"], p["correct"]) for p in parsed] == [(first.pk, True), (second.pk, False)]
    assert viewer_client.get(f"{QUEUE}gold?format=xlsx").status_code == 400


def test_it_writes_gold_labels_into_a_testset(editor_client, queue, capitals_run, editor, viewer):
    review.items_add_from_run(queue=queue, run=capitals_run, selection={"select": "failed"})
    italy, spain = items(queue)[3:]
    for item, verdict in ((italy, False), (spain, False)):
        review.review_submit(item=item, reviewer=editor, outputs={"correct": verdict})
        review.review_submit(item=item, reviewer=viewer, outputs={"correct": verdict})
    testset = capitals_run.testset_version.testset
    response = editor_client.post(
        f"{QUEUE}gold/testset", {"testset": testset.pk, "prefix": "gold_"}
    )
    assert (
        response.status_code == 302 and response["Location"] == f"/p/acme/testsets/{testset.slug}/"
    )
    testset.refresh_from_db()
    rows = {row.data["country"]: row.data for row in testset.head.testcases.all()}
    assert testset.head.version == 2
    assert rows["Italy"]["gold_correct"] is False and rows["France"]["gold_correct"] is None


def test_a_gold_testset_without_matching_rows_says_why(editor_client, project, queue):
    other = make_testset(project, CAPITALS, slug="other")
    response = editor_client.post(
        f"{QUEUE}gold/testset", {"testset": other.testset.pk, "prefix": "gold_"}, follow=True
    )
    assert "No gold label of chat-answers is about a row of other" in response.content.decode()
    other.testset.refresh_from_db()
    assert other.testset.head.version == 1
