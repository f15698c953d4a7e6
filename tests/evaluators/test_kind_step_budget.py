import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, evaluator_create, parameters_validate
from tests.evaluators.agent_cases import at, example, history, span, trace

FAIL = {"ok": False, "error": "boom"}


def budget(messages, a_trace=None, **parameters):
    evaluation = evaluation_invoke(
        kind="step_budget", parameters=parameters, inputs={}, outputs=messages, trace=a_trace
    )
    assert evaluation.status == "success", evaluation.error
    return evaluation.outputs


def timed(*durations):
    """A history of calls named t1, t2, ... and a trace timing each."""
    names = [f"t{n}" for n in range(1, len(durations) + 1)]
    spans = [
        span(f"s{n}", name, start=at(n), duration=duration)
        for n, (name, duration) in enumerate(zip(names, durations, strict=True), 1)
        if duration is not None
    ]
    return history(*names), trace(*spans)


def test_it_succeeds_within_every_limit():
    messages, a_trace = timed(100.0, 200.0)
    limits = {"max_calls": 2, "max_tool_ms": 300, "max_retries": 0, "max_failed_calls": 0}
    outputs = budget(messages, a_trace, **limits)
    assert outputs == {
        "success": True,
        "reason": "",
        "calls": 2,
        "calls_ok": True,
        "calls_step": None,
        "tool_ms": 300.0,
        "tool_ms_ok": True,
        "tool_ms_step": None,
        "retries": 0,
        "retries_ok": True,
        "retries_step": None,
        "failed_calls": 0,
        "failed_calls_ok": True,
        "failed_calls_step": None,
        "untimed_calls": 0,
    }


def test_it_names_the_call_over_the_call_limit():
    outputs = budget(history(*[f"t{n}" for n in range(1, 13)]), max_calls=10)
    assert (outputs["success"], outputs["calls"], outputs["calls_step"]) == (False, 12, 11)
    assert outputs["reason"] == "step 11: call 11 (t11) is over the limit of 10"


def test_it_allows_exactly_the_call_limit():
    assert budget(history(*["a", "b"] * 5), max_calls=10)["success"] is True


def test_it_allows_no_calls_at_a_limit_of_zero():
    assert budget(history(answer="Paris."), max_calls=0)["success"] is True
    assert budget(history("search"), max_calls=0)["calls_step"] == 1


def test_it_names_the_call_that_takes_tool_time_past_the_limit():
    messages, a_trace = timed(1000.0, 2500.0, 900.0, 10.0)
    outputs = budget(messages, a_trace, max_tool_ms=3000)
    assert (outputs["tool_ms"], outputs["tool_ms_ok"], outputs["tool_ms_step"]) == (
        4410.0,
        False,
        2,
    )
    assert (
        outputs["reason"] == "step 2: t2 brings tool time to 3,500 ms, over the limit of 3,000 ms"
    )


def test_it_allows_exactly_the_tool_time_limit():
    messages, a_trace = timed(1000.0, 2000.0)
    assert budget(messages, a_trace, max_tool_ms=3000)["tool_ms_ok"] is True


def test_it_counts_calls_no_span_timed_without_making_up_a_duration():
    messages, a_trace = timed(1000.0, None, 500.0)
    outputs = budget(messages, a_trace, max_tool_ms=2000)
    assert (outputs["tool_ms"], outputs["untimed_calls"], outputs["success"]) == (1500.0, 1, True)


def test_it_fails_when_no_call_has_a_duration():
    evaluation = evaluation_invoke(
        kind="step_budget",
        parameters={"max_tool_ms": 1000},
        inputs={},
        outputs=history("search", "fetch"),
        trace=None,
    )
    assert evaluation.status == "error"
    assert evaluation.error["code"] == "missing_trace"
    assert evaluation.error["message"] == (
        "max_tool_ms needs tool durations from the trace, and none of the 2 tool calls has one "
        "(no tool spans matched them)."
    )


def test_it_measures_no_tool_time_for_a_run_without_calls():
    outputs = budget(history(answer="Paris."), max_tool_ms=10)
    assert (outputs["tool_ms"], outputs["success"]) == (0.0, True)


def test_it_names_the_retry_and_the_failed_call_over_their_limits():
    messages = history("a", "a", "b", ("b", {}, FAIL), "b", ("c", {}, FAIL))
    outputs = budget(messages, max_retries=1, max_failed_calls=1)
    assert (outputs["retries"], outputs["retries_step"]) == (3, 4)
    assert (outputs["failed_calls"], outputs["failed_calls_step"]) == (2, 6)
    assert outputs["reason"] == (
        "step 4: retry 2 (b) is over the limit of 1; step 6: failed call 2 (c) is over the limit "
        "of 1"
    )


def test_it_reads_durations_of_a_trace_only_run():
    a_trace = trace(
        span("a", "search", start=at(1), duration=700.0),
        span("b", "fetch", start=at(2), duration=400.0),
    )
    outputs = budget("Paris", a_trace, max_tool_ms=1000, max_calls=5)
    assert (outputs["tool_ms"], outputs["tool_ms_step"], outputs["calls"]) == (1100.0, 2, 2)


def test_it_checks_the_retries_example():
    case = example("retries_and_failure")
    outputs = budget(case["outputs"], case["trace"], max_tool_ms=6000, max_failed_calls=0)
    assert outputs["tool_ms"] == 6230.0
    assert outputs["tool_ms_step"] == 4  # 8 + 5000 + 640 + 580 > 6000
    assert outputs["failed_calls_step"] == 2


def test_it_needs_at_least_one_limit():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("step_budget"), {})
    assert caught.value.fields == {
        "parameters": [
            "set at least one limit: max_calls, max_tool_ms, max_retries or max_failed_calls"
        ]
    }


def test_it_reports_only_the_limits_that_are_set():
    kind = get_kind("step_budget")
    schema = kind.outputs_schema(parameters_validate(kind, {"max_calls": 3}))
    assert schema["required"] == ["success", "reason", "calls", "calls_ok", "calls_step"]
    assert budget(history("a"), max_calls=3) == {
        "success": True,
        "reason": "",
        "calls": 1,
        "calls_ok": True,
        "calls_step": None,
    }


@pytest.mark.parametrize(
    ("preset", "parameters"),
    [
        ("max_10_calls", {"max_calls": 10}),
        ("tool_time_30s", {"max_tool_ms": 30000}),
        ("no_failed_calls", {"max_failed_calls": 0, "max_retries": 2}),
    ],
)
def test_it_offers_budget_presets(project, preset, parameters):
    evaluator = evaluator_create(project=project, kind="step_budget", name=preset, preset=preset)
    assert parameters.items() <= evaluator.head.parameters.items()
