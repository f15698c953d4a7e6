import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate


def metrics(duration, tokens, cost):
    return {
        "duration": {"total": duration},
        "tokens": {"prompt": tokens // 3, "completion": tokens - tokens // 3, "total": tokens},
        "costs": {"prompt": cost / 2, "completion": cost / 2, "total": cost},
    }


def a_trace(duration=1200.0, unit_tokens=100, acc_tokens=900, unit_cost=0.001, acc_cost=0.004):
    root = {
        "span_id": "a1",
        "parent_id": None,
        "name": "rag_pipeline",
        "kind": "workflow",
        "status": "ok",
        "attributes": {
            "ag": {
                "data": {"inputs": {"q": "?"}, "outputs": "!"},
                "metrics": {
                    "unit": metrics(duration, unit_tokens, unit_cost),
                    "acc": metrics(duration * 2, acc_tokens, acc_cost),
                },
            }
        },
        "children": {},
    }
    return {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "spans": {"a1": root}}


def run(trace, **parameters):
    return evaluation_invoke(
        kind="trace_budget", parameters=parameters, inputs={}, outputs="!", trace=trace
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("trace_budget"), parameters)
    return caught.value.fields


def test_it_succeeds_within_every_limit():
    result = run(a_trace(), max_latency_ms=2000, max_tokens=1000, max_cost=0.01)
    assert result.status == "success"
    assert result.outputs == {
        "success": True,
        "latency_ms": 1200.0,
        "latency_ok": True,
        "tokens": 900,
        "tokens_ok": True,
        "cost": 0.004,
        "cost_ok": True,
    }


def test_it_fails_when_one_limit_is_exceeded():
    result = run(a_trace(duration=2500), max_latency_ms=2000, max_tokens=1000)
    assert result.outputs["success"] is False
    assert result.outputs["latency_ok"] is False
    assert result.outputs["tokens_ok"] is True


def test_it_counts_a_value_equal_to_the_limit_as_within():
    assert run(a_trace(), max_tokens=900).outputs["success"] is True


def test_it_reports_only_the_limits_that_are_set():
    assert run(a_trace(), max_tokens=1000).outputs == {
        "success": True,
        "tokens": 900,
        "tokens_ok": True,
    }


def test_it_can_read_the_root_span_alone():
    result = run(a_trace(), max_tokens=500, max_cost=0.002, scope="unit")
    assert result.outputs["tokens"] == 100
    assert result.outputs["cost"] == 0.001
    assert result.outputs["success"] is True


def test_it_reads_latency_from_the_root_span_itself():
    # acc durations add up the children; latency is the root's own wall time.
    assert run(a_trace(duration=800), max_latency_ms=1000).outputs["latency_ms"] == 800


def test_it_computes_the_outputs_schema_from_the_limits():
    kind = get_kind("trace_budget")
    schema = kind.outputs_schema(parameters_validate(kind, {"max_cost": 1}))
    assert schema["required"] == ["success", "cost", "cost_ok"]


def test_it_fails_without_a_trace():
    result = run(None, max_latency_ms=1000)
    assert result.status == "error"
    assert result.error["code"] == "missing_trace"
    assert "none was given" in result.error["message"]


def test_it_fails_for_a_trace_without_spans():
    result = run({"trace_id": "x", "spans": {}}, max_latency_ms=1000)
    assert result.error["code"] == "missing_trace"


def test_it_names_the_missing_metric_path():
    trace = a_trace()
    del trace["spans"]["a1"]["attributes"]["ag"]["metrics"]["acc"]["costs"]
    result = run(trace, max_tokens=1000, max_cost=0.01)
    assert result.status == "error"
    assert result.error["code"] == "missing_trace_metric"
    assert result.error["message"] == (
        "The trace's root span (rag_pipeline) has no attributes.ag.metrics.acc.costs.total."
    )


def test_it_fails_for_a_metric_that_is_not_a_number():
    trace = a_trace()
    trace["spans"]["a1"]["attributes"]["ag"]["metrics"]["unit"]["duration"]["total"] = "1.2s"
    result = run(trace, max_latency_ms=1000)
    assert result.error["code"] == "missing_trace_metric"
    assert "'1.2s', not a number" in result.error["message"]


def test_it_requires_at_least_one_limit():
    assert refused(scope="unit") == {
        "parameters": ["set at least one limit: max_latency_ms, max_tokens or max_cost"]
    }


def test_it_refuses_negative_limits_and_unknown_scopes():
    assert "parameters.max_tokens" in refused(max_tokens=-1)
    assert "parameters.scope" in refused(max_tokens=1, scope="tree")


def test_it_offers_no_defaults_because_a_limit_must_be_chosen():
    assert get_kind("trace_budget").defaults() == {}


def test_it_has_valid_presets():
    kind = get_kind("trace_budget")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
