import pytest

from evaluators.services import evaluation_invoke, evaluator_create
from tests.evaluators.agent_cases import at, example, history, span, trace


def f1(messages, expected, **parameters):
    evaluation = evaluation_invoke(
        kind="tool_call_f1",
        parameters=parameters,
        inputs={"expected_trajectory": expected},
        outputs=messages,
        trace=None,
    )
    assert evaluation.status == "success", evaluation.error
    return evaluation.outputs


def test_it_scores_a_perfect_match():
    outputs = f1(history("search", "fetch", "answer"), ["answer", "search", "fetch"])
    assert outputs == {
        "score": 1.0,
        "success": True,
        "precision": 1.0,
        "recall": 1.0,
        "matched": 3,
        "calls": 3,
        "expected": 3,
        "missing": [],
        "unexpected": [],
    }


def test_it_computes_precision_recall_and_f1():
    # 4 calls, 3 reference steps, 2 pairs: precision 2/4, recall 2/3, F1 = 2PR / (P + R)
    outputs = f1(history("search", "search", "fetch", "log"), ["search", "fetch", "answer"])
    assert (outputs["precision"], outputs["recall"], outputs["score"]) == (0.5, 0.6667, 0.5714)
    assert outputs["missing"] == ["answer"]
    assert outputs["unexpected"] == ["search", "log"]
    assert outputs["success"] is True


def test_it_pairs_each_call_and_each_reference_step_once():
    outputs = f1(history("search"), ["search", "search"])
    assert (outputs["precision"], outputs["recall"], outputs["matched"]) == (1.0, 0.5, 1)


def test_it_compares_names_only_unless_told_otherwise():
    messages = history(("search", {"q": "paris"}), ("search", {"q": "lyon"}))
    expected = [
        {"name": "search", "arguments": {"q": "paris"}},
        {"name": "search", "arguments": {"q": "rome"}},
    ]
    assert f1(messages, expected)["score"] == 1.0
    outputs = f1(messages, expected, arguments="subset")
    assert (outputs["precision"], outputs["recall"], outputs["score"]) == (0.5, 0.5, 0.5)
    assert f1(messages, expected, tool_arguments={"search": "exact"})["matched"] == 1


@pytest.mark.parametrize(
    ("steps", "expected", "scores"),
    [
        ((), [], (1.0, 1.0, 1.0)),
        ((), ["search"], (1.0, 0.0, 0.0)),
        (("search",), [], (0.0, 1.0, 0.0)),
        (("fetch",), ["search"], (0.0, 0.0, 0.0)),
    ],
)
def test_it_handles_empty_sides(steps, expected, scores):
    outputs = f1(history(*steps), expected)
    assert (outputs["precision"], outputs["recall"], outputs["score"]) == scores


def test_it_succeeds_from_the_threshold():
    messages = history("search", "fetch")
    assert f1(messages, ["search", "answer"], threshold=0.5)["success"] is True  # F1 0.5
    assert f1(messages, ["search", "answer"], threshold=0.51)["success"] is False


def test_it_scores_the_never_finishing_example():
    case = example("never_finishes")
    evaluation = evaluation_invoke(
        kind="tool_call_f1", parameters={}, inputs=case["inputs"], outputs=case["outputs"]
    )
    # 5 calls, 4 reference steps, 2 pairs (search_restaurants, get_availability)
    assert evaluation.outputs["precision"] == 0.4
    assert evaluation.outputs["recall"] == 0.5
    assert evaluation.outputs["missing"] == ["book_table", "done"]


def test_it_needs_the_reference_column_online_unless_the_reference_is_set():
    a_trace = trace(
        span("a", "search", start=at(1), duration=3.0),
        span("b", "answer", start=at(2), duration=1.0),
        inputs={"question": "?"},
    )
    evaluation = evaluation_invoke(
        kind="tool_call_f1", parameters={}, inputs={"question": "?"}, outputs="x", trace=a_trace
    )
    assert evaluation.status == "error"
    assert evaluation.error["code"] == "missing_ground_truth"
    evaluation = evaluation_invoke(
        kind="tool_call_f1",
        parameters={"reference": ["search", "answer"]},
        inputs={"question": "?"},
        outputs="x",
        trace=a_trace,
    )
    assert evaluation.outputs["score"] == 1.0


def test_it_offers_a_names_and_arguments_preset(project):
    evaluator = evaluator_create(
        project=project, kind="tool_call_f1", name="F1", preset="tool_names_and_arguments"
    )
    assert evaluator.head.parameters["arguments"] == "subset"
    assert evaluator.head.parameters["threshold"] == 0.8
