"""``{{trace_outline}}``: a trace as a compact span tree within a token budget, for judges that
must read a whole agent run; errors are always named, the rest elided with a count."""

from __future__ import annotations

import pytest

from evaluators.judge.context import evaluation_context
from evaluators.judge.outline import DEFAULT_TOKENS, outline_budget, trace_outline
from evaluators.services import evaluation_invoke


def span(name, kind="task", *, status="ok", message=None, ms=10, tokens=None, children=(), **data):
    unit = {"duration": {"total": ms}}
    if tokens:
        unit["tokens"] = {"total": tokens}
    return {
        "name": name,
        "kind": kind,
        "status": status,
        "status_message": message,
        "start_time": f"2026-01-01T00:00:{len(name):02d}Z",
        "attributes": {"ag": {"data": data, "metrics": {"unit": unit}}},
        "children": {f"{name}-{i}": c for i, c in enumerate(children)},
    }


def agent_trace(tool_calls: int = 2, *, failing: int | None = None, payload: str = "x") -> dict:
    tools = [
        span(
            f"lookup_{i:04d}",
            "tool",
            status="error" if i == failing else "ok",
            message="timeout after 90 ms" if i == failing else None,
            ms=95,
            inputs={"order_id": f"{i}", "note": payload},
            outputs={"status": "shipped", "detail": payload},
        )
        for i in range(tool_calls)
    ]
    plan = span(
        "plan",
        "llm",
        ms=812,
        tokens=620,
        inputs={"messages": [{"role": "user", "content": "Where is my order #8812?"}]},
        outputs="I will look the order up, then answer.",
    )
    return {
        "trace_id": "t1",
        "spans": {"root": span("agent", "agent", ms=5230, children=[plan, *tools])},
    }


def test_it_outlines_the_tree_with_kinds_durations_tools_and_errors():
    text = trace_outline(agent_trace(2, failing=1))
    lines = text.splitlines()
    assert lines[0] == "- [agent] agent · 5230 ms"
    assert "  - [llm] plan · 812 ms · 620 tokens" in lines
    assert (
        '    in: {"messages": [{"role": "user", "content": "Where is my order #8812?"}]}' in lines
    )
    assert "    out: I will look the order up, then answer." in lines
    assert "  - [tool] lookup_0001 · 95 ms · ERROR: timeout after 90 ms" in lines
    assert '    in: {"order_id": "1", "note": "x"}' in lines


def test_it_cuts_inputs_and_outputs_shorter_to_fit_the_budget():
    text = trace_outline(agent_trace(5, payload="y" * 5000), budget=400)
    assert len(text) <= 400 * 4
    assert "- [tool] lookup_0004" in text  # every span still there
    assert "…" in text and "y" * 400 not in text


def test_a_huge_trace_keeps_its_errors_and_says_what_was_left_out():
    text = trace_outline(agent_trace(3000, failing=2500), budget=500)
    assert len(text) <= 500 * 4
    assert "lookup_2500 · 95 ms · ERROR: timeout after 90 ms" in text
    assert "more span(s) not shown (outline budget); the drill-in has them all" in text
    assert text.splitlines()[0] == "- [agent] agent · 5230 ms"


def test_no_trace_has_no_outline():
    assert trace_outline(None) is None
    assert trace_outline({"spans": {}}) is None
    assert evaluation_context(inputs={}, outputs="x", trace=None)["trace_outline"] is None


@pytest.mark.parametrize(
    ("config", "budget"),
    [
        ({}, DEFAULT_TOKENS),
        ({"outline_tokens": 500}, 500),
        ({"outline_tokens": 5}, 100),
        ({"outline_tokens": 10**9}, 50_000),
        ({"outline_tokens": "lots"}, DEFAULT_TOKENS),
    ],
)
def test_the_budget_comes_from_the_judges_config(config, budget):
    assert outline_budget(config) == budget


def test_a_script_template_reads_the_outline_in_its_context():
    context = evaluation_context(
        inputs={}, outputs="x", trace=agent_trace(1), config={"outline_tokens": 300}
    )
    assert context["trace_outline"].startswith("- [agent] agent")


@pytest.mark.django_db
def test_a_judge_prompt_with_trace_outline_sends_the_outline_to_the_model(
    project, llm_connection, llm_server
):
    evaluation = evaluation_invoke(
        kind="llm_judge",
        parameters={
            "connection": llm_connection.slug,
            "messages": [
                {
                    "role": "user",
                    "content": "Judge this run.\n{{trace_outline}}\nAnswer: {{outputs}}",
                }
            ],
            "config": {"outline_tokens": 300},
        },
        inputs={"question": "Where is my order?"},
        outputs="It shipped.",
        trace=agent_trace(2, failing=1),
        project=project,
    )
    assert evaluation.status == "success", evaluation.error
    sent = llm_server.calls[0].json()["messages"][-1]["content"]
    assert sent.startswith("Judge this run.\n- [agent] agent · 5230 ms\n")
    assert "lookup_0001 · 95 ms · ERROR: timeout after 90 ms" in sent
    assert "Answer: It shipped." in sent


@pytest.mark.django_db
def test_a_judge_that_does_not_name_it_renders_no_outline(project, llm_connection, llm_server):
    evaluation = evaluation_invoke(
        kind="llm_judge",
        parameters={
            "connection": llm_connection.slug,
            "messages": [{"role": "user", "content": "Answer: {{outputs}}"}],
        },
        inputs={"question": "Q"},
        outputs="A",
        trace=agent_trace(1),
        project=project,
    )
    assert evaluation.status == "success", evaluation.error
    assert "[agent]" not in llm_server.calls[0].json()["messages"][-1]["content"]
