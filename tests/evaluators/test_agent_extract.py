import json

import pytest

from evalsite.errors import InvalidInput
from evaluators.agents.extract import agent_run, trace_tokens, trajectory_summary
from evaluators.kinds import get_kind
from evaluators.normalize import EvaluationError
from evaluators.services import parameters_validate
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


def run_of(outputs=None, inputs=None, trace=None, **options):
    return agent_run(inputs=inputs or {}, outputs=outputs, trace=trace, **options)


def malformed(messages) -> str:
    with pytest.raises(EvaluationError) as caught:
        run_of({"messages": messages}, messages_path="outputs.messages")
    assert caught.value.code == "malformed_history"
    return caught.value.message


# --- messages -------------------------------------------------------------------------------------


def test_it_reads_tool_calls_and_their_results_from_openai_messages():
    messages = history(("search", {"q": "capital of France"}), "done", answer="Paris.")
    run = run_of({"messages": messages})
    assert [c.name for c in run.calls] == ["search", "done"]
    assert run.calls[0].arguments == {"q": "capital of France"}
    assert run.calls[0].call_id == "c1"
    assert run.calls[0].message_index == 1
    assert [c.status for c in run.calls] == ["ok", "ok"]
    assert run.source == "outputs.messages"
    assert run.task == "Find the capital of France."
    assert run.final_answer == "Paris."


def test_it_reads_arguments_given_as_an_object_and_langchain_tool_calls():
    messages = [
        {"role": "user", "content": "?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "function": {"name": "search", "arguments": {"q": "x"}}},
                {"id": "b", "name": "fetch", "args": {"url": "https://example.com"}},
            ],
        },
        result("a"),
        result("b"),
    ]
    run = run_of(messages)
    assert [(c.name, c.arguments) for c in run.calls] == [
        ("search", {"q": "x"}),
        ("fetch", {"url": "https://example.com"}),
    ]


def test_it_reads_empty_arguments_as_no_arguments():
    messages = [assistant(call("a", "now", "")), result("a")]
    assert run_of(messages).calls[0].arguments == {}


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ({"ok": False}, "ok: false"),
        ({"ok": False, "error": "not found"}, "not found"),
        ({"error": "timeout after 5 s"}, "timeout after 5 s"),
        ({"error": {"code": 429}}, '{"code": 429}'),
    ],
)
def test_it_marks_a_result_with_ok_false_or_an_error_as_a_failed_call(content, error):
    run = run_of(history(("search", {}, content)))
    assert run.calls[0].status == "failed"
    assert run.calls[0].error == error
    assert run.failed_calls == 1


@pytest.mark.parametrize(
    "content",
    [{"ok": True}, {"error": None}, {"error": ""}, "Paris is the capital.", "[1, 2]", "{not json"],
)
def test_it_counts_other_results_as_successful(content):
    assert run_of(history(("search", {}, content))).calls[0].status == "ok"


def test_it_marks_a_tool_message_with_status_error_as_failed():
    messages = [assistant(call("a", "search")), {**result("a", "boom"), "status": "error"}]
    assert run_of(messages).calls[0].error == "boom"


def test_it_matches_results_by_tool_call_id_not_by_position():
    messages = [
        assistant(call("a", "search"), call("b", "fetch")),
        result("b", {"ok": False, "error": "404"}),
        result("a", {"ok": True}),
    ]
    search, fetch = run_of(messages).calls
    assert (search.status, fetch.status, fetch.error) == ("ok", "failed", "404")


def test_it_matches_a_reused_call_id_to_the_call_still_waiting_for_it():
    messages = [
        assistant(call("x", "search")),
        result("x", {"ok": False}),
        assistant(call("x", "search")),
        result("x", {"ok": True}),
    ]
    assert [c.status for c in run_of(messages).calls] == ["failed", "ok"]


def test_it_leaves_a_call_whose_result_never_came_without_a_result():
    messages = [assistant(call("a", "search"))]
    assert run_of(messages).calls[0].status == "no_result"
    assert run_of(messages).failed_calls == 0


def test_it_counts_a_call_of_the_same_tool_right_after_itself_as_a_retry():
    run = run_of(history("search", "search", "fetch", "search", "search", "search"))
    assert [c.retry for c in run.calls] == [False, True, False, False, True, True]
    assert run.retries == 3


def test_it_counts_every_link_of_a_long_retry_chain():
    assert run_of(history(*["search"] * 50)).retries == 49


def test_it_counts_characters_of_contents_and_tool_calls():
    messages = [
        {"role": "user", "content": "abcd"},
        assistant(call("a", "go", '{"x": 1}'), content="ab"),
        result("a", "12345678"),
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]
    # 4 + 2 + len("go") + len('{"x": 1}') + 8 + 4
    assert run_of(messages).chars == 4 + 2 + 2 + 8 + 8 + 4


# --- where the history is -------------------------------------------------------------------------


MESSAGES = history("search", answer="Paris.")


@pytest.mark.parametrize(
    ("where", "inputs", "outputs", "found"),
    [
        ("outputs", {}, MESSAGES, "outputs"),
        ("outputs.messages", {}, {"messages": MESSAGES}, "outputs.messages"),
        ("outputs as JSON", {}, json.dumps({"messages": MESSAGES}), "outputs.messages"),
        ("inputs.messages", {"messages": MESSAGES}, "Paris.", "inputs.messages"),
    ],
)
def test_it_finds_the_history_automatically(where, inputs, outputs, found):
    run = run_of(outputs, inputs)
    assert run.source == found
    assert [c.name for c in run.calls] == ["search"]


@pytest.mark.parametrize(
    ("data", "found"),
    [
        ({"outputs": {"messages": MESSAGES}}, "trace.ag.data.outputs.messages"),
        ({"outputs": MESSAGES}, "trace.ag.data.outputs"),
        ({"inputs": {"messages": MESSAGES}, "outputs": "Paris."}, "trace.ag.data.inputs.messages"),
    ],
)
def test_it_finds_the_history_on_the_traces_root_span(data, found):
    a_trace = trace(**data)
    assert run_of("Paris.", {}, a_trace).source == found


def test_it_prefers_the_outputs_to_the_inputs():
    run = run_of({"messages": history("fetch")}, {"messages": history("search")})
    assert [c.name for c in run.calls] == ["fetch"]


def test_it_reads_an_explicit_path():
    outputs = {"result": {"history": MESSAGES}}
    run = run_of(outputs, messages_path="outputs.result.history")
    assert run.source == "outputs.result.history"
    assert [c.name for c in run.calls] == ["search"]


def test_it_reads_an_explicit_trace_path_under_the_root_span_attributes():
    a_trace = trace(outputs={"steps": MESSAGES})
    run = run_of(None, {}, a_trace, messages_path="trace.attributes.ag.data.outputs.steps")
    assert [c.name for c in run.calls] == ["search"]


def test_it_says_when_an_explicit_path_does_not_exist():
    with pytest.raises(EvaluationError) as caught:
        run_of({"messages": MESSAGES}, messages_path="outputs.history")
    assert caught.value.code == "missing_history"
    assert caught.value.message == "No message history at outputs.history: the path does not exist."


def test_it_says_when_an_explicit_path_holds_no_list():
    with pytest.raises(EvaluationError) as caught:
        run_of({"messages": "hello"}, messages_path="outputs.messages")
    assert caught.value.message == "outputs.messages: expected a list of messages, got a string."


def test_it_says_where_it_looked_when_there_is_no_run():
    with pytest.raises(EvaluationError) as caught:
        run_of("Paris.", {"country": "France"}, trace(outputs="Paris."))
    assert caught.value.code == "missing_history"
    message = caught.value.message
    assert "outputs.messages, inputs.messages" in message
    assert "the trace has no tool spans" in message


@pytest.mark.parametrize("path", ["result.messages", "outputs..messages", "", "trace."])
def test_it_refuses_a_messages_path_outside_outputs_inputs_and_trace(path):
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("agent_score"), {"messages_path": path})
    assert (
        "starts with outputs, inputs or trace" in caught.value.fields["parameters.messages_path"][0]
    )


# --- malformed histories --------------------------------------------------------------------------


def test_it_names_the_arguments_that_are_not_json():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "?"},
        assistant(call("a", "search", {"q": 1}), call("b", "fetch")),
        result("a"),
        result("b"),
        assistant(call("c", "search", '{"q": "paris"')),
    ]
    message = malformed(messages)
    assert message.startswith(
        "outputs.messages[5].tool_calls[0].function.arguments: not valid JSON ("
    )


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ("hello", "outputs.messages: expected a list of messages"),
        ([42], "outputs.messages[0]: expected a message object, got a number."),
        ([{"content": "hi"}], "outputs.messages[0].role: missing."),
        ([{"role": 1}], "outputs.messages[0].role: expected a string."),
        (
            [{"role": "assistant", "tool_calls": {"id": "a"}}],
            "outputs.messages[0].tool_calls: expected a list, got an object.",
        ),
        ([assistant("search")], "outputs.messages[0].tool_calls[0]: expected a tool call object"),
        (
            [assistant({"id": "a", "function": {"arguments": "{}"}})],
            "outputs.messages[0].tool_calls[0].function.name: missing.",
        ),
        (
            [assistant({"id": "a", "function": {"name": " ", "arguments": "{}"}})],
            "outputs.messages[0].tool_calls[0].function.name: expected a non-empty string.",
        ),
        (
            [assistant({"id": 7, "function": {"name": "go"}})],
            "outputs.messages[0].tool_calls[0].id: expected a string, got a number.",
        ),
        (
            [assistant({"id": "a", "function": {"name": "go", "arguments": 3}})],
            "outputs.messages[0].tool_calls[0].function.arguments: expected a JSON string or an "
            "object, got a number.",
        ),
        (
            [assistant(call("a", "go")), {"role": "tool", "content": "{}"}],
            "outputs.messages[1].tool_call_id: missing: a tool message names the call it answers.",
        ),
        (
            [assistant(call("a", "go")), result("zzz")],
            "outputs.messages[1].tool_call_id: 'zzz' matches no earlier unanswered call.",
        ),
        (
            [assistant(call("a", "go")), result("a"), result("a")],
            "outputs.messages[2].tool_call_id: 'a' matches no earlier unanswered call.",
        ),
    ],
)
def test_it_says_what_is_malformed_and_where(messages, expected):
    assert malformed(messages).startswith(expected)


# --- the trace ------------------------------------------------------------------------------------


def test_it_takes_durations_and_failures_from_tool_spans_matched_by_call_id():
    messages = history("search", "search", answer="Paris.")
    a_trace = trace(
        span("s2", "search", start=at(2), duration=40.0, call_id="c2"),
        span(
            "s1",
            "search",
            start=at(1),
            duration=5000.0,
            status="error",
            message="timeout",
            call_id="c1",
        ),
    )
    first, second = run_of({"messages": messages}, {}, a_trace).calls
    assert (first.duration_ms, first.status, first.error, first.span_id) == (
        5000.0,
        "failed",
        "timeout",
        "s1",
    )
    assert (second.duration_ms, second.status, second.span_id) == (40.0, "ok", "s2")


def test_it_matches_spans_without_call_ids_by_tool_name_in_order():
    messages = history("plan", "search", "search", "done")
    a_trace = trace(
        span("p", "plan", start=at(1), duration=10.0),
        span("llm", "chat", "llm", start=at(2), duration=900.0, tokens=500),
        span("s1", "search", start=at(3), duration=100.0),
        span("s2", "search", start=at(4), duration=200.0),
    )
    run = run_of(messages, {}, a_trace)
    assert [c.duration_ms for c in run.calls] == [10.0, 100.0, 200.0, None]


def test_it_gives_no_duration_to_a_call_no_span_timed():
    run = run_of(history("search", "fetch"), {}, trace(span("s", "search")))
    assert [c.duration_ms for c in run.calls] == [None, None]
    assert [c.span_id for c in run.calls] == ["s", None]


def test_it_reads_a_run_from_tool_spans_alone():
    a_trace = trace(
        span(
            "b",
            "fetch",
            start=at(3),
            duration=80.5,
            inputs={"url": "u"},
            outputs={"ok": False, "error": "404"},
        ),
        span(
            "step",
            "step",
            "task",
            start=at(1),
            children=(span("a", "search", start=at(2), duration=120.0, inputs={"q": "paris"}),),
        ),
        span("c", "done", start=at(5), duration=1.0, status="error"),
        inputs={"question": "Capital of France?"},
        outputs="Paris",
    )
    run = run_of("Paris", {"question": "Capital of France?"}, a_trace)
    assert run.source == "trace"
    assert run.messages is None
    assert [(c.name, c.arguments, c.duration_ms) for c in run.calls] == [
        ("search", {"q": "paris"}, 120.0),
        ("fetch", {"url": "u"}, 80.5),
        ("done", None, 1.0),
    ]
    assert [c.status for c in run.calls] == ["ok", "failed", "failed"]
    assert [c.error for c in run.calls] == [None, "404", "status: error"]
    assert run.task == '{"question": "Capital of France?"}'
    assert run.final_answer == "Paris"


def test_it_uses_the_opentelemetry_tool_name_when_a_span_has_one():
    tool = span("a", "execute_tool", duration=3.0)
    tool["attributes"]["gen_ai.tool.name"] = "get_weather"
    assert [c.name for c in run_of(None, {}, trace(tool)).calls] == ["get_weather"]


def test_it_ignores_the_trace_when_use_trace_is_off():
    a_trace = trace(span("s", "search", duration=9.0, status="error"))
    run = run_of(history("search"), {}, a_trace, use_trace=False)
    assert (run.calls[0].duration_ms, run.calls[0].status) == (None, "ok")
    assert (run.tokens_peak, run.tokens_total) == (None, None)


def test_it_reads_the_peak_and_total_tokens_of_the_trace():
    a_trace = trace(
        span("l1", "chat", "llm", start=at(1), tokens=1200),
        span("l2", "chat", "llm", start=at(2), tokens=3400),
        span("t", "search", start=at(3), duration=1.0),
        acc_tokens=4600,
    )
    assert trace_tokens(a_trace) == (3400, 4600)
    del a_trace["spans"]["root"]["attributes"]["ag"]["metrics"]["acc"]
    assert trace_tokens(a_trace) == (3400, 4600)
    assert trace_tokens(trace(span("t", "search"))) == (None, None)
    assert trace_tokens(None) == (None, None)


# --- drill-in summary -----------------------------------------------------------------------------


def test_it_summarises_the_steps_of_a_history_and_its_trace_for_the_drill_in():
    case = example("retries_and_failure")
    steps = trajectory_summary(case["outputs"]["messages"], case["trace"])
    assert [(s["step"], s["name"], s["status"], s["retry"]) for s in steps] == [
        (1, "plan", "ok", False),
        (2, "get_forecast", "failed", False),
        (3, "get_forecast", "ok", True),
        (4, "get_forecast", "ok", True),
        (5, "final_answer", "ok", False),
    ]
    assert [s["duration_ms"] for s in steps] == [8.0, 5000.0, 640.0, 580.0, 2.0]
    assert steps[1]["error"] == "upstream timeout after 5000 ms"
    assert steps[1]["arguments"] == {"city": "Paris", "day": "tomorrow"}
    assert set(steps[0]) == {
        "step",
        "name",
        "arguments",
        "status",
        "error",
        "duration_ms",
        "retry",
        "call_id",
        "message_index",
        "span_id",
    }


def test_it_summarises_a_trace_alone_or_an_outputs_dict():
    case = example("good_run")
    from_trace = trajectory_summary(case["trace"])
    from_outputs = trajectory_summary(case["outputs"])
    assert [s["name"] for s in from_trace] == ["plan", "get_order", "send_email", "done"]
    assert [s["duration_ms"] for s in from_trace] == [12.5, 230.5, 410.0, 3.0]
    assert [s["name"] for s in from_outputs] == [s["name"] for s in from_trace]
    assert [s["duration_ms"] for s in from_outputs] == [None] * 4
    assert trajectory_summary() == []


def test_it_summarises_a_run_that_never_finishes_without_durations():
    steps = trajectory_summary(example("never_finishes")["outputs"])
    assert [s["name"] for s in steps] == [
        "search_restaurants",
        "get_availability",
        "get_availability",
        "get_availability",
        "search_restaurants",
    ]
    assert [s["status"] for s in steps] == ["ok", "ok", "ok", "failed", "ok"]
    assert all(s["duration_ms"] is None for s in steps)
