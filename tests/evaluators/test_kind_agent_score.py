import pytest

from evalsite.errors import InvalidInput
from evaluators.agents import scoring
from evaluators.kinds import get_kind
from evaluators.samples import sample_case
from evaluators.services import evaluation_invoke, evaluator_create, parameters_validate
from tests.evaluators.agent_cases import (
    assistant,
    at,
    call,
    example,
    history,
    result,
    span,
    trace,
)


def score(outputs=None, inputs=None, trace=None, **parameters):
    evaluation = evaluation_invoke(
        kind="agent_score",
        parameters=parameters,
        inputs=inputs or {},
        outputs=outputs,
        trace=trace,
    )
    assert evaluation.status == "success", evaluation.error
    return evaluation.outputs


def score_case(name, **parameters):
    case = example(name)
    return score(case["outputs"], case["inputs"], case["trace"], **parameters)


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("agent_score"), parameters)
    return caught.value.fields


# --- the example runs -----------------------------------------------------------------------------


def test_it_scores_a_good_run():
    outputs = score_case("good_run", include_trajectory=False)
    assert outputs == {
        "score": 0.83,
        "success": True,
        "goal_completion": 0.8,
        "plan_correctness": 0.7,
        "error_free_execution": 1.0,
        "context_efficiency": 1.0,
        "details": {
            "tool_calls": 4,
            "failed_calls": 0,
            "retries": 0,
            "tokens": 791,
            "token_source": "trace_peak",
            "method": "heuristic",
            "fallback_reason": None,
            "reasoning": "Goal 0.8: the completion tool done succeeded at step 4. "
            "Plan 0.7: 4 tool calls with a planning step (plan). "
            "Errors 1.0: 4 of 4 calls succeeded, 0 retries, 0 failed. "
            "Context 1.0: 791 tokens (trace peak).",
        },
    }


def test_it_scores_a_run_with_retries_and_a_failed_call():
    outputs = score_case("retries_and_failure")
    # 4 of 5 succeeded: 0.8 - 2 retries x 0.05 - 1 failure x 0.10
    assert outputs["error_free_execution"] == 0.6
    assert outputs["score"] == 0.77
    assert outputs["details"]["failed_calls"] == 1
    assert outputs["details"]["retries"] == 2
    failed = outputs["details"]["trajectory"][1]
    assert (failed["name"], failed["status"], failed["duration_ms"]) == (
        "get_forecast",
        "failed",
        5000.0,
    )


def test_it_scores_a_run_that_never_finishes():
    outputs = score_case("never_finishes")
    assert outputs["goal_completion"] == 0.3
    assert outputs["plan_correctness"] == 0.5
    assert outputs["error_free_execution"] == 0.6
    assert outputs["score"] == 0.51
    assert outputs["success"] is False
    assert outputs["details"]["token_source"] == "estimate"
    assert (
        "no completion tool succeeded and the run does not end with an answer"
        in (outputs["details"]["reasoning"])
    )


def test_it_puts_the_extracted_trajectory_in_the_details():
    steps = score_case("good_run")["details"]["trajectory"]
    assert [(s["step"], s["name"], s["duration_ms"]) for s in steps] == [
        (1, "plan", 12.5),
        (2, "get_order", 230.5),
        (3, "send_email", 410.0),
        (4, "done", 3.0),
    ]
    assert steps[1]["arguments"] == {"order_id": "4411"}


# --- error-free execution -------------------------------------------------------------------------


FAIL = {"ok": False, "error": "boom"}


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ((), 1.0),
        (("a", "b", "c"), 1.0),
        (("a", ("b", {}, FAIL), "c", "d"), 0.65),  # 3/4 - 0.10
        ((("a", {}, FAIL), ("b", {}, FAIL), ("c", {}, FAIL)), 0.0),  # 0 - 0.30, floored
        (("a", "a"), 0.95),  # 1 retry
        (("a",) * 10, 0.55),  # 9 retries
        (("a",) * 20, 0.05),  # 19 retries
        (("a",) * 21, 0.0),  # 20 retries: 1 - 1.00
        (("a",) * 40, 0.0),  # floored
        ((("a", {}, FAIL), "a", "b"), 0.5167),  # 2/3 - 0.05 - 0.10
    ],
)
def test_it_scores_error_free_execution(steps, expected):
    outputs = score(history(*steps))
    assert outputs["error_free_execution"] == expected


def test_it_takes_the_penalties_as_parameters():
    steps = (("a", {}, FAIL), "a", "b")
    assert score(history(*steps), retry_penalty=0, failure_penalty=0)["error_free_execution"] == (
        0.6667
    )
    assert score(history(*steps), retry_penalty=0.5)["error_free_execution"] == 0.0667


def test_it_counts_no_failure_for_a_call_whose_result_never_came():
    messages = [{"role": "user", "content": "?"}, assistant(call("a", "search"))]
    outputs = score(messages)
    assert outputs["error_free_execution"] == 1.0
    assert outputs["details"]["trajectory"][0]["status"] == "no_result"


# --- context efficiency ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chars", "tokens", "expected"),
    [
        (0, 0, 1.0),
        (128_000, 32_000, 1.0),
        (128_001, 32_001, 0.8),
        (256_000, 64_000, 0.8),
        (256_001, 64_001, 0.6),
        (512_000, 128_000, 0.6),
        (512_004, 128_001, 0.4),
        (1_024_000, 256_000, 0.4),
        (1_024_001, 256_001, 0.2),
    ],
)
def test_it_steps_context_efficiency_down_at_each_cut_off(chars, tokens, expected):
    outputs = score([{"role": "user", "content": "x" * chars}], token_count="estimate")
    assert outputs["details"]["tokens"] == tokens
    assert outputs["context_efficiency"] == expected


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(32_000, 1.0), (32_001, 0.8), (64_000, 0.8), (128_000, 0.6), (256_000, 0.4), (10**6, 0.2)],
)
def test_it_applies_the_steps_to_token_counts(tokens, expected):
    assert scoring.context_efficiency(tokens) == expected


def a_traced_run(peak=3000, total=70_000):
    return trace(
        span("l1", "chat", "llm", start=at(1), tokens=peak),
        span("t", "search", start=at(2), duration=5.0),
        span("l2", "chat", "llm", start=at(3), tokens=1000),
        acc_tokens=total,
    )


def test_it_uses_the_largest_llm_call_of_the_trace_by_default():
    outputs = score(history("search"), trace=a_traced_run(peak=64_000))
    assert (outputs["details"]["tokens"], outputs["details"]["token_source"]) == (
        64_000,
        "trace_peak",
    )
    assert outputs["context_efficiency"] == 0.8


def test_it_can_use_the_whole_traces_tokens():
    outputs = score(history("search"), trace=a_traced_run(), token_count="trace_total")
    assert (outputs["details"]["tokens"], outputs["details"]["token_source"]) == (
        70_000,
        "trace_total",
    )
    assert outputs["context_efficiency"] == 0.6


def test_it_estimates_tokens_when_the_trace_has_none():
    messages = [{"role": "user", "content": "x" * 400}]
    outputs = score(messages, trace=trace(span("t", "search", duration=1.0)))
    assert outputs["details"]["token_source"] == "estimate"
    assert outputs["details"]["tokens"] == 100


def test_it_takes_the_context_steps_as_parameters():
    messages = [{"role": "user", "content": "x" * 4000}]  # 1,000 tokens
    steps = [[500, 1.0], [2000, 0.5]]
    assert score(messages, context_steps=steps)["context_efficiency"] == 0.5
    assert score(messages, context_steps=[[500, 1.0]], context_floor=0.1)["context_efficiency"] == (
        0.1
    )


@pytest.mark.parametrize(
    "steps", [[[64000, 0.8], [32000, 1.0]], [[1000, 1.0], [1000, 0.5]], [[1000, 1.5]]]
)
def test_it_refuses_context_steps_out_of_order_or_range(steps):
    assert "parameters.context_steps" in refused(context_steps=steps)


# --- goal and plan heuristics ---------------------------------------------------------------------


def test_it_counts_a_successful_completion_tool_as_done():
    assert score(history("search", "finish"))["goal_completion"] == 0.8


def test_it_does_not_count_a_failed_completion_tool():
    outputs = score(history("search", ("done", {}, FAIL)))
    assert outputs["goal_completion"] == 0.3


def test_it_counts_a_final_answer_as_done_unless_completion_is_strict():
    messages = history("search", answer="Paris is the capital of France.")
    assert score(messages)["goal_completion"] == 0.8
    assert score(messages, final_message_completes=False)["goal_completion"] == 0.3


def test_it_does_not_count_an_answer_followed_by_more_calls():
    messages = [*history(answer="Let me check."), assistant(call("z", "search")), result("z")]
    assert score(messages)["goal_completion"] == 0.3


def test_it_takes_completion_tools_and_scores_as_parameters():
    messages = history("search", "submit")
    assert score(messages)["goal_completion"] == 0.3
    outputs = score(messages, completion_tools=["submit"], completed_score=1.0)
    assert outputs["goal_completion"] == 1.0


def test_it_takes_the_root_spans_output_as_the_answer_of_a_trace_only_run():
    a_trace = trace(span("t", "search", duration=3.0), inputs={"q": "?"}, outputs="Paris")
    assert score("Paris", {"q": "?"}, a_trace)["goal_completion"] == 0.8
    a_trace["spans"]["root"]["status"] = "error"
    assert score("Paris", {"q": "?"}, a_trace)["goal_completion"] == 0.3


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ((), 0.0),
        (("search", "done"), 0.5),
        (("plan", "search", "done"), 0.7),
        (("search", "create_plan"), 0.7),
        (("search",) * 20, 0.5),
        (("plan",) + ("search",) * 20, 0.3),
    ],
)
def test_it_scores_the_plan_from_its_length_and_a_planning_step(steps, expected):
    assert score(history(*steps, answer="ok"))["plan_correctness"] == expected


def test_it_takes_the_planning_tools_and_plan_length_as_parameters():
    steps = ("think", "search", "search", "done")
    assert score(history(*steps), planning_tools=["think"])["plan_correctness"] == 0.7
    assert score(history(*steps), max_plan_length=3)["plan_correctness"] == 0.3


def test_it_scores_a_run_without_tool_calls():
    outputs = score(history(answer="Paris."))
    assert outputs["goal_completion"] == 0.8
    assert outputs["plan_correctness"] == 0.0
    assert outputs["error_free_execution"] == 1.0
    # 0.4 x 0.8 + 0.3 x 0 + 0.15 x 1 + 0.15 x 1
    assert outputs["score"] == 0.62
    assert "Errors 1.0: no tool calls." in outputs["details"]["reasoning"]


# --- weights and threshold ------------------------------------------------------------------------


def test_it_weights_the_categories():
    steps = ("search", ("fetch", {}, FAIL), "fetch")  # goal 0.3, plan 0.5, errors 0.5167
    default = score(history(*steps))
    assert default["score"] == round(0.4 * 0.3 + 0.3 * 0.5 + 0.15 * 0.5167 + 0.15 * 1.0, 4)
    weights = {"goal_weight": 0.1, "plan_weight": 0.1, "errors_weight": 0.1, "context_weight": 0.7}
    assert score(history(*steps), **weights)["score"] == round(
        0.1 * 0.3 + 0.1 * 0.5 + 0.1 * 0.5167 + 0.7 * 1.0, 4
    )


def test_it_refuses_weights_that_do_not_sum_to_one():
    fields = refused(goal_weight=0.5)
    assert fields == {
        "parameters": [
            "the four weights must sum to 1; goal 0.5 + plan 0.3 + errors 0.15 + context 0.15 = 1.1"
        ]
    }


def test_it_accepts_weights_that_sum_to_one_up_to_float_rounding():
    kind = get_kind("agent_score")
    weights = {"goal_weight": 0.1, "plan_weight": 0.2, "errors_weight": 0.3, "context_weight": 0.4}
    assert parameters_validate(kind, weights).goal_weight == 0.1


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_it_refuses_a_weight_outside_zero_to_one(weight):
    assert "parameters.plan_weight" in refused(plan_weight=weight)


def test_it_succeeds_at_exactly_the_threshold():
    assert score_case("retries_and_failure", threshold=0.77)["success"] is True
    assert score_case("retries_and_failure", threshold=0.7701)["success"] is False


def test_it_leaves_the_trajectory_out_when_asked():
    assert "trajectory" not in score_case("good_run", include_trajectory=False)["details"]


# --- errors ---------------------------------------------------------------------------------------


def test_it_reports_a_malformed_history_as_an_error_not_a_score():
    messages = [{"role": "user", "content": "?"}, assistant(call("a", "go", "{oops"))]
    evaluation = evaluation_invoke(
        kind="agent_score", parameters={}, inputs={}, outputs=messages, trace=None
    )
    assert evaluation.status == "error"
    assert evaluation.error["code"] == "malformed_history"
    assert evaluation.error["message"].startswith(
        "outputs[1].tool_calls[0].function.arguments: not valid JSON"
    )


def test_it_reports_a_missing_history_as_an_error():
    evaluation = evaluation_invoke(
        kind="agent_score", parameters={}, inputs={"q": "?"}, outputs="Paris", trace=None
    )
    assert evaluation.status == "error"
    assert evaluation.error["code"] == "missing_history"
    assert "and there is no trace" in evaluation.error["message"]


# --- online ---------------------------------------------------------------------------------------


def test_it_scores_an_online_run_from_the_root_span_and_the_trace():
    case = example("good_run")
    root = next(iter(case["trace"]["spans"].values()))
    data = root["attributes"]["ag"]["data"]
    outputs = score(data["outputs"], data["inputs"], case["trace"])
    assert outputs["score"] == 0.83
    assert outputs["details"]["trajectory"][2]["duration_ms"] == 410.0


def test_it_scores_an_online_run_whose_messages_live_only_in_the_trace():
    messages = history("plan", "search", "done", answer="Paris.")
    a_trace = trace(
        span("p", "plan", start=at(1), duration=4.0),
        span("s", "search", start=at(2), duration=90.0),
        inputs={"question": "?"},
        outputs={"messages": messages},
    )
    outputs = score("Paris.", {"question": "?"}, a_trace)
    assert outputs["details"]["tool_calls"] == 3
    assert [s["duration_ms"] for s in outputs["details"]["trajectory"]] == [4.0, 90.0, None]


# --- the model judge seam -------------------------------------------------------------------------


@pytest.fixture
def judge_connection(project, llm_server):
    from evaluators.judge.connections import model_connection_create

    return model_connection_create(
        project=project,
        name="Judge",
        slug="judge",
        base_url=llm_server.url,
        model_names=["judge-1"],
    )


def judged(project, **parameters):
    case = example("good_run")
    return evaluation_invoke(
        kind="agent_score",
        parameters={"connection": "judge", **parameters},
        inputs=case["inputs"],
        outputs=case["outputs"],
        trace=case["trace"],
        project=project,
    )


def test_it_scores_goal_and_plan_with_one_structured_call_each(
    project, llm_server, judge_connection
):
    llm_server.queue(
        {"score": 0.9, "reasoning": "The customer was emailed the status."},
        {"score": 0.6, "reasoning": "A plan step was not needed."},
    )
    outputs = judged(project).outputs
    assert (outputs["goal_completion"], outputs["plan_correctness"]) == (0.9, 0.6)
    assert outputs["score"] == 0.84  # 0.4 x 0.9 + 0.3 x 0.6 + 0.15 x 1 + 0.15 x 1
    assert outputs["details"]["method"] == "llm"
    assert outputs["details"]["fallback_reason"] is None
    assert outputs["details"]["reasoning"].startswith(
        "Goal 0.9: The customer was emailed the status. Plan 0.6: A plan step was not needed."
    )
    goal, plan = (call.json() for call in llm_server.calls)
    assert "Where is order #4411?" in goal["messages"][-1]["content"]
    assert "I emailed Ana its status." in goal["messages"][-1]["content"]
    assert "plan → get_order → send_email → done" in plan["messages"][-1]["content"]
    assert goal["response_format"]["type"] == "json_schema"


def test_it_falls_back_to_the_heuristics_when_the_judge_fails(
    project, llm_server, judge_connection
):
    llm_server.answer = "I would rather not say."
    outputs = judged(project).outputs
    assert outputs["details"]["method"] == "heuristic"
    assert outputs["details"]["fallback_reason"].startswith("the judge failed: goal: ")
    assert outputs["score"] == 0.83


def test_it_falls_back_to_the_heuristics_for_an_unknown_connection(project, llm_server):
    outputs = judged(project, connection="nope").outputs
    assert outputs["details"]["method"] == "heuristic"
    assert "nope" in outputs["details"]["fallback_reason"]
    assert llm_server.calls == []


def test_it_treats_a_blank_connection_as_none():
    assert parameters_validate(get_kind("agent_score"), {"connection": "  "}).connection is None


# --- presets and the try-it sample ----------------------------------------------------------------


def test_it_offers_a_default_and_a_strict_completion_preset(project):
    strict = evaluator_create(
        project=project, kind="agent_score", name="Strict agent", preset="strict_completion"
    )
    assert strict.head.parameters["final_message_completes"] is False
    assert strict.head.parameters["threshold"] == 0.8
    default = evaluator_create(
        project=project, kind="agent_score", name="Agent", preset="agent_default"
    )
    assert default.head.parameters["goal_weight"] == 0.4
    messages = history("search", answer="Paris.")
    assert score(messages, **strict.head.parameters)["goal_completion"] == 0.3
    assert score(messages, **default.head.parameters)["goal_completion"] == 0.8


def test_it_prefills_the_try_panel_with_the_good_example_run():
    case = sample_case(get_kind("agent_score"))
    assert case["outputs"] == example("good_run")["outputs"]
    assert score(case["outputs"], case["inputs"], case["trace"])["success"] is True
