import json

import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, evaluator_create, parameters_validate
from tests.evaluators.agent_cases import assistant, at, call, example, history, result, span, trace

SEARCH = ("search", {"q": "paris", "lang": "fr"})
FETCH = ("fetch", {"url": "https://en.wikipedia.org/wiki/Paris"})
ANSWER = ("answer", {"text": "Paris"})
RUN = history(SEARCH, FETCH, ANSWER)


def ref(name, **arguments):
    return {"name": name, "arguments": arguments}


def evaluate(messages, column, **parameters):
    return evaluation_invoke(
        kind="trajectory_match",
        parameters=parameters,
        inputs={"question": "Capital of France?", "expected_trajectory": column},
        outputs={"messages": messages},
        trace=None,
    )


def match(messages, column, **parameters):
    evaluation = evaluate(messages, column, **parameters)
    assert evaluation.status == "success", evaluation.error
    return evaluation.outputs


def verdict(outputs):
    return outputs["success"], outputs["failed_step"], outputs["reference_step"]


EXACT_REFERENCE = [
    ref("search", q="paris", lang="fr"),
    ref("fetch", url=FETCH[1]["url"]),
    ref("answer", text="Paris"),
]


# --- modes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reference", "expected"),
    [
        ("strict", ["search", "fetch", "answer"], (True, None, None)),
        ("strict", ["search", "answer", "fetch"], (False, 2, 2)),
        ("strict", ["search", "fetch"], (False, 3, None)),
        ("strict", ["search", "fetch", "answer", "log"], (False, None, 4)),
        ("unordered", ["answer", "search", "fetch"], (True, None, None)),
        ("unordered", ["answer", "search"], (False, 2, None)),
        ("unordered", ["answer", "search", "fetch", "fetch"], (False, None, 4)),
        ("subset", ["log", "answer", "fetch", "search"], (True, None, None)),
        ("subset", ["search", "answer"], (False, 2, None)),
        ("superset", ["answer", "search"], (True, None, None)),
        ("superset", ["search", "log"], (False, None, 2)),
        ("in_order", ["search", "answer"], (True, None, None)),
        ("in_order", ["answer", "search"], (False, None, 2)),
        ("in_order", ["search", "fetch", "answer"], (True, None, None)),
        ("in_order", ["fetch", "fetch"], (False, None, 2)),
    ],
)
def test_it_matches_in_each_mode(mode, reference, expected):
    assert verdict(match(RUN, reference, mode=mode, arguments="ignore")) == expected


def test_it_says_which_step_failed_and_why():
    outputs = match(RUN, ["search", "answer", "fetch"], arguments="ignore")
    assert outputs == {
        "success": False,
        "failed_step": 2,
        "reference_step": 2,
        "reason": "step 2: fetch instead of answer",
        "calls": 3,
        "expected": 3,
    }


@pytest.mark.parametrize(
    ("mode", "reference", "reason"),
    [
        (
            "strict",
            ["search", "fetch"],
            "step 3: answer is an extra call; the reference has 2 steps",
        ),
        (
            "strict",
            ["search", "fetch", "answer", "log"],
            "reference step 4: log was never called; the agent made 3 calls",
        ),
        ("unordered", ["answer", "search"], "step 2: fetch matches no reference step"),
        ("superset", ["search", "log"], "reference step 2: log was never called"),
        (
            "in_order",
            ["answer", "search"],
            "reference step 2: search was never called after reference step 1 (answer)",
        ),
        ("strict", ["search", "fetch", "answer"], "the 3 tool calls match the reference, in order"),
        (
            "unordered",
            ["answer", "search", "fetch"],
            "the 3 tool calls match the reference's 3 steps",
        ),
        ("subset", ["search", "fetch", "answer", "x"], "all 3 tool calls are in the reference"),
        ("superset", ["search"], "all 1 reference steps were called"),
        ("in_order", ["search", "answer"], "all 2 reference steps were called, in order"),
    ],
)
def test_it_explains_each_verdict(mode, reference, reason):
    assert match(RUN, reference, mode=mode, arguments="ignore")["reason"] == reason


def test_it_matches_an_empty_run_with_an_empty_reference():
    outputs = match([{"role": "user", "content": "hi"}], [])
    assert verdict(outputs) == (True, None, None)


# --- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "reference", "expected"),
    [
        ("exact", EXACT_REFERENCE, (True, None, None)),
        ("exact", [ref("search", q="paris"), "fetch", "answer"], (False, 1, 1)),
        ("exact", [ref("search", q="Paris", lang="fr"), "fetch", "answer"], (False, 1, 1)),
        ("subset", [ref("search", q="paris"), "fetch", "answer"], (True, None, None)),
        ("subset", [ref("search", q="lyon"), "fetch", "answer"], (False, 1, 1)),
        ("subset", [ref("search", page=2), "fetch", "answer"], (False, 1, 1)),
        ("ignore", [ref("search", q="lyon"), ref("fetch", url="x"), "answer"], (True, None, None)),
    ],
)
def test_it_compares_arguments_exactly_as_a_subset_or_not_at_all(arguments, reference, expected):
    assert verdict(match(RUN, reference, arguments=arguments)) == expected


@pytest.mark.parametrize(
    ("arguments", "reference", "reason"),
    [
        (
            "exact",
            [ref("search", q="paris"), "fetch", "answer"],
            "step 1: search argument lang is not in the reference",
        ),
        (
            "exact",
            [ref("search", q="Paris", lang="fr"), "fetch", "answer"],
            'step 1: search argument q is "paris", expected "Paris"',
        ),
        (
            "subset",
            [ref("search", page=2), "fetch", "answer"],
            "step 1: search argument page is missing (expected 2)",
        ),
    ],
)
def test_it_names_the_argument_that_differs(arguments, reference, reason):
    assert match(RUN, reference, arguments=arguments)["reason"] == reason


def test_it_matches_any_arguments_for_a_reference_step_without_them():
    assert match(RUN, ["search", "fetch", "answer"], arguments="exact")["success"] is True


def test_it_compares_nested_arguments_as_a_subset():
    messages = history(("book", {"party": {"adults": 2, "children": 1}, "time": "20:00"}))
    assert match(messages, [ref("book", party={"adults": 2})], arguments="subset")["success"]
    outputs = match(messages, [ref("book", party={"adults": 3})], arguments="subset")
    assert outputs["reason"] == "step 1: book argument party.adults is 2, expected 3"


def test_it_compares_numbers_as_json_does():
    messages = history(("scale", {"factor": 1, "exact": True}))
    assert match(messages, [ref("scale", factor=1.0, exact=True)])["success"] is True
    assert match(messages, [ref("scale", factor=1, exact=1)])["success"] is False


def test_it_takes_argument_modes_per_tool():
    reference = [
        ref("search", q="paris"),
        ref("fetch", url="elsewhere"),
        ref("answer", text="Paris"),
    ]
    outputs = match(RUN, reference, tool_arguments={"search": "subset", "fetch": "ignore"})
    assert outputs["success"] is True
    outputs = match(RUN, reference, tool_arguments={"search": "subset"})
    assert outputs["reason"].startswith("step 2: fetch argument url is")


def test_it_pairs_calls_with_steps_so_that_as_many_as_possible_match():
    # Taking the first search for the first (argument-free) step would leave nothing for the
    # second; the match must find the pairing that works.
    messages = history(("search", {"q": "paris"}), ("search", {"q": "lyon"}))
    reference = ["search", ref("search", q="paris")]
    for mode in ("unordered", "superset", "subset"):
        assert match(messages, reference, mode=mode, arguments="subset")["success"] is True


def test_it_says_what_differed_when_a_reference_step_was_never_met():
    outputs = match(RUN, [ref("search", q="lyon")], mode="superset", arguments="subset")
    assert outputs["reason"] == (
        'reference step 1: search({"q": "lyon"}) was never called '
        '(search argument q is "paris", expected "lyon")'
    )


# --- the reference --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference",
    [
        ["search", "fetch", "answer"],
        json.dumps(["search", "fetch", "answer"]),
        [{"tool": "search"}, {"name": "fetch"}, {"name": "answer", "args": {"text": "Paris"}}],
        [
            {"function": {"name": "search", "arguments": '{"q": "paris", "lang": "fr"}'}},
            {"function": {"name": "fetch", "arguments": ""}},
            {"type": "function", "function": {"name": "answer"}},
        ],
        {"tool_calls": ["search", "fetch", "answer"]},
        {"messages": history("search", "fetch", "answer")},
        history("search", "fetch", "answer"),
    ],
)
def test_it_reads_the_reference_in_the_usual_shapes(reference):
    outputs = match(RUN, reference, arguments="subset")
    assert outputs["success"] is True
    assert outputs["expected"] == 3


COLUMN = "The reference trajectory in column 'expected_trajectory'"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("search, answer", f"{COLUMN} is text that is not JSON."),
        (42, f"{COLUMN} is a number, not a list of tool calls."),
        (["search", 3], f"{COLUMN}, step 2 is neither a tool name nor an object with a name."),
        ([{"arguments": {}}], f"{COLUMN}, step 1 has no tool name (name, tool or function.name)."),
        (
            [{"name": "a", "arguments": "{x"}],
            f"{COLUMN}, step 1 has arguments that are not valid JSON.",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"id": "a"}]}],
            f"{COLUMN} is a malformed message history: messages[0].tool_calls[0].name: missing.",
        ),
    ],
)
def test_it_says_what_is_wrong_with_the_reference(reference, message):
    evaluation = evaluate(RUN, reference)
    assert evaluation.status == "error"
    assert evaluation.error["code"] == "invalid_reference"
    assert evaluation.error["message"] == message


def test_it_reads_the_reference_from_the_column_it_is_told():
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={"correct_answer_key": "tools", "arguments": "ignore"},
        inputs={"tools": ["search", "fetch", "answer"]},
        outputs=RUN,
        trace=None,
    )
    assert evaluation.outputs["success"] is True


def test_it_refuses_a_reference_setting_it_cannot_read():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("trajectory_match"), {"reference": ["search", 42]})
    assert caught.value.fields["parameters.reference"] == [
        "The reference trajectory in the reference setting, step 2 is neither a tool name nor an "
        "object with a name"
    ]


@pytest.mark.parametrize("field", ["mode", "arguments"])
def test_it_refuses_unknown_modes(field):
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("trajectory_match"), {field: "fuzzy"})
    assert f"parameters.{field}" in caught.value.fields


# --- online ---------------------------------------------------------------------------------------


def test_it_says_the_reference_column_is_missing_in_an_online_run():
    case = example("good_run")
    root = next(iter(case["trace"]["spans"].values()))
    data = root["attributes"]["ag"]["data"]
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={},
        inputs=data["inputs"],
        outputs=data["outputs"],
        trace=case["trace"],
    )
    assert evaluation.status == "error"
    assert evaluation.error["code"] == "missing_ground_truth"
    assert evaluation.error["message"] == (
        "The reference trajectory column 'expected_trajectory' is not in the inputs (columns: "
        "question). Set correct_answer_key to the testcase column that holds it, or give the "
        "trajectory in the reference setting (online runs have no testcase)."
    )


def test_it_checks_an_online_run_against_the_reference_setting():
    case = example("good_run")
    root = next(iter(case["trace"]["spans"].values()))
    data = root["attributes"]["ag"]["data"]
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={"mode": "in_order", "arguments": "ignore", "reference": ["get_order", "done"]},
        inputs=data["inputs"],
        outputs=data["outputs"],
        trace=case["trace"],
    )
    assert evaluation.outputs["success"] is True


def test_it_checks_a_run_read_from_tool_spans_alone():
    a_trace = trace(
        span("a", "search", start=at(1), duration=10.0, inputs={"q": "paris"}),
        span("b", "answer", start=at(2), duration=1.0, inputs={"text": "Paris"}),
    )
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={"reference": [ref("search", q="paris"), "answer"]},
        inputs={"question": "?"},
        outputs="Paris",
        trace=a_trace,
    )
    assert evaluation.outputs["success"] is True


# --- examples and presets -------------------------------------------------------------------------


def test_it_matches_the_good_example_against_its_reference_with_subset_arguments():
    case = example("good_run")
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={"arguments": "subset"},
        inputs=case["inputs"],
        outputs=case["outputs"],
        trace=case["trace"],
    )
    assert verdict(evaluation.outputs) == (True, None, None)
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={"arguments": "exact"},
        inputs=case["inputs"],
        outputs=case["outputs"],
        trace=case["trace"],
    )
    assert (
        evaluation.outputs["reason"]
        == "step 3: send_email argument subject is not in the reference"
    )


def test_it_fails_the_retries_example_at_the_extra_call():
    case = example("retries_and_failure")
    evaluation = evaluation_invoke(
        kind="trajectory_match",
        parameters={},
        inputs=case["inputs"],
        outputs=case["outputs"],
        trace=case["trace"],
    )
    assert evaluation.outputs["reason"] == "step 4: get_forecast instead of final_answer"


def test_it_offers_a_search_before_answer_preset(project):
    evaluator = evaluator_create(
        project=project, kind="trajectory_match", name="Search first", preset="search_before_answer"
    )
    parameters = evaluator.head.parameters
    good = history("plan", "search", "search", "answer")
    bad = [assistant(call("a", "answer")), result("a"), assistant(call("b", "search")), result("b")]
    assert match(good, None, **parameters)["success"] is True
    assert match(bad, None, **parameters)["reason"] == (
        "reference step 2: answer was never called after reference step 1 (search)"
    )
