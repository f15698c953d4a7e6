"""Reliability records and corrected pass rates, on real runs: a column application and two
automatic evaluators (exact match, similarity) judged by the engine, gold labels given through a
one-reviewer queue with planted disagreements, and figures checked against hand-computed values
(and scipy for the correlations)."""

from __future__ import annotations

import pytest
from scipy import stats

from evaluators.models import ReliabilityRecord
from evaluators.services import evaluator_create
from runs import review, tasks
from runs.applications import application_create
from runs.engine import run_add_evaluators, run_create, run_execute_inline
from runs.models import Annotation, Origin, QueueItem, Result
from tests.runs.factories import make_testset

# (output, correct answer, the gold "success", the gold "score"). Exact match passes rows 0-5.
# Planted: row 5 passes but the reviewer says it is wrong (a false positive); rows 6 and 7 fail
# on case and punctuation but the reviewer accepts them (false negatives).
ROWS = [
    ("Paris", "Paris", True, 5),
    ("Berlin", "Berlin", True, 5),
    ("Rome", "Rome", True, 4),
    ("Madrid", "Madrid", True, 5),
    ("Lisbon", "Lisbon", True, 4),
    ("Bern", "Bern", False, 2),
    ("vienna", "Vienna", True, 4),
    ("Athens.", "Athens", True, 3),
    ("Milan", "Rome", False, 1),
    ("I don't know", "Oslo", False, 2),
    ("Sydney", "Canberra", False, 1),
    ("Toronto", "Ottawa", False, 1),
]
TP, FP, FN, TN = 5, 1, 2, 4
N = len(ROWS)
THUMBS_AND_SCORE = {
    "fields": [
        {"name": "success", "type": "boolean"},
        {"name": "score", "type": "integer", "min": 1, "max": 5},
        {"name": "comment", "type": "string", "required": False},
    ]
}


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    """Tasks run inline where they are sent."""


def build_run(project, *, repeats: int = 1, name: str = "Capitals"):
    """A finished run over ROWS: a column application, exact match and similarity."""
    rows = [
        {"country": f"c{i}", "correct_answer": truth, "outputs": out}
        for i, (out, truth, *_) in enumerate(ROWS)
    ]
    version = make_testset(project, rows, slug=f"capitals-{repeats}")
    app = application_create(
        project=project,
        name=f"Column {repeats}",
        kind="column",
        config={"outputs_column": "outputs"},
    )
    exact = evaluator_create(project=project, kind="exact_match", name=f"Exact {repeats}").head
    similar = evaluator_create(
        project=project, kind="similarity", name=f"Similar {repeats}", parameters={"threshold": 0.8}
    ).head
    run = run_create(
        project=project,
        name=name,
        testset_version=version,
        application=app,
        revisions=[exact, similar],
        repeats=repeats,
    )
    return run_execute_inline(run=run), exact, similar


def human(project, slug: str = "thumbs"):
    return evaluator_create(
        project=project, kind="human", name=slug.title(), slug=slug, parameters=THUMBS_AND_SCORE
    )


def gold_queue(project, run, reviewer, *, human_evaluator=None, **options):
    """Every scenario of the run into a one-reviewer queue, each reviewed with ROWS' gold
    labels: every review becomes gold at once."""
    queue = review.queue_create(
        project=project,
        name="Gold",
        evaluator=human_evaluator or human(project),
        reviewers_per_item=1,
        blind=options.pop("blind", False),
        **options,
    )
    review.items_add_from_run(queue=queue, run=run, selection={"select": "all"})
    while (item := review.item_next(queue=queue, reviewer=reviewer)) is not None:
        _, _, success, score = ROWS[item.scenario.index]
        review.review_submit(
            item=item, reviewer=reviewer, outputs={"success": success, "score": score}
        )
    return queue


@pytest.fixture
def labelled(project, owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run, exact, similar = build_run(project)
        queue = gold_queue(project, run, owner)
    return run, exact, similar, queue


def record(revision, output_field: str, gold_field: str) -> ReliabilityRecord:
    return ReliabilityRecord.objects.get(
        revision=revision, output_field=output_field, gold_field=gold_field
    )


def kappa(tp: int, fp: int, fn: int, tn: int) -> float:
    n = tp + fp + fn + tn
    observed = (tp + tn) / n
    expected = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / n**2
    return (observed - expected) / (1 - expected)


def test_it_settles_every_item_into_gold(labelled):
    *_, queue = labelled
    assert QueueItem.objects.filter(queue=queue, status="gold").count() == N
    assert Annotation.objects.filter(evaluator=queue.evaluator, origin=Origin.GOLD).count() == N


def test_it_writes_the_confusion_and_its_figures_as_gold_lands(labelled):
    _, exact, _, _ = labelled
    found = record(exact, "success", "success")
    figures = found.figures
    assert (found.type, found.items, figures["n"]) == ("binary", N, N)
    assert figures["confusion"] == {"tp": TP, "fp": FP, "fn": FN, "tn": TN}
    assert figures["accuracy"]["value"] == pytest.approx((TP + TN) / N, abs=1e-9)
    assert figures["precision"]["value"] == pytest.approx(TP / (TP + FP), abs=1e-9)
    assert figures["recall"]["value"] == pytest.approx(TP / (TP + FN), abs=1e-9)
    assert figures["specificity"]["value"] == pytest.approx(TN / (TN + FP), abs=1e-9)
    assert figures["f1"]["value"] == pytest.approx(2 * TP / (2 * TP + FP + FN), abs=1e-9)
    assert figures["kappa"]["value"] == pytest.approx(kappa(TP, FP, FN, TN), abs=1e-9)
    low, high = figures["kappa"]["ci"]
    assert low < figures["kappa"]["value"] < high


def test_it_pairs_only_the_fields_an_evaluator_outputs(labelled):
    _, exact, similar, _ = labelled
    assert set(
        ReliabilityRecord.objects.filter(revision=exact).values_list("output_field", "gold_field")
    ) == {("success", "success")}
    assert set(
        ReliabilityRecord.objects.filter(revision=similar).values_list("output_field", "gold_field")
    ) == {("success", "success"), ("score", "score")}


def test_it_correlates_numeric_scores_as_scipy_does(labelled):
    run, _, similar, _ = labelled
    found = record(similar, "score", "score")
    cells = Result.objects.filter(run=run, step_key=f"evaluator-{similar.slug}").select_related(
        "scenario", "annotation"
    )
    predicted = {cell.scenario.index: cell.annotation.outputs["score"] for cell in cells}
    x = [predicted[i] for i in range(N)]
    y = [float(row[3]) for row in ROWS]
    assert (found.type, found.items) == ("numeric", N)
    assert found.figures["pearson"]["value"] == pytest.approx(
        stats.pearsonr(x, y).statistic, abs=1e-9
    )
    assert found.figures["spearman"]["value"] == pytest.approx(
        stats.spearmanr(x, y).statistic, abs=1e-9
    )
    mae = sum(abs(a - b) for a, b in zip(x, y, strict=True)) / N
    assert found.figures["mae"]["value"] == pytest.approx(mae, abs=1e-9)
    low, high = found.figures["pearson"]["ci"]
    assert -1 <= low < found.figures["pearson"]["value"] < high <= 1


def test_it_has_no_repeats_to_measure_consistency_on_a_single_pass(labelled):
    _, exact, _, _ = labelled
    consistency = record(exact, "success", "success").figures["consistency"]
    assert consistency["items"] == 0 and consistency["stable"]["value"] is None


def test_it_measures_consistency_across_repeats(project, owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run, exact, _ = build_run(project, repeats=2)
        gold_queue(project, run, owner)
    consistency = record(exact, "success", "success").figures["consistency"]
    assert consistency["items"] == N  # one gold item per scenario, its two repeats compared
    assert consistency["stable"]["value"] == 1.0 and consistency["flip_rate"]["value"] == 0.0
    assert record(exact, "success", "success").items == N  # the repeats are not extra items


def test_it_corrects_the_pass_rate_with_rogan_gladen(labelled):
    run, exact, _, _ = labelled
    entry = next(
        e
        for e in review.corrected_rates(run)[f"evaluator-{exact.slug}"]
        if e["metric"] == "success"
    )
    passed = sum(out == truth for out, truth, *_ in ROWS)
    sensitivity, specificity = TP / (TP + FN), TN / (TN + FP)
    expected = (passed / N + specificity - 1) / (sensitivity + specificity - 1)
    assert (entry["passed"], entry["n"], entry["gold_items"]) == (passed, N, N)
    assert entry["identifiable"] is True and entry["gold_evaluator"] == "thumbs"
    assert entry["value"] == pytest.approx(expected, abs=1e-9)
    assert entry["sensitivity"]["value"] == pytest.approx(sensitivity, abs=1e-9)
    assert entry["specificity"]["value"] == pytest.approx(specificity, abs=1e-9)
    low, high = entry["ci"]
    assert 0 <= low < entry["value"] < high <= 1


def test_it_says_why_a_rate_cannot_be_corrected(project, owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run, exact, _ = build_run(project)
        queue = review.queue_create(
            project=project, name="All good", evaluator=human(project), reviewers_per_item=1
        )
        review.items_add_from_run(queue=queue, run=run)
        while (item := review.item_next(queue=queue, reviewer=owner)) is not None:
            review.review_submit(item=item, reviewer=owner, outputs={"success": True, "score": 5})
    entry = review.corrected_rates(run)[f"evaluator-{exact.slug}"][0]
    assert entry["identifiable"] is False and entry["value"] is None
    assert "both passing and failing" in entry["reason"]


def test_it_refreshes_records_after_a_runs_read_model_refresh(
    labelled, project, django_capture_on_commit_callbacks
):
    run, *_ = labelled
    later = evaluator_create(project=project, kind="exact_match", name="Exact later").head
    with django_capture_on_commit_callbacks(execute=True):
        run_add_evaluators(run=run, revisions=[later])
    ReliabilityRecord.objects.filter(revision=later).delete()

    tasks.run_read_model_refresh(run.pk)

    assert record(later, "success", "success").figures["confusion"] == {
        "tp": TP,
        "fp": FP,
        "fn": FN,
        "tn": TN,
    }


def test_it_writes_nothing_after_a_refresh_when_no_trace_has_gold(project):
    run, _, _ = build_run(project)
    tasks.run_read_model_refresh(run.pk)
    assert not ReliabilityRecord.objects.exists()


def test_the_refresh_is_idempotent(labelled):
    _, exact, _, _ = labelled
    before = record(exact, "success", "success")
    again = review.reliability_refresh(revision=exact)
    assert ReliabilityRecord.objects.filter(revision=exact).count() == 1
    assert again[0].pk == before.pk and again[0].figures == before.figures


def test_it_measures_a_code_evaluator_whose_schema_is_inferred(
    project, owner, django_capture_on_commit_callbacks
):
    code = evaluator_create(project=project, kind="code", name="Py", preset="python_default").head
    assert not code.outputs_schema  # code declares none: its outputs are what it returns
    with django_capture_on_commit_callbacks(execute=True):
        run, _, _ = build_run(project)
        run_add_evaluators(run=run, revisions=[code])
        gold_queue(project, run, owner)
    assert record(code, "success", "success").figures["confusion"] == {
        "tp": TP,
        "fp": FP,
        "fn": FN,
        "tn": TN,
    }
