"""LLM judges aligned from their mistakes, against the real local chat-completions server: the
few-shot examples reach the model literally, come only from train items the base got wrong,
the cost is capped before anything exists, both revisions are measured on the same held-out
items, and the candidate becomes the head only when someone accepts it; the pages and the API."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from evalsite.errors import InvalidInput
from evaluators.models import Evaluator, EvaluatorRevision
from evaluators.services import evaluation_invoke, evaluator_create
from runs import review
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import (
    AlignmentStatus,
    Application,
    JudgeAlignment,
    QueueItem,
    Run,
    Scenario,
    Testset,
)
from runs.review import alignment as alignment_module
from tests.llm_server import failure
from tests.runs.factories import make_testset

HTMX = {"HTTP_HX_REQUEST": "true"}
ITEMS = 40
SECRET = "{{ secret }} and {% if x %}kept{% endif %}"


def gold(i: int) -> bool:
    return i % 2 == 0


def base_says(i: int) -> bool:
    """The base is wrong on every other pair: a false positive at 1 mod 4, a false negative
    at 2 mod 4."""
    return gold(i) if i % 4 in (0, 3) else not gold(i)


def fake_model(request) -> dict:
    """The judge model: it answers like the base, unless its prompt carries examples (an
    assistant message before the case), when it answers what the reviewers settled."""
    messages = request.json()["messages"]
    case = [m for m in messages if m["role"] == "user"][-1]["content"]
    i = int(re.search(r"case (\d+)", case).group(1))
    aligned = any(m["role"] == "assistant" for m in messages)
    return {"reasoning": "looked", "verdict": gold(i) if aligned else base_says(i)}


JUDGE = {
    "connection": "local",
    "score_type": "binary",
    "messages": [
        {"role": "system", "content": "Grade the answer."},
        {"role": "user", "content": "Question: {{question}}\nAnswer: {{outputs}}"},
    ],
}


@pytest.fixture
def judge(project, llm_connection, llm_server):
    llm_server.answer = fake_model
    return evaluator_create(project=project, kind="llm_judge", name="Correct", parameters=JUDGE)


@pytest.fixture
def human(project):
    fields = [
        {"name": "correct", "type": "boolean"},
        {"name": "why", "type": "string", "required": False},
    ]
    return evaluator_create(
        project=project, kind="human", name="Truth", parameters={"fields": fields}
    )


def settle(project, judge, human, owner, count=ITEMS):
    """A run of the judge over ``count`` rows, every scenario in a queue, each settled by one
    reviewer to ``gold(i)``."""
    rows = [
        {"question": f"case {i}", "outputs": f"answer {i}" + (f" {SECRET}" if i % 4 == 1 else "")}
        for i in range(count)
    ]
    app = application_create(
        project=project, name="Answers", kind="column", config={"outputs_column": "outputs"}
    )
    run = run_create(
        project=project,
        testset_version=make_testset(project, rows, slug="answers"),
        application=app,
        revisions=[judge.head],
    )
    run_execute_inline(run=run)
    queue = review.queue_create(
        project=project, name="Truth", evaluator=human, reviewers_per_item=1
    )
    review.items_add_from_run(queue=queue, run=run)
    for item in QueueItem.objects.filter(queue=queue).select_related("scenario", "queue"):
        review.review_submit(
            item=item, reviewer=owner, outputs={"correct": gold(item.scenario.index)}
        )
    return queue


@pytest.fixture
def queue(project, judge, human, owner):
    return settle(project, judge, human, owner)


def index_of(item_id: int) -> int:
    return QueueItem.objects.select_related("scenario").get(pk=item_id).scenario.index


def counts() -> tuple[int, int, int, int]:
    return (
        EvaluatorRevision.objects.count(),
        Testset.objects.count(),
        Run.objects.count(),
        JudgeAlignment.objects.count(),
    )


# --- few-shot examples in the llm_judge kind ---------------------------------------------------


def test_few_shot_examples_reach_the_model_as_literal_messages(project, llm_connection, llm_server):
    llm_server.answer = {"reasoning": "fine", "verdict": True}
    shots = [
        {
            "inputs": {"question": "{{ secret }}"},
            "outputs": SECRET,
            "expected": False,
            "note": "no",
        },
        {"inputs": {"question": "2+2"}, "outputs": "4", "expected": True},
    ]
    result = evaluation_invoke(
        kind="llm_judge",
        parameters={**JUDGE, "few_shot": shots},
        inputs={"question": "case 7"},
        outputs="answer 7",
        project=project,
    )
    assert result.status == "success", result.error
    messages = llm_server.calls[0].json()["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert '"question": "{{ secret }}"' in messages[1]["content"]
    assert messages[1]["content"].endswith(f"Output:\n{SECRET}")  # verbatim, never rendered
    assert json.loads(messages[2]["content"]) == {"reasoning": "no", "verdict": False}
    assert json.loads(messages[4]["content"]) == {"reasoning": "As reviewed.", "verdict": True}
    assert messages[5]["content"] == "Question: case 7\nAnswer: answer 7"


def test_few_shot_answers_take_the_judges_shape(project, llm_connection, llm_server):
    llm_server.answer = {"label": "good"}
    categories = [{"label": "bad", "score": 0}, {"label": "good", "score": 1}]
    shots = [{"inputs": {}, "outputs": "x", "expected": "bad", "note": "wrong facts"}]
    parameters = {
        **JUDGE,
        "score_type": "categorical",
        "categories": categories,
        "reasoning": False,
        "few_shot": shots,
    }
    result = evaluation_invoke(
        kind="llm_judge", parameters=parameters, inputs={}, outputs="y", project=project
    )
    assert result.status == "success", result.error
    messages = llm_server.calls[0].json()["messages"]
    assert json.loads(messages[2]["content"]) == {"label": "bad"}
    assert messages[1]["content"].endswith("Note: wrong facts")  # no reasoning: the note shows


def test_a_few_shot_answer_the_judge_could_not_give_is_refused(project, llm_connection):
    with pytest.raises(InvalidInput) as refused:
        evaluator_create(
            project=project,
            kind="llm_judge",
            name="Bad",
            parameters={**JUDGE, "few_shot": [{"inputs": {}, "outputs": "x", "expected": "yes"}]},
        )
    assert "few_shot[0].expected" in str(refused.value)


# --- the plan -----------------------------------------------------------------------------------


def test_examples_come_only_from_train_items_the_base_got_wrong(judge, queue):
    plan = review.alignment_plan(base=judge.head, queue=queue, shots=6, seed=3)
    assert len(plan.heldout) == ITEMS // 2 and not set(plan.train) & set(plan.heldout)
    assert len(plan.examples) == 6
    for example in plan.examples:
        i = index_of(example["item"])
        assert example["item"] in plan.train and example["item"] not in plan.heldout
        assert base_says(i) != gold(i) and example["expected"] is gold(i)
        assert example["inputs"]["question"] == f"case {i}"
    # false positives and false negatives in turn
    assert [e["cell"] for e in plan.examples] == ["false negative", "false positive"] * 3 or [
        e["cell"] for e in plan.examples
    ] == ["false positive", "false negative"] * 3


def test_the_split_is_seeded_and_stratified_by_gold_value(judge, queue):
    one = review.alignment_plan(base=judge.head, queue=queue, seed=1)
    again = review.alignment_plan(base=judge.head, queue=queue, seed=1)
    other = review.alignment_plan(base=judge.head, queue=queue, seed=2)
    assert one.heldout == again.heldout and one.heldout != other.heldout
    held_gold = [gold(index_of(pk)) for pk in one.heldout]
    assert held_gold.count(True) == held_gold.count(False) == ITEMS // 4


def test_the_estimate_counts_both_revisions_and_prices_the_tokens(judge, queue):
    plan = review.alignment_plan(base=judge.head, queue=queue, shots=4)
    estimate = plan.estimate
    assert estimate["calls"] == 2 * len(plan.heldout) == ITEMS
    tokens = estimate["tokens"]
    assert 0 < tokens["base_prompt"] < tokens["candidate_prompt"]
    assert estimate["price"] == {"prompt": 1.0, "completion": 2.0}
    assert estimate["cost_usd"] == pytest.approx(
        tokens["total"]
        and (
            len(plan.heldout) * (tokens["base_prompt"] + tokens["candidate_prompt"]) * 1.0
            + 2 * len(plan.heldout) * tokens["completion"] * 2.0
        )
        / 1_000_000
    )


def test_too_few_gold_items_to_hold_out_is_a_400_naming_the_queue(project, judge, human, owner):
    small = settle(project, judge, human, owner, count=12)
    with pytest.raises(InvalidInput) as refused:
        review.alignment_plan(base=judge.head, queue=small)
    assert "queue" in refused.value.fields and "at least 10" in refused.value.fields["queue"][0]


def test_a_base_that_is_not_an_llm_judge_is_refused(project, human, queue):
    with pytest.raises(InvalidInput) as refused:
        review.alignment_plan(base=human.head, queue=queue)
    assert "revision" in refused.value.fields


def test_a_prompt_that_shows_the_whole_inputs_never_reads_the_gold_label(
    project,
    llm_connection,
    llm_server,
    human,
    owner,
    celery_eager,
    django_capture_on_commit_callbacks,
):
    llm_server.answer = fake_model
    messages = [{"role": "user", "content": "Inputs: {{inputs}} case {{question}}"}]
    leaky = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Leaky",
        parameters={**JUDGE, "messages": messages},
    )
    queue = settle(project, leaky, human, owner)
    before = len(llm_server.calls)
    alignment = align(leaky, queue, owner, django_capture_on_commit_callbacks)
    assert alignment.status == AlignmentStatus.DONE, alignment.error
    assert alignment.records["items"] == ITEMS // 2  # measured against the queue's gold
    prompts = [c.json()["messages"][-1]["content"] for c in llm_server.calls[before:]]
    assert len(prompts) == ITEMS  # both revisions, every held-out item
    assert not any("correct" in prompt or "gold" in prompt for prompt in prompts)


def case(position, gold, predicted):
    item = SimpleNamespace(pk=position, position=position)
    return alignment_module.Case(item=item, gold=gold, predicted=predicted, inputs={}, outputs="x")


def test_categorical_examples_cover_each_confusion_in_turn():
    judge = SimpleNamespace(
        score_type="categorical",
        categories=[
            SimpleNamespace(label=x, score=s) for x, s in (("bad", 0), ("ok", 0.5), ("good", 1))
        ],
    )
    wrong = [case(i, "good", "ok") for i in range(5)]
    wrong += [case(10 + i, "bad", "good") for i in range(2)]
    wrong += [case(20, "ok", "bad"), case(21, "great", "bad")]  # "great" is no label of the judge
    chosen = alignment_module._choose(wrong, "categorical", 4, 0, judge)
    cells = [(c.gold, c.predicted) for c in chosen]
    assert cells[:3] == [("good", "ok"), ("bad", "good"), ("ok", "bad")]
    assert cells[3] == ("good", "ok") and ("great", "bad") not in cells


def test_numeric_examples_are_the_largest_errors():
    judge = SimpleNamespace(score_type="numeric", score_min=0, score_max=5, integer_scores=True)
    wrong = [case(1, 4, 3), case(2, 1, 5), case(3, 5, 2), case(4, 2, 2.5)]
    chosen = alignment_module._choose(wrong, "numeric", 2, 0, judge)
    assert [c.item.pk for c in chosen] == [2, 3]


# --- caps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caps", "field"),
    [({"max_cost_usd": 0.000001}, "max_cost_usd"), ({"max_calls": 5}, "max_calls")],
)
def test_a_cap_below_the_estimate_refuses_and_creates_nothing(
    judge, queue, owner, llm_server, caps, field
):
    before, calls = counts(), len(llm_server.calls)
    with pytest.raises(InvalidInput) as refused:
        review.alignment_create(base=judge.head, queue=queue, author=owner, **caps)
    assert refused.value.status == 400 and list(refused.value.fields) == [field]
    assert counts() == before and len(llm_server.calls) == calls
    assert Evaluator.objects.get(pk=judge.pk).head_id == judge.head_id


def test_the_sites_cap_on_calls_holds_whatever_the_caller_asks(judge, queue, owner, settings):
    settings.EVALSITE_ALIGNMENT_MAX_CALLS = 10
    before = counts()
    with pytest.raises(InvalidInput) as refused:
        review.alignment_create(base=judge.head, queue=queue, author=owner, max_calls=1000)
    assert "EVALSITE_ALIGNMENT_MAX_CALLS" in refused.value.fields["max_calls"][0]
    assert counts() == before


def test_a_cost_cap_without_a_price_is_refused(judge, queue, owner, llm_connection):
    llm_connection.prices = {}
    llm_connection.save(update_fields=["prices"])
    plan = review.alignment_plan(base=judge.head, queue=queue)
    assert plan.estimate["cost_usd"] is None and "unknown" in plan.estimate["notes"][-1]
    before = counts()
    with pytest.raises(InvalidInput) as refused:
        review.alignment_create(base=judge.head, queue=queue, author=owner, max_cost_usd=100)
    assert "price" in refused.value.fields["max_cost_usd"][0]
    assert counts() == before


# --- a whole alignment ------------------------------------------------------------------------


def align(judge, queue, owner, capture, **options):
    with capture(execute=True):
        alignment = review.alignment_create(
            base=judge.head, queue=queue, author=owner, max_cost_usd=1.0, **options
        )
    alignment.refresh_from_db()
    return alignment


@pytest.fixture
def aligned(judge, queue, owner, celery_eager, django_capture_on_commit_callbacks):
    return align(judge, queue, owner, django_capture_on_commit_callbacks)


def test_a_full_alignment_measures_both_revisions_on_the_same_held_out_items(
    judge, aligned, llm_server
):
    assert aligned.status == AlignmentStatus.DONE, aligned.error
    candidate = aligned.candidate
    assert candidate.evaluator_id == judge.pk and candidate.version == 2
    assert candidate.message == "Aligned from 4 corrections in queue truth"
    assert Evaluator.objects.get(pk=judge.pk).head_id == judge.head_id  # not adopted yet
    assert [shot["expected"] for shot in candidate.parameters["few_shot"]] == [
        e["expected"] for e in aligned.examples
    ]
    run = aligned.run
    assert run.scenario_count == len(aligned.heldout) == ITEMS // 2
    held = {f"case {index_of(pk)}" for pk in aligned.heldout}
    assert {s.inputs["question"] for s in Scenario.objects.filter(run=run)} == held
    assert {k for s in Scenario.objects.filter(run=run) for k in s.inputs} == {
        "question",
        "outputs",
    }  # the gold label stays with the queue item: no judge reads it
    records = aligned.records
    assert records["items"] == records["heldout"] == ITEMS // 2
    assert records["base"]["n"] == records["candidate"]["n"] == ITEMS // 2
    assert records["candidate"]["accuracy"]["value"] == 1.0
    assert records["base"]["accuracy"]["value"] < 1.0
    assert records["difference"]["accuracy"]["value"] > 0
    assert records["difference"]["accuracy"]["ci"][0] > 0  # paired, over the same items
    # The candidate's calls carry the examples, verbatim, and never a held-out case.
    with_examples = [c.json()["messages"] for c in llm_server.calls]
    with_examples = [m for m in with_examples if any(x["role"] == "assistant" for x in m)]
    assert len(with_examples) == ITEMS // 2
    shown = [m["content"] for m in with_examples[0] if m["role"] == "user"][:-1]
    assert len(shown) == 4 and any(text.endswith(SECRET) for text in shown)
    assert not any(f'"question": "{case}"' in text for text in shown for case in held)


def test_the_refresh_settles_an_alignment_once_and_only_when_its_run_ended(aligned):
    records = aligned.records
    assert review.alignments_refresh_for_run(run_id=aligned.run_id) == 0  # already done
    aligned.refresh_from_db()
    assert aligned.records == records


def test_accepting_makes_the_candidate_the_head(judge, aligned, owner):
    review.alignment_accept(alignment=aligned, author=owner)
    aligned.refresh_from_db()
    assert aligned.status == AlignmentStatus.ACCEPTED and aligned.decided_at is not None
    assert Evaluator.objects.get(pk=judge.pk).head_id == aligned.candidate_id
    with pytest.raises(InvalidInput) as refused:
        review.alignment_discard(alignment=aligned, author=owner)
    assert refused.value.status == 409


def test_discarding_leaves_the_head(judge, aligned, owner):
    review.alignment_discard(alignment=aligned, author=owner)
    aligned.refresh_from_db()
    assert aligned.status == AlignmentStatus.DISCARDED
    assert Evaluator.objects.get(pk=judge.pk).head_id == judge.head_id
    with pytest.raises(InvalidInput) as refused:
        review.alignment_accept(alignment=aligned, author=owner)
    assert refused.value.status == 409


def test_a_failed_run_fails_the_alignment_with_its_reason(
    judge, queue, owner, llm_server, celery_eager, django_capture_on_commit_callbacks
):
    llm_server.answer = failure(401, "bad key")
    alignment = align(judge, queue, owner, django_capture_on_commit_callbacks)
    assert alignment.status == AlignmentStatus.FAILED
    assert alignment.error["message"].startswith("No held-out item got a verdict")
    assert "401" in alignment.error["message"] or "key" in alignment.error["message"]
    assert alignment.records == {}


def test_it_reuses_the_projects_outputs_column_application(
    project, judge, queue, owner, celery_eager, django_capture_on_commit_callbacks
):
    before = Application.objects.count()
    first = align(judge, queue, owner, django_capture_on_commit_callbacks)
    second = align(judge, queue, owner, django_capture_on_commit_callbacks, seed=5)
    assert first.run.application == second.run.application
    assert first.run.application.slug == "answers"  # the test's own, on an outputs column
    assert Application.objects.count() == before


def test_it_makes_an_outputs_column_application_when_there_is_none(
    project, judge, queue, owner, celery_eager, django_capture_on_commit_callbacks
):
    Application.objects.filter(project=project).update(config={"outputs_column": "answer"})
    alignment = align(judge, queue, owner, django_capture_on_commit_callbacks)
    assert alignment.run.application.config == {"outputs_column": "outputs"}
    assert alignment.run.application.slug == "outputs-column"


# --- pages --------------------------------------------------------------------------------------


def form(judge, queue, **extra):
    return {
        "revision": judge.head_id,
        "queue": queue.pk,
        "shots": 4,
        "heldout_fraction": 0.5,
        "seed": 0,
        **extra,
    }


def test_the_form_preselects_the_revision(editor_client, judge, queue):
    page = editor_client.get(f"/p/acme/alignments/new?revision={judge.head_id}").content.decode()
    assert "<html" in page and 'id="alignment-form"' in page
    assert f'<option value="{judge.head_id}" selected>' in page and "Truth" in page


def test_the_estimate_shows_the_plan_and_creates_nothing(editor_client, judge, queue):
    before = counts()
    response = editor_client.post("/p/acme/alignments/new", form(judge, queue, action="estimate"))
    page = response.content.decode()
    assert response.status_code == 200 and "<html" in page
    assert "Nothing has been created yet" in page and "Model calls" in page
    assert f"<dd>{ITEMS} <span" in page  # calls
    assert page.count("false positive") + page.count("false negative") == 4
    assert counts() == before


def test_the_estimate_swaps_the_form_for_htmx(editor_client, judge, queue):
    before = counts()
    response = editor_client.post(
        "/p/acme/alignments/new", form(judge, queue, action="estimate"), **HTMX
    )
    fragment = response.content.decode()
    assert response.status_code == 200 and "<html" not in fragment
    assert fragment.strip().startswith('<form method="post"') and 'id="alignment-form"' in fragment
    assert "Nothing has been created yet" in fragment
    refused = editor_client.post(
        "/p/acme/alignments/new", form(judge, queue, action="estimate", shots=30), **HTMX
    ).content.decode()
    assert "<html" not in refused and "Ensure this value is less than or equal to 20" in refused
    assert counts() == before


def test_the_page_creates_an_alignment_and_shows_a_refusal_inline(editor_client, judge, queue):
    before = counts()
    refused = editor_client.post(
        "/p/acme/alignments/new", form(judge, queue, action="create", max_cost_usd="0.000001")
    )
    assert refused.status_code == 400 and "over the cap" in refused.content.decode()
    assert counts() == before
    response = editor_client.post(
        "/p/acme/alignments/new", form(judge, queue, action="create", max_cost_usd="1")
    )
    alignment = JudgeAlignment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/p/acme/alignments/{alignment.pk}/"
    assert alignment.created_by.username == "bob" and alignment.max_cost_usd == 1.0


def test_a_viewer_cannot_align_a_judge(viewer_client, viewer_api, judge, queue):
    before = counts()
    assert viewer_client.get("/p/acme/alignments/new").status_code == 403
    page = viewer_client.post("/p/acme/alignments/new", form(judge, queue, action="create"))
    assert page.status_code == 403
    body = {"revision": judge.head_id, "queue": queue.slug}
    assert viewer_api.post("/api/v1/alignments", body, format="json").status_code == 403
    assert counts() == before


def test_the_alignment_page_shows_both_records_side_by_side(viewer_client, aligned):
    page = viewer_client.get(f"/p/acme/alignments/{aligned.pk}/").content.decode()
    assert "<html" in page and 'id="alignment-results"' in page
    assert "Rests on 20 held-out items" in page
    assert aligned.base.slug in page and aligned.candidate.slug in page
    assert "Accuracy" in page and "1.000" in page and "cell-up" in page
    assert "Accept the candidate" not in page  # viewers do not decide
    assert 'hx-trigger="every 2s"' not in page  # done: nothing polls
    fragment = viewer_client.get(
        f"/p/acme/alignments/{aligned.pk}/?region=alignment-results", **HTMX
    ).content.decode()
    assert fragment.strip().startswith('<div id="alignment-results"')
    assert "<html" not in fragment and "Rests on 20 held-out items" in fragment


def test_a_running_alignment_polls_its_progress(editor_client, judge, queue, owner):
    alignment = review.alignment_create(base=judge.head, queue=queue, author=owner)
    page = editor_client.get(f"/p/acme/alignments/{alignment.pk}/").content.decode()
    assert 'hx-trigger="every 2s"' in page and 'role="progressbar"' in page
    assert "Discard and cancel the run" in page and "Accept the candidate" not in page
    fragment = editor_client.get(
        f"/p/acme/alignments/{alignment.pk}/?region=alignment-results", **HTMX
    ).content.decode()
    assert fragment.strip().startswith('<div id="alignment-results"') and "<html" not in fragment


def test_an_editor_accepts_from_the_page(editor_client, judge, aligned):
    page = editor_client.get(f"/p/acme/alignments/{aligned.pk}/").content.decode()
    assert "Accept the candidate" in page
    response = editor_client.post(f"/p/acme/alignments/{aligned.pk}/accept")
    assert response.status_code == 302
    assert Evaluator.objects.get(pk=judge.pk).head_id == aligned.candidate_id
    again = editor_client.post(f"/p/acme/alignments/{aligned.pk}/discard")
    assert again.status_code == 409 and "accepted already" in again.content.decode()


def test_an_editor_discards_from_the_page(editor_client, judge, aligned):
    response = editor_client.post(f"/p/acme/alignments/{aligned.pk}/discard")
    assert response.status_code == 302
    aligned.refresh_from_db()
    assert aligned.status == AlignmentStatus.DISCARDED
    assert Evaluator.objects.get(pk=judge.pk).head_id == judge.head_id


def test_a_viewer_cannot_accept(viewer_client, judge, aligned):
    assert viewer_client.post(f"/p/acme/alignments/{aligned.pk}/accept").status_code == 403
    aligned.refresh_from_db()
    assert aligned.status == AlignmentStatus.DONE
    assert Evaluator.objects.get(pk=judge.pk).head_id == judge.head_id


def test_an_outsider_sees_no_alignment(outsider_client, outsider_api, aligned):
    assert outsider_client.get(f"/p/acme/alignments/{aligned.pk}/").status_code == 404
    assert outsider_api.get(f"/api/v1/alignments/{aligned.pk}").status_code == 404
    assert outsider_api.post(f"/api/v1/alignments/{aligned.pk}/accept").status_code == 404


# --- API ----------------------------------------------------------------------------------------


def test_the_api_dry_run_answers_the_plan_and_creates_nothing(api, judge, queue):
    before = counts()
    body = {"revision": judge.head.slug, "queue": queue.slug, "shots": 2, "dry_run": True}
    response = api.post("/api/v1/alignments", body, format="json")
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["base"] == judge.head.reference and plan["queue"]["slug"] == "truth"
    assert (plan["gold_field"], plan["output_field"], plan["type"]) == (
        "correct",
        "success",
        "binary",
    )
    assert len(plan["examples"]) == 2 and plan["estimate"]["calls"] == ITEMS
    assert not {e["item"] for e in plan["examples"]} & set(plan["heldout"])
    assert counts() == before


def test_the_api_refuses_an_estimate_over_the_cap_naming_the_field(api, judge, queue):
    before = counts()
    body = {"revision": judge.head_id, "queue": queue.pk, "max_cost_usd": 0.000001}
    response = api.post("/api/v1/alignments", body, format="json")
    assert response.status_code == 400
    assert "max_cost_usd" in response.json()["error"]["fields"]
    assert counts() == before


def test_the_api_creates_reads_and_accepts_an_alignment(
    api, judge, queue, celery_eager, django_capture_on_commit_callbacks
):
    body = {"revision": judge.head_id, "queue": queue.slug, "max_calls": 100}
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/alignments", body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["base"] == judge.head.reference and created["candidate"]["version"] == 2
    assert created["evaluator"] == {"id": judge.pk, "slug": "correct"}
    done = api.get(f"/api/v1/alignments/{created['id']}").json()
    assert done["status"] == "done" and done["records"]["items"] == ITEMS // 2
    assert done["records"]["candidate"]["accuracy"]["value"] == 1.0
    listed = api.get("/api/v1/alignments?status=done").json()["results"]
    assert [a["id"] for a in listed] == [created["id"]]
    accepted = api.post(f"/api/v1/alignments/{created['id']}/accept").json()
    assert accepted["status"] == "accepted"
    assert Evaluator.objects.get(pk=judge.pk).head_id == created["candidate"]["id"]
    conflict = api.post(f"/api/v1/alignments/{created['id']}/discard")
    assert conflict.status_code == 409


def test_the_api_names_an_unknown_queue(api, judge, queue):
    body = {"revision": judge.head_id, "queue": "nope", "dry_run": True}
    response = api.post("/api/v1/alignments", body, format="json")
    assert response.status_code == 400 and "queue" in response.json()["error"]["fields"]


def test_the_judges_page_offers_editors_to_align_it_from_its_record(
    client, editor, viewer, judge, queue
):
    review.reliability_refresh(revision=judge.head)
    page = f"/p/acme/evaluators/{judge.slug}/"
    link = f"/p/acme/alignments/new?revision={judge.head.pk}"
    client.force_login(editor)
    assert link in client.get(page).content.decode()
    client.force_login(viewer)
    shown = client.get(page).content.decode()
    assert "How far to trust this evaluator" in shown and link not in shown
