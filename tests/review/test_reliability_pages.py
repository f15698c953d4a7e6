"""Reliability where people read numbers: the evaluator page's "How far to trust this
evaluator" (full page and fragment, the empty state, recompute), corrected pass rates on the run
and comparison pages, and the drill-in's reviews (blind queues respected) with "Send to a
queue"."""

from __future__ import annotations

import pytest

from evaluators.models import ReliabilityRecord
from evaluators.services import evaluator_create, evaluator_revise
from runs import review
from runs.engine import run_add_evaluators, run_create, run_execute_inline
from runs.models import QueueItem
from runs.review import measures
from tests.review.test_reliability import build_run, gold_queue, human

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "evaluator-reliability"}


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline where they are sent."""


@pytest.fixture
def labelled(project, owner, django_capture_on_commit_callbacks):
    """A finished run whose 12 scenarios all carry gold labels (5 TP, 1 FP, 2 FN, 4 TN for
    exact match)."""
    with django_capture_on_commit_callbacks(execute=True):
        run, exact, similar = build_run(project)
        gold_queue(project, run, owner)
    return run, exact, similar


def evaluator_url(revision) -> str:
    return f"/p/acme/evaluators/{revision.evaluator.slug}/"


def refresh_url(revision) -> str:
    return f"/p/acme/evaluators/{revision.evaluator.slug}/reliability/refresh"


def scenario_url(run, index: int) -> str:
    return f"/p/acme/runs/{run.pk}/scenarios/{index}/"


# --- the evaluator page ---------------------------------------------------------------------------


def test_it_shows_how_far_to_trust_the_evaluator(viewer_client, labelled):
    _, exact, _ = labelled
    response = viewer_client.get(evaluator_url(exact))
    page = response.content.decode()
    assert response.status_code == 200 and "<html" in page
    section = page[page.index('id="evaluator-reliability"') :]
    assert "How far to trust this evaluator" in section
    assert "thumbs.success" in section and "rests on <b>12</b> gold items" in section
    assert "fewer than 30: intervals are wide" in section
    # The confusion matrix, gold in rows: of the 7 gold passes it passes 5 and fails 2.
    assert '<th scope="row">gold pass</th><td class="num">5</td><td class="num">2</td>' in section
    assert '<th scope="row">gold fail</th><td class="num">1</td><td class="num">4</td>' in section
    assert "<b>75%</b>" in section  # accuracy 9 / 12
    assert "Cohen&#x27;s κ" in section and "Specificity" in section
    assert "Recompute" not in section  # a viewer reads, an editor recomputes


def test_it_shows_correlations_for_a_numeric_pairing(viewer_client, labelled):
    *_, similar = labelled
    section = viewer_client.get(evaluator_url(similar)).content.decode()
    assert "thumbs.score" in section and "Spearman ρ" in section and "Pearson r" in section
    assert "Mean absolute error" in section


def test_it_serves_the_section_as_a_fragment(viewer_client, labelled):
    _, exact, _ = labelled
    fragment = viewer_client.get(evaluator_url(exact), **HTMX).content.decode()
    assert fragment.strip().startswith('<section class="card" id="evaluator-reliability"')
    assert "<html" not in fragment and "Revisions" not in fragment
    assert "thumbs.success" in fragment


def test_it_shows_consistency_across_repeats(
    viewer_client, project, owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run, exact, _ = build_run(project, repeats=2)
        gold_queue(project, run, owner)
    section = viewer_client.get(evaluator_url(exact)).content.decode()
    assert "<b>Across repeats</b>: the same verdict every time on <b>100%</b>" in section
    assert "of 12 gold items; consecutive repeats differ 0% of the time" in section


def test_it_shows_a_categorical_record_as_a_matrix(viewer_client, project):
    exact = evaluator_create(project=project, kind="exact_match", name="Tone").head
    figures = measures.categorical_record(
        ["rude", "kind", "kind", "rude"], ["rude", "kind", "rude", "rude"], ["kind", "rude"]
    )
    ReliabilityRecord.objects.create(
        project=project,
        revision=exact,
        gold_evaluator=human(project),
        output_field="label",
        gold_field="tone",
        type="categorical",
        items=4,
        figures={**figures, "consistency": measures.consistency([])},
    )
    section = viewer_client.get(evaluator_url(exact)).content.decode()
    assert "gold ↓ · it says →" in section and "<b>75%</b>" in section
    assert '<th scope="row">rude</th><td class="num">1</td><td class="num">2</td>' in section
    assert "Across repeats" not in section


def test_it_explains_how_to_get_a_record_when_there_is_none(viewer_client, project):
    exact = evaluator_create(project=project, kind="exact_match", name="Lonely").head
    section = viewer_client.get(evaluator_url(exact)).content.decode()
    assert "No reliability record yet" in section and "annotation queue" in section
    assert 'href="/p/acme/queues/"' in section


def test_it_tells_a_human_form_what_it_is_for(viewer_client, project):
    form = human(project)
    page = viewer_client.get(f"/p/acme/evaluators/{form.slug}/").content.decode()
    assert "it is the truth other evaluators are measured against" in page


def test_it_puts_revisions_of_one_pairing_side_by_side(
    viewer_client, labelled, django_capture_on_commit_callbacks
):
    run, exact, _ = labelled
    loose = evaluator_revise(evaluator=exact.evaluator, parameters={"case_sensitive": False})
    with django_capture_on_commit_callbacks(execute=True):
        run_add_evaluators(run=run, revisions=[loose])
    assert ReliabilityRecord.objects.filter(revision=loose).exists()
    page = viewer_client.get(evaluator_url(exact)).content.decode()
    assert "Revisions side by side" in page
    table = page[page.index("Revisions side by side") :]
    assert table.index(loose.slug) < table.index(exact.slug)  # newest first, the head marked
    assert "head</span>" in table and "F1" in table and "Cohen" in table


def test_it_recomputes_for_an_editor(editor_client, labelled):
    _, exact, _ = labelled
    ReliabilityRecord.objects.filter(revision=exact).delete()
    response = editor_client.post(refresh_url(exact))
    assert response.status_code == 302 and response["Location"] == evaluator_url(exact)
    assert ReliabilityRecord.objects.filter(revision=exact).count() == 1
    page = editor_client.get(response["Location"]).content.decode()
    assert "Recomputed 1 reliability record(s)" in page and "Recompute</button>" in page


def test_it_recomputes_in_place_for_htmx(editor_client, labelled):
    _, exact, _ = labelled
    ReliabilityRecord.objects.filter(revision=exact).delete()
    response = editor_client.post(refresh_url(exact), follow=True, **HTMX)
    fragment = response.content.decode()
    assert fragment.strip().startswith('<section class="card" id="evaluator-reliability"')
    assert "Recomputed 1 reliability record(s)" in fragment and "thumbs.success" in fragment


def test_it_queues_a_large_recompute(
    editor_client, labelled, monkeypatch, django_capture_on_commit_callbacks
):
    _, exact, _ = labelled
    monkeypatch.setattr(review, "INLINE_VERDICTS", 5)
    ReliabilityRecord.objects.filter(revision=exact).delete()
    with django_capture_on_commit_callbacks(execute=True):
        response = editor_client.post(refresh_url(exact))
    assert response.status_code == 302
    page = editor_client.get(response["Location"]).content.decode()
    assert "recomputed in the background" in page
    assert ReliabilityRecord.objects.filter(revision=exact).count() == 1  # the task ran (eager)


def test_a_viewer_may_not_recompute(viewer_client, labelled):
    _, exact, _ = labelled
    ReliabilityRecord.objects.filter(revision=exact).delete()
    response = viewer_client.post(refresh_url(exact))
    assert response.status_code == 403
    assert not ReliabilityRecord.objects.filter(revision=exact).exists()


def test_recompute_answers_only_post(editor_client, labelled):
    _, exact, _ = labelled
    assert editor_client.get(refresh_url(exact)).status_code in (403, 405)


# --- corrected pass rates -------------------------------------------------------------------------


def test_the_run_page_shows_the_corrected_pass_rate(viewer_client, labelled):
    run, exact, _ = labelled
    entry = review.corrected_rates(run)[f"evaluator-{exact.slug}"][0]
    page = viewer_client.get(f"/p/acme/runs/{run.pk}/").content.decode()
    low, high = entry["ci"]
    expected = (
        f"<b>{entry['value'] * 100:.0f}%</b> [{low * 100:.0f}–{high * 100:.0f}%], on 12 gold items"
    )
    assert expected in page
    assert "Rogan–Gladen correction" in page and "sensitivity 71% and specificity 80%" in page


def test_the_run_page_says_why_a_rate_is_not_corrected(
    viewer_client, project, owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run, _, _ = build_run(project)
        queue = review.queue_create(
            project=project, name="Yes", evaluator=human(project), reviewers_per_item=1
        )
        review.items_add_from_run(queue=queue, run=run)
        while (item := review.item_next(queue=queue, reviewer=owner)) is not None:
            review.review_submit(item=item, reviewer=owner, outputs={"success": True, "score": 5})
    page = viewer_client.get(f"/p/acme/runs/{run.pk}/").content.decode()
    assert "not corrected</abbr>: the gold items need both passing and failing examples" in page


def test_the_run_page_shows_no_correction_without_gold(viewer_client, project):
    run, _, _ = build_run(project)
    page = viewer_client.get(f"/p/acme/runs/{run.pk}/").content.decode()
    assert "exact-1.success" in page and "corrected" not in page


def test_the_compare_page_shows_each_runs_corrected_rate(viewer_client, project, labelled):
    run, exact, similar = labelled
    again = run_execute_inline(
        run=run_create(
            project=project,
            name="Again",
            testset_version=run.testset_version,
            application=run.application,
            revisions=[exact, similar],
        )
    )
    page = viewer_client.get(f"/p/acme/runs/compare?runs={run.pk},{again.pk}").content.decode()
    cards = page[page.index("compare-metrics-title") : page.index('id="compare-rows"')]
    assert "Corrected</abbr></th>" in cards
    # Both runs pass the same 6 of 12 with the same revision: the same corrected rate twice.
    entry = review.corrected_rates(run)[f"evaluator-{exact.slug}"][0]
    assert cards.count(f"<b>{entry['value'] * 100:.0f}%</b>") >= 2
    assert cards.count("12 gold items") >= 4  # exact and similar, for each run


# --- the drill-in -------------------------------------------------------------------------------


def test_the_drill_in_lists_reviews_and_the_gold_label(viewer_client, labelled):
    run, *_ = labelled
    page = viewer_client.get(scenario_url(run, 5)).content.decode()
    section = page[page.index('id="scenario-reviews"') :]
    assert "Gold" in section and "settled" in section and "alice" in section
    assert '<span class="mono">success</span> false' in section  # the planted false positive
    assert "Gold label" in section and "settled unanimously" in section
    assert "Send to a queue" not in section  # viewers do not add items


@pytest.fixture
def blind(project, editor, viewer, labelled, django_capture_on_commit_callbacks):
    """A blind two-reviewer queue (the editor and the viewer) holding scenario 0, which the
    editor has reviewed."""
    run, *_ = labelled
    with django_capture_on_commit_callbacks(execute=True):
        queue = review.queue_create(
            project=project,
            name="Second look",
            evaluator=human(project, "second"),
            reviewers_per_item=2,
            blind=True,
            reviewers=[editor.username, viewer.username],
        )
        review.items_add_scenarios(queue=queue, run=run, indexes=[0])
        item = review.item_next(queue=queue, reviewer=editor)
        review.review_submit(
            item=item, reviewer=editor, outputs={"success": False, "score": 3, "comment": "terse"}
        )
    return run, queue, item


def test_a_blind_reviewer_does_not_see_the_reviews_before_reviewing(viewer_client, blind):
    run, queue, item = blind
    page = viewer_client.get(scenario_url(run, 0)).content.decode()
    section = page[page.index('id="scenario-reviews"') :]
    assert "Second look" in section and "hidden until you review" in section
    assert "terse" not in section and "bob" not in section
    assert f"/queues/{queue.slug}/review/{item.pk}" in section


def test_a_reviewer_who_reviewed_sees_the_answers(editor_client, blind):
    run, *_ = blind
    section = editor_client.get(scenario_url(run, 0)).content.decode()
    section = section[section.index('id="scenario-reviews"') :]
    assert "hidden until you review" not in section and "terse" in section and "bob" in section


def test_someone_outside_a_blind_queue_sees_the_answers(owner_client, blind):
    run, *_ = blind
    section = owner_client.get(scenario_url(run, 0)).content.decode()
    assert "terse" in section and "hidden until you review" not in section


@pytest.fixture
def empty_queue(project):
    return review.queue_create(project=project, name="Inbox", evaluator=human(project, "inbox"))


def test_an_editor_sends_a_scenario_to_a_queue(editor_client, labelled, empty_queue):
    run, *_ = labelled
    page = editor_client.get(scenario_url(run, 3)).content.decode()
    assert "Send to a queue" in page and f'<option value="{empty_queue.pk}">Inbox</option>' in page
    response = editor_client.post(f"{scenario_url(run, 3)}queue", {"queue": empty_queue.pk})
    assert response.status_code == 302 and response["Location"] == scenario_url(run, 3)
    item = QueueItem.objects.get(queue=empty_queue)
    assert (item.scenario.index, item.source, item.run_id) == (3, "manual", run.pk)
    page = editor_client.get(response["Location"]).content.decode()
    assert "Scenario 3 sent to Inbox." in page and "collecting reviews" in page


def test_sending_twice_adds_nothing(editor_client, labelled, empty_queue):
    run, *_ = labelled
    editor_client.post(f"{scenario_url(run, 3)}queue", {"queue": empty_queue.pk})
    response = editor_client.post(f"{scenario_url(run, 3)}queue", {"queue": empty_queue.pk})
    assert QueueItem.objects.filter(queue=empty_queue).count() == 1
    assert "is in Inbox already" in editor_client.get(response["Location"]).content.decode()


def test_sending_without_a_queue_says_so(editor_client, labelled, empty_queue):
    run, *_ = labelled
    response = editor_client.post(f"{scenario_url(run, 3)}queue", {"queue": "nope"})
    assert response.status_code == 302
    assert not QueueItem.objects.filter(queue=empty_queue).exists()
    page = editor_client.get(response["Location"]).content.decode()
    assert "Choose an annotation queue of this project." in page


def test_a_viewer_may_not_send_to_a_queue(viewer_client, labelled, empty_queue):
    run, *_ = labelled
    response = viewer_client.post(f"{scenario_url(run, 3)}queue", {"queue": empty_queue.pk})
    assert response.status_code == 403
    assert not QueueItem.objects.filter(queue=empty_queue).exists()


def test_an_outsider_finds_no_scenario_to_send(outsider_client, labelled, empty_queue):
    run, *_ = labelled
    response = outsider_client.post(f"{scenario_url(run, 3)}queue", {"queue": empty_queue.pk})
    assert response.status_code == 404
    assert not QueueItem.objects.filter(queue=empty_queue).exists()
