"""The whole loop on real PostgreSQL: a judged run, a blind queue of three reviewers over its 30
scenarios, planted disagreements settled by an adjudicator, gold labels, the judge's reliability
record checked against hand-computed figures, the corrected pass rate, and an aligned judge
measured on held-out gold items."""

from __future__ import annotations

import re

import krippendorff
import numpy as np
import pytest

from evalsite.models import Role
from evalsite.services import membership_set, user_get_or_create
from evaluators.models import Evaluator, ReliabilityRecord
from evaluators.services import evaluator_create
from runs import review
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import AlignmentStatus, Annotation, ItemStatus, Origin, QueueItem, SettledBy
from tests.runs.factories import make_testset

N = 30
TRUTH = {i: i % 3 != 0 for i in range(N)}  # 20 good answers, 10 bad
JUDGE_WRONG = {0, 3, 1, 2, 4, 5}  # the judge passes bad answers 0, 3 and fails good 1, 2, 4, 5
DISSENT = {6, 7, 8, 9, 10, 11}  # the third reviewer answers the opposite on these


@pytest.fixture(autouse=True)
def _eager(celery_eager):
    pass


def _judge_answer(request):
    """The model: right about every answer except JUDGE_WRONG's (from the prompt's "answer i"),
    unless the prompt carries corrected examples (assistant turns): then it is always right."""
    messages = request.json()["messages"]
    i = int(re.search(r"answer (\d+)", messages[-1]["content"]).group(1))
    taught = any(message["role"] == "assistant" for message in messages)
    verdict = TRUTH[i] if taught or i not in JUDGE_WRONG else not TRUTH[i]
    return {"reasoning": "checked", "verdict": verdict}


@pytest.fixture
def judged_run(project, llm_server, llm_connection):
    llm_server.answer = _judge_answer
    rows = [{"question": f"question {i}", "outputs": f"answer {i}"} for i in range(N)]
    version = make_testset(project, rows, slug="loop")
    app = application_create(
        project=project, name="Bot", kind="column", config={"outputs_column": "outputs"}
    )
    judge = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Judge",
        parameters={
            "connection": llm_connection.slug,
            "model": "judge-1",
            "score_type": "binary",
            "messages": [
                {"role": "user", "content": "Question: {{question}}\nAnswer: {{outputs}}"}
            ],
        },
    ).head
    run = run_execute_inline(
        run=run_create(project=project, testset_version=version, application=app, revisions=[judge])
    )
    assert run.status == "success"
    return run, judge


@pytest.fixture
def people(project, owner):
    reviewers = []
    for name in ("rita", "remy", "rosa"):
        user = user_get_or_create(username=name, password=f"pw-{name}-123")
        membership_set(project=project, user=user, role=Role.VIEWER)  # viewers may review
        reviewers.append(user)
    return reviewers, owner


def _answer(reviewer_index: int, scenario_index: int) -> dict:
    truth = TRUTH[scenario_index]
    dissent = reviewer_index == 2 and scenario_index in DISSENT
    return {"correct": (not truth) if dissent else truth, "comment": ""}


@pytest.mark.django_db(transaction=True)  # commits happen: the refresh tasks run on them
def test_it_turns_reviews_into_gold_and_measures_the_judge_against_it(project, judged_run, people):
    run, judge = judged_run
    reviewers, adjudicator = people
    human = evaluator_create(
        project=project,
        kind="human",
        name="Correct",
        parameters={
            "fields": [
                {"name": "correct", "type": "boolean"},
                {"name": "comment", "type": "string", "required": False},
            ]
        },
    )
    queue = review.queue_create(
        project=project,
        name="Correctness review",
        evaluator=human,
        reviewers_per_item=3,
        blind=True,
        reviewers=[user.username for user in reviewers],
        adjudicators=[adjudicator.username],
    )
    assert review.items_add_from_run(queue=queue, run=run, selection={"select": "all"}) == N

    # Each reviewer takes items one by one until none is left; blind until they submit.
    index_of = dict(QueueItem.objects.filter(queue=queue).values_list("pk", "scenario__index"))
    for r, reviewer in enumerate(reviewers):
        while (item := review.item_next(queue=queue, reviewer=reviewer)) is not None:
            others = item.reviews.filter(status="submitted").exists()
            assert review.sees_others(item, reviewer) is False
            review.review_submit(
                item=item, reviewer=reviewer, outputs=_answer(r, index_of[item.pk])
            )
            assert review.sees_others(item, reviewer) is True
            assert others or r == 0 or item.reviews.count() >= 1

    items = QueueItem.objects.filter(queue=queue)
    assert items.filter(status=ItemStatus.GOLD).count() == N - len(DISSENT)
    waiting = items.filter(status=ItemStatus.ADJUDICATION)
    assert {index_of[pk] for pk in waiting.values_list("pk", flat=True)} == DISSENT
    for item in waiting:
        truth = TRUTH[index_of[item.pk]]
        review.item_adjudicate(item=item, adjudicator=adjudicator, outputs={"correct": truth})
    assert items.filter(status=ItemStatus.GOLD).count() == N
    assert items.filter(settled_by=SettledBy.ADJUDICATOR).count() == len(DISSENT)

    gold = Annotation.objects.filter(evaluator=human, origin=Origin.GOLD)
    assert gold.count() == N
    assert all(len(a.details["reviews"]) == 3 for a in gold)
    by_trace = {a.trace_id: a.outputs["correct"] for a in gold}
    by_index = {index_of[i.pk]: by_trace[i.trace_id] for i in items}
    assert by_index == TRUTH

    # Agreement: hand-computed percent agreement, alpha as the reference library computes it.
    queue.refresh_from_db()  # the refresh task ran after the last review's commit
    report = queue.agreement["fields"]["correct"]
    assert report["items"] == N
    assert report["percent_agreement"]["value"] == pytest.approx(
        (N - len(DISSENT) + len(DISSENT) / 3) / N, abs=1e-9
    )
    matrix = np.array([[float(_answer(r, i)["correct"]) for i in range(N)] for r in range(3)])
    expected_alpha = krippendorff.alpha(reliability_data=matrix, level_of_measurement="nominal")
    assert report["krippendorff_alpha"]["value"] == pytest.approx(expected_alpha, abs=1e-9)
    lo, hi = report["krippendorff_alpha"]["ci"]
    assert lo <= report["krippendorff_alpha"]["value"] <= hi

    # The judge's record, by hand: it passed bad answers 0 and 3, failed good 1, 2, 4 and 5.
    record = ReliabilityRecord.objects.get(revision=judge, gold_evaluator=human)
    tp = sum(1 for i in range(N) if TRUTH[i] and i not in JUDGE_WRONG)
    fn = sum(1 for i in range(N) if TRUTH[i] and i in JUDGE_WRONG)
    tn = sum(1 for i in range(N) if not TRUTH[i] and i not in JUDGE_WRONG)
    fp = sum(1 for i in range(N) if not TRUTH[i] and i in JUDGE_WRONG)
    assert (tp, fn, tn, fp) == (16, 4, 8, 2)
    figures = record.figures
    assert (record.output_field, record.gold_field, record.items) == ("success", "correct", N)
    assert figures["confusion"] == {"tp": tp, "fp": fp, "fn": fn, "tn": tn}
    assert figures["accuracy"]["value"] == pytest.approx((tp + tn) / N, abs=1e-9)
    assert figures["precision"]["value"] == pytest.approx(tp / (tp + fp), abs=1e-9)
    assert figures["recall"]["value"] == pytest.approx(tp / (tp + fn), abs=1e-9)
    assert figures["specificity"]["value"] == pytest.approx(tn / (tn + fp), abs=1e-9)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert figures["f1"]["value"] == pytest.approx(
        2 * precision * recall / (precision + recall), abs=1e-9
    )
    observed = (tp + tn) / N
    chance = ((tp + fp) * (tp + fn) + (tn + fn) * (tn + fp)) / N**2
    assert figures["kappa"]["value"] == pytest.approx((observed - chance) / (1 - chance), abs=1e-9)

    # The corrected pass rate (Rogan-Gladen) on the run's own pass rate.
    [corrected] = review.corrected_rates(run)[f"evaluator-{judge.slug}"]
    se, sp, p = tp / (tp + fn), tn / (tn + fp), (tp + fp) / N
    assert (corrected["passed"], corrected["n"], corrected["gold_items"]) == (tp + fp, N, N)
    assert corrected["value"] == pytest.approx((p + sp - 1) / (se + sp - 1), abs=1e-9)
    assert corrected["ci"][0] <= corrected["value"] <= corrected["ci"][1]

    # Align the judge from its mistakes: examples from train items only, both revisions
    # measured on the same held-out gold items, the candidate adopted only when accepted.
    plan = review.alignment_plan(base=judge, queue=queue, shots=2, seed=1)
    assert plan.estimate["calls"] == 2 * len(plan.heldout)
    assert not set(plan.heldout) & {example["item"] for example in plan.examples}
    alignment = review.alignment_create(
        base=judge, queue=queue, shots=2, seed=1, max_cost_usd=1.0, author=adjudicator
    )
    alignment.refresh_from_db()
    assert alignment.status == AlignmentStatus.DONE, alignment.error
    records = alignment.records
    assert records["items"] == len(alignment.heldout) == N // 2
    held = [index_of[pk] for pk in alignment.heldout]
    wrong_held = sum(1 for i in held if i in JUDGE_WRONG)
    assert records["base"]["accuracy"]["value"] == pytest.approx(1 - wrong_held / len(held))
    assert records["candidate"]["accuracy"]["value"] == 1.0
    assert Evaluator.objects.get(pk=judge.evaluator_id).head_id == judge.pk
    review.alignment_accept(alignment=alignment, author=adjudicator)
    assert Evaluator.objects.get(pk=judge.evaluator_id).head_id == alignment.candidate_id
