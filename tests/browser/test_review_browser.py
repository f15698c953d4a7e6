"""Reviewing with the keyboard in a real browser: a reviewer works through a queue with number
keys, Enter, `s` and `k` (going back to change an answer), another reviewer disagrees on one
item, and the adjudicator settles it with the keyboard too. The database says what happened."""

from __future__ import annotations

import pytest

from evaluators.services import evaluator_create
from runs import review
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Annotation, ItemStatus, Origin, QueueItem, Review, ReviewStatus, SettledBy
from tests.runs.factories import CAPITALS, make_testset

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

QUEUE = "/p/acme/queues/capital-answers/"


@pytest.fixture
def queue(project, owner, editor, viewer):
    """Four capitals answers (France, Germany, Italy, Spain) from a finished run, two reviews an
    item: carol (viewer) and bob (editor) review, alice (owner) adjudicates."""
    version = make_testset(project, CAPITALS)
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    run = run_execute_inline(
        run=run_create(
            project=project,
            name="Nightly",
            testset_version=version,
            application=app,
            revisions=[exact],
        )
    )
    form = evaluator_create(
        project=project,
        kind="human",
        name="Answer check",
        parameters={
            "fields": [
                {"name": "correct", "type": "boolean", "description": "Is the capital right?"},
                {"name": "comment", "type": "string", "required": False},
            ]
        },
    )
    queue = review.queue_create(
        project=project,
        name="Capital answers",
        evaluator=form,
        reviewers_per_item=2,
        reviewers=[viewer.username, editor.username],
        adjudicators=[owner.username],
        instructions="Answer **yes** when the output names the capital.\n\n- Spelling counts\n- Extra words do not",
        author=owner,
    )
    review.items_add_from_run(queue=queue, run=run, selection={"select": "all"})
    return queue


def log_in(page, username: str, password: str) -> None:
    page.context.clear_cookies()
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/p/acme/")


def showing(page, position: int) -> None:
    page.wait_for_selector(f"#review-item h1:has-text('Item {position}')")


def test_a_reviewer_and_an_adjudicator_work_with_the_keyboard(page, queue, editor, shoot):
    france, germany, italy, spain = QueueItem.objects.filter(queue=queue).order_by("position")

    log_in(page, "carol", "pw-carol-123")
    page.goto(QUEUE)
    page.click("button:has-text('Start reviewing')")
    showing(page, 1)
    assert "France" in page.inner_text("#review-item")
    assert page.is_visible("#review-hint") and page.is_hidden("#review-help")
    page.keyboard.press("?")
    assert page.is_visible("#review-help")
    page.keyboard.press("?")
    assert page.is_hidden("#review-help")

    page.keyboard.press("1")  # France: yes
    assert page.is_checked("input[name=f-correct][value=true]")
    page.screenshot(path="/tmp/review_page.png", full_page=True)
    shoot(page, "review")
    page.keyboard.press("Enter")
    showing(page, 2)
    page.keyboard.press("s")  # Germany: skipped
    showing(page, 3)
    page.keyboard.press("2")  # Italy: no (Milan) ...
    page.keyboard.press("Enter")
    showing(page, 4)
    page.keyboard.press("k")  # ... back to Italy to change the answer
    showing(page, 3)
    assert page.is_checked("input[name=f-correct][value=false]")
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    showing(page, 4)  # the item still held
    page.keyboard.press("2")  # Spain: no
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Nothing left to review")

    mine = {r.item_id: r for r in Review.objects.filter(reviewer__username="carol")}
    assert mine[germany.pk].status == ReviewStatus.SKIPPED
    assert {item.pk: mine[item.pk].outputs for item in (france, italy, spain)} == {
        france.pk: {"correct": True},
        italy.pk: {"correct": True},
        spain.pk: {"correct": False},
    }

    # Bob disagrees on France only: it waits for the adjudicator; Italy and Spain settle.
    for item, correct in ((france, False), (italy, True), (spain, False)):
        review.review_submit(item=item, reviewer=editor, outputs={"correct": correct})
    france.refresh_from_db()
    assert france.status == ItemStatus.ADJUDICATION

    log_in(page, "alice", "pw-alice-123")
    page.goto(QUEUE)
    page.click("text=Adjudicate (1)")
    page.wait_for_selector("#adjudicate-item h1:has-text('Adjudicate item 1')")
    assert page.locator("#adjudicate-item tr.differ").count() == 1
    shoot(page, "adjudicate")
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Nothing to adjudicate")

    france.refresh_from_db()
    gold = Annotation.objects.get(pk=france.gold_id)
    assert gold.origin == Origin.GOLD and gold.outputs == {"correct": True}
    assert france.status == ItemStatus.GOLD and france.settled_by == SettledBy.ADJUDICATOR
    assert france.adjudicated_by.username == "alice"
    assert Annotation.objects.filter(origin=Origin.GOLD, created_by__username="alice").count() == 1
    page.goto(QUEUE)
    page.wait_for_selector("#queue-status")
    shoot(page, "queue")
