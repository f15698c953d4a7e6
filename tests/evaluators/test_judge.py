"""The llm_judge kind against a real chat-completions server on 127.0.0.1: prompts, score shapes,
malformed answers and repair, 429 storms, timeouts, refused keys, spend caps, traces."""

import json
import time

import pytest

from evaluators.judge.batch import structured_call
from evaluators.judge.limits import Limiter
from evaluators.kinds import get_kind
from evaluators.models import EvaluatorRevision, ModelConnection
from evaluators.normalize import EvaluationError
from evaluators.services import evaluation_invoke, evaluations_invoke_many, evaluator_create
from runs.models import Trace
from tests.llm_server import MODEL_API_KEY, completion, failure
from tests.servers import Reply

INPUTS = {"country": "France", "correct_answer": "Paris"}


def judge(project, outputs="Paris", inputs=None, trace=None, **parameters):
    return evaluation_invoke(
        kind="llm_judge",
        parameters={"connection": "local", **parameters},
        inputs=INPUTS if inputs is None else inputs,
        outputs=outputs,
        trace=trace,
        project=project,
    )


def judge_many(project, count, **parameters):
    items = [({"country": f"C{i}", "correct_answer": f"A{i}"}, f"A{i}", None) for i in range(count)]
    return evaluations_invoke_many(
        kind="llm_judge",
        parameters={"connection": "local", **parameters},
        items=items,
        project=project,
    )


def evaluate_many(project, items, context=None, **parameters):
    """The kind's batch hook with an engine-style context (run_id, rule_id ...)."""
    kind = get_kind("llm_judge")
    parsed = kind.parse({"connection": "local", **parameters})
    return kind.evaluate_many(parsed, items, {"project": project, **(context or {})})


# --- the request --------------------------------------------------------------------------------


def test_it_sends_the_rendered_prompt_and_the_answer_schema(project, llm_connection, llm_server):
    llm_server.answer = {"reasoning": "same city", "score": 1}
    result = judge(project)
    assert result.status == "success", result.error
    [call] = llm_server.calls
    body = call.json()
    assert call.headers["authorization"] == f"Bearer {MODEL_API_KEY}"
    assert body["model"] == "judge-1"
    assert body["temperature"] == 0
    schema = body["response_format"]["json_schema"]
    assert body["response_format"]["type"] == "json_schema"
    assert schema["strict"] is True
    assert schema["schema"]["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert schema["schema"]["required"] == ["reasoning", "score"]
    system, user = body["messages"]
    assert system["role"] == "system" and "JSON Schema of the answer" in system["content"]
    assert (
        user["content"] == "Input:\nFrance\n\nReference answer:\nParis\n\nCandidate answer:\nParis"
    )
    assert result.details["rendered_prompt"] == body["messages"]


def test_it_uses_the_named_model_and_options(project, llm_connection, llm_server):
    judge(project, model="judge-2", temperature=0.3, max_tokens=50, structured_output=False)
    body = llm_server.calls[0].json()
    assert body["model"] == "judge-2"
    assert body["temperature"] == 0.3
    assert body["max_tokens"] == 50
    assert "response_format" not in body


def test_it_judges_without_a_reference_column(project, llm_connection, llm_server):
    messages = [{"role": "user", "content": "Is {{outputs}} polite? Asked: {{question}}"}]
    result = judge(project, inputs={"question": "Hi?"}, outputs="Hello!", messages=messages)
    assert result.status == "success", result.error
    assert llm_server.calls[0].json()["messages"][-1]["content"] == "Is Hello! polite? Asked: Hi?"


def test_it_lists_every_unresolved_variable_and_calls_nothing(project, llm_connection, llm_server):
    messages = [
        {"role": "system", "content": "Truth: {{reference}}"},
        {"role": "user", "content": "{{inputs.city}} {{country}} {{$.inputs.zip}} {{/inputs/x}}"},
    ]
    result = judge(project, inputs={"country": "France"}, messages=messages)
    assert result.status == "error"
    assert result.error["code"] == "unresolved_variables"
    message = result.error["message"]
    for name in ("reference", "inputs.city", "$.inputs.zip", "/inputs/x"):
        assert name in message
    assert "country," in message  # the available names are listed
    assert "correct_answer_key" in message
    assert llm_server.calls == []


# --- score shapes -------------------------------------------------------------------------------

CATEGORIES = [
    {"label": "wrong", "score": 0},
    {"label": "partly", "score": 0.5},
    {"label": "right", "score": 1},
]
CRITERIA = [
    {"name": "accuracy", "description": "facts", "weight": 3},
    {"name": "clarity", "weight": 1},
]


@pytest.mark.parametrize(
    ("parameters", "answer", "outputs"),
    [
        (
            {"score_type": "binary"},
            {"reasoning": "ok", "verdict": False},
            {"success": False, "reasoning": "ok"},
        ),
        (
            {"score_type": "numeric", "score_min": 1, "score_max": 10, "threshold": 7},
            {"reasoning": "good", "score": 8},
            {"score": 8, "success": True, "reasoning": "good"},
        ),
        (
            {"score_type": "numeric", "reasoning": False},
            {"score": 0.25},
            {"score": 0.25, "success": False},
        ),
        (
            {"score_type": "categorical", "categories": CATEGORIES},
            {"reasoning": "half", "label": "partly"},
            {"label": "partly", "score": 0.5, "success": True, "reasoning": "half"},
        ),
        (
            {"score_type": "rubric", "criteria": CRITERIA, "threshold": 0.8},
            {"reasoning": "r", "criteria": {"accuracy": 1, "clarity": 0.2}},
            {
                "score": 0.8,
                "success": True,
                "criteria": {"accuracy": 1, "clarity": 0.2},
                "reasoning": "r",
            },
        ),
    ],
    ids=["binary", "numeric", "numeric-no-reasoning", "categorical", "rubric"],
)
def test_it_reads_each_score_shape(
    project, llm_connection, llm_server, parameters, answer, outputs
):
    llm_server.answer = answer
    result = judge(project, **parameters)
    assert result.status == "success", result.error
    assert result.outputs == outputs
    schema = llm_server.calls[0].json()["response_format"]["json_schema"]["schema"]
    assert set(schema["required"]) == set(answer)


def test_it_asks_for_categorical_labels_and_rubric_criteria_by_name(
    project, llm_connection, llm_server
):
    llm_server.answer = {"reasoning": "", "label": "right"}
    judge(project, score_type="categorical", categories=CATEGORIES)
    schema = llm_server.calls[0].json()["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["label"] == {"type": "string", "enum": ["wrong", "partly", "right"]}
    llm_server.answer = {"reasoning": "", "criteria": {"accuracy": 1, "clarity": 1}}
    judge(project, score_type="rubric", criteria=CRITERIA)
    body = llm_server.calls[1].json()
    criteria = body["response_format"]["json_schema"]["schema"]["properties"]["criteria"]
    assert criteria["required"] == ["accuracy", "clarity"]
    assert "- accuracy: facts" in body["messages"][0]["content"]


def test_the_outputs_schema_becomes_the_revisions(project, llm_connection):
    evaluator = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Helpful",
        parameters={"connection": "local", "score_type": "categorical", "categories": CATEGORIES},
    )
    outputs = EvaluatorRevision.objects.get(pk=evaluator.head_id).schemas["outputs"]
    assert outputs["properties"]["label"]["enum"] == ["wrong", "partly", "right"]
    assert outputs["properties"]["success"] == {"type": "boolean"}
    assert outputs["properties"]["reasoning"] == {"type": "string"}
    assert outputs["required"] == ["label", "score", "success"]


def test_a_json_true_is_not_a_numeric_score(project, llm_connection, llm_server):
    llm_server.answer = {"reasoning": "yes", "score": True}
    result = judge(project)
    assert result.status == "error"
    assert result.error["code"] == "invalid_judge_answer"
    assert "True is not of type 'number'" in result.error["message"]
    assert len(llm_server.calls) == 2  # the answer, then one repair request
    assert result.outputs is None


def test_a_number_is_not_a_verdict(project, llm_connection, llm_server):
    llm_server.queue({"reasoning": "", "verdict": 1}, {"reasoning": "", "verdict": True})
    result = judge(project, score_type="binary")
    assert result.outputs == {"success": True, "reasoning": ""}
    repair = llm_server.calls[1].json()["messages"]
    assert "verdict: 1 is not of type 'boolean'" in repair[-1]["content"]


# --- malformed answers --------------------------------------------------------------------------


def test_it_repairs_a_malformed_answer_once(project, llm_connection, llm_server):
    llm_server.queue("I think it is right, 0.8", {"reasoning": "fixed", "score": 0.8})
    result = judge(project)
    assert result.status == "success", result.error
    assert result.outputs == {"score": 0.8, "success": True, "reasoning": "fixed"}
    first, second = (c.json()["messages"] for c in llm_server.calls)
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": "I think it is right, 0.8"}
    assert "could not be used" in second[-1]["content"] and second[-1]["role"] == "user"
    assert result.details["attempts"] == 2


def test_it_reads_json_in_code_fences_and_prose(project, llm_connection, llm_server):
    llm_server.answer = 'Here you go:\n```json\n{"reasoning": "r", "score": 0.5}\n```'
    assert judge(project).outputs == {"score": 0.5, "success": True, "reasoning": "r"}
    assert len(llm_server.calls) == 1


def test_a_score_out_of_range_gets_one_repair_then_fails(project, llm_connection, llm_server):
    llm_server.answer = {"reasoning": "r", "score": 7}
    result = judge(project)
    assert result.status == "error"
    assert result.error["code"] == "invalid_judge_answer"
    assert "7 is greater than the maximum of 1" in result.error["message"]
    assert len(llm_server.calls) == 2


def test_it_falls_back_when_the_server_has_no_structured_outputs(
    project, llm_connection, llm_server
):
    llm_server.queue(
        failure(400, "response_format json_schema is not supported by this model"),
        {"reasoning": "r", "score": 1},
    )
    result = judge(project)
    assert result.status == "success", result.error
    first, second = (c.json() for c in llm_server.calls)
    assert "response_format" in first and "response_format" not in second
    assert "JSON Schema of the answer" in second["messages"][0]["content"]


def test_a_bad_request_is_an_error_without_retries(project, llm_connection, llm_server):
    llm_server.answer = failure(400, "context length exceeded")
    result = judge(project)
    assert result.error["code"] == "model_error"
    assert "HTTP 400: context length exceeded" in result.error["message"]
    assert len(llm_server.calls) == 1


# --- cost and trace -----------------------------------------------------------------------------


def test_it_records_each_judgement_as_a_trace(project, llm_connection, llm_server):
    llm_server.queue("nonsense", completion({"reasoning": "r", "score": 1}, prompt_tokens=300))
    result = judge(project)
    trace = Trace.objects.get(pk=result.details["judge_trace_id"])
    assert trace.source == "judge" and trace.project == project
    assert trace.tokens == 100 + 20 + 300 + 20
    # judge-1 costs $1 per 1M prompt tokens and $2 per 1M completion tokens
    assert trace.cost == pytest.approx((400 * 1 + 40 * 2) / 1e6)
    assert result.details["cost_usd"] == pytest.approx(trace.cost)
    assert result.details["tokens"] == {"prompt": 400, "completion": 40, "total": 440}
    assert trace.duration_ms == pytest.approx(result.duration_ms)
    root = trace.spans.get(parent_id="")
    data = root.attributes["ag"]["data"]
    assert data["inputs"]["messages"] == result.details["rendered_prompt"]
    assert data["outputs"]["outputs"] == result.outputs
    children = list(trace.spans.filter(parent_id=root.span_id).order_by("start_time"))
    assert [c.name for c in children] == ["chat.completions", "chat.completions"]
    assert children[1].attributes["ag"]["metrics"]["unit"]["tokens"]["prompt"] == 300


def test_a_failed_judgement_is_traced_as_an_error(project, llm_connection, llm_server):
    llm_server.answer = failure(500, "boom")
    result = judge(project, max_retries=1)
    assert result.status == "error"
    trace = Trace.objects.get(pk=result.details["judge_trace_id"])
    assert trace.status == "error"
    assert trace.span_count == 3  # the cell and its two attempts


def test_a_template_error_makes_no_call_and_no_trace(project, llm_connection, llm_server):
    result = judge(project, messages=[{"role": "user", "content": "{{nothing}}"}])
    assert result.status == "error"
    assert "judge_trace_id" not in result.details
    assert not Trace.objects.filter(source="judge").exists()


# --- rate limits, retries, timeouts -------------------------------------------------------------


def test_it_rides_out_a_429_storm_honouring_retry_after(project, llm_connection, llm_server):
    limited = failure(429, "slow down", headers={"Retry-After": "1"})
    llm_server.queue(limited, limited, {"reasoning": "r", "score": 1})
    started = time.monotonic()
    result = judge(project)
    assert result.status == "success", result.error
    assert result.outputs["score"] == 1
    assert len(llm_server.calls) == 3
    assert time.monotonic() - started >= 2.0
    assert result.details["attempts"] == 3


def test_retry_after_holds_back_every_caller_of_the_connection(project, llm_connection, llm_server):
    llm_server.queue(
        failure(429, "later", headers={"Retry-After": "2"}), {"reasoning": "", "score": 1}
    )
    first = judge(project, max_retries=0)  # gives up at once, but the pause is now shared
    assert first.error["code"] == "rate_limited"
    assert first.outputs is None
    started = time.monotonic()
    second = judge(project)  # another caller: a playground, another worker
    assert second.status == "success"
    assert time.monotonic() - started >= 1.5


def test_429s_that_never_stop_end_as_errors_not_scores(project, llm_connection, llm_server):
    llm_server.answer = failure(429, "quota", headers={"retry-after-ms": "20"})
    results = judge_many(project, 5, max_retries=2)
    assert [r.status for r in results] == ["error"] * 5
    assert {r.error["code"] for r in results} == {"rate_limited"}
    assert all(r.outputs is None for r in results)
    assert "Gave up after 3 attempts" in results[0].error["message"]
    assert len(llm_server.calls) == 15


def test_a_storm_of_random_429s_loses_no_cell(project, llm_connection, llm_server):
    import random

    rng = random.Random(3)

    def answer(request):
        if rng.random() < 0.3:
            return failure(429, "busy", headers={"retry-after-ms": "50"})
        return {"reasoning": "r", "score": 0.6}

    llm_server.answer = answer
    results = judge_many(project, 40, max_retries=8)
    assert len(results) == 40
    assert all(r.status == "success" and r.outputs["score"] == 0.6 for r in results)


def test_a_retry_after_longer_than_allowed_fails_the_cell(
    project, llm_connection, llm_server, settings
):
    settings.EVALSITE_JUDGE_MAX_BACKOFF_SECONDS = 1
    llm_server.answer = failure(429, "come back tomorrow", headers={"Retry-After": "3600"})
    result = judge(project)
    assert result.error["code"] == "rate_limited"
    assert "3600" in result.error["message"]
    assert len(llm_server.calls) == 1


def test_it_retries_server_errors(project, llm_connection, llm_server):
    llm_server.queue(failure(502), failure(503), {"reasoning": "r", "score": 0.9})
    result = judge(project)
    assert result.outputs["score"] == 0.9
    assert len(llm_server.calls) == 3


def test_a_model_that_never_answers_in_time_is_an_error(project, llm_connection, llm_server):
    ModelConnection.objects.filter(pk=llm_connection.pk).update(timeout_seconds=0.3)
    llm_server.answer = completion({"reasoning": "late", "score": 1}, delay=1.5)
    started = time.monotonic()
    result = judge(project, max_retries=1)
    assert result.status == "error"
    assert result.error["code"] == "model_timeout"
    assert "within 0.3 s" in result.error["message"]
    assert len(llm_server.calls) == 2
    assert time.monotonic() - started < 2.5


def test_the_limiter_paces_calls_to_the_connections_rate(project, llm_connection, llm_server):
    ModelConnection.objects.filter(pk=llm_connection.pk).update(rate_limit_rpm=600)  # 10/s
    started = time.monotonic()
    results = judge_many(project, 25)
    assert all(r.status == "success" for r in results)
    # a burst of 10, then one every 100 ms
    assert time.monotonic() - started >= 1.3


def test_a_limiter_slot_too_far_away_is_an_error(project, llm_connection, llm_server, settings):
    settings.EVALSITE_JUDGE_MAX_WAIT_SECONDS = 0.5
    ModelConnection.objects.filter(pk=llm_connection.pk).update(rate_limit_rpm=1)
    results = judge_many(project, 2)
    assert sorted(r.status for r in results) == ["error", "success"]
    [error] = [r.error for r in results if r.error]
    assert error["code"] == "rate_limited" and "1/min" in error["message"]
    assert len(llm_server.calls) == 1


def test_the_limiter_is_shared_through_redis(llm_connection):
    one, other = Limiter(llm_connection.pk, 60), Limiter(llm_connection.pk, 60)
    deadline = time.monotonic() + 0.2
    one.acquire(deadline)
    with pytest.raises(Exception, match="slot"):
        other.acquire(deadline)


# --- refused keys -------------------------------------------------------------------------------


def test_a_refused_key_fails_fast_and_marks_the_connection(
    project, llm_connection, llm_server, settings
):
    settings.EVALSITE_JUDGE_CONCURRENCY = 1
    llm_server.answer = failure(401, "Incorrect API key provided")
    results = judge_many(project, 5)
    assert {r.error["code"] for r in results} == {"connection_auth_failed"}
    assert len(llm_server.calls) == 1  # the other cells do not hammer a refused key
    llm_connection.refresh_from_db()
    assert "401" in llm_connection.failing_reason
    assert "Incorrect API key provided" in llm_connection.failing_reason
    assert llm_connection.failing_since is not None


def test_a_forbidden_model_marks_the_connection_too(project, llm_connection, llm_server):
    llm_server.answer = failure(403, "not allowed")
    assert judge(project).error["code"] == "connection_auth_failed"
    llm_connection.refresh_from_db()
    assert llm_connection.is_failing


def test_a_success_clears_the_failing_mark(project, llm_connection, llm_server):
    llm_connection.mark_failing("HTTP 401 earlier")
    assert judge(project).status == "success"
    llm_connection.refresh_from_db()
    assert llm_connection.failing_reason == "" and llm_connection.failing_since is None


# --- spend cap ----------------------------------------------------------------------------------


def priced(connection, usd_per_call):
    # 100 prompt tokens and 20 completion tokens per call (the server's default usage)
    connection.prices = {"judge-1": {"prompt": usd_per_call * 1e6 / 100, "completion": 0}}
    connection.save()


def test_the_spend_cap_stops_further_calls(project, llm_connection, llm_server, settings):
    settings.EVALSITE_JUDGE_CONCURRENCY = 1
    priced(llm_connection, 0.10)
    items = [({"correct_answer": "x"}, "x", None)] * 5
    raws = evaluate_many(project, items, {"run_id": 101}, max_cost_usd=0.25)
    errors = [r.error for r in raws if r.error is not None]
    assert sum(r.error is None for r in raws) == 3
    assert [e.code for e in errors] == ["spend_cap_reached", "spend_cap_reached"]
    assert "$0.25" in errors[0].message
    assert len(llm_server.calls) == 3


def test_the_spend_cap_counts_the_whole_run_across_batches(project, llm_connection, llm_server):
    priced(llm_connection, 0.10)
    item = [({"correct_answer": "x"}, "x", None)]
    for _ in range(3):
        assert evaluate_many(project, item, {"run_id": 202}, max_cost_usd=0.3)[0].error is None
    capped = evaluate_many(project, item, {"run_id": 202}, max_cost_usd=0.3)[0]
    assert capped.error.code == "spend_cap_reached"
    other_run = evaluate_many(project, item, {"run_id": 203}, max_cost_usd=0.3)[0]
    assert other_run.error is None
    rule = evaluate_many(project, item, {"rule_id": 7}, max_cost_usd=0.3)[0]
    assert rule.error is None
    assert len(llm_server.calls) == 5


def test_a_spend_cap_needs_a_price(project, llm_connection, llm_server):
    result = judge(project, model="judge-2", max_cost_usd=1)
    assert result.error["code"] == "no_price"
    assert llm_server.calls == []


# --- configuration errors and concurrency -------------------------------------------------------


def test_it_names_an_unknown_connection_or_model(project, llm_connection, llm_server):
    assert judge(project, connection="nope").error["code"] == "no_connection"
    result = judge(project, model="gpt-9")
    assert result.error["code"] == "unknown_model"
    assert "judge-1, judge-2" in result.error["message"]
    assert llm_server.calls == []


def test_another_projects_connection_is_not_found(project, other_project, llm_connection):
    result = evaluation_invoke(
        kind="llm_judge",
        parameters={"connection": "local"},
        inputs=INPUTS,
        outputs="Paris",
        project=other_project,
    )
    assert result.error["code"] == "no_connection"


def test_it_refuses_private_addresses_unless_allowed(project, llm_connection, llm_server, settings):
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = False
    result = judge(project)
    assert result.error["code"] == "connection_address_refused"
    assert "EVALSITE_MODELS_ALLOW_PRIVATE" in result.error["message"]
    assert llm_server.calls == []


def test_it_runs_a_batch_concurrently(project, llm_connection, llm_server, settings):
    settings.EVALSITE_JUDGE_CONCURRENCY = 16
    llm_server.answer = completion({"reasoning": "r", "score": 1}, delay=0.3)
    started = time.monotonic()
    results = judge_many(project, 16)
    assert all(r.status == "success" for r in results)
    assert time.monotonic() - started < 2.0  # one after another would take 4.8 s


def test_results_come_back_in_the_order_of_the_items(project, llm_connection, llm_server):
    def answer(request):
        row = request.json()["messages"][-1]["content"].split("\n")[1]  # "C3" ...
        delay = 0.2 if row == "C0" else 0.0
        return completion({"reasoning": row, "score": 1}, delay=delay)

    llm_server.answer = answer
    results = judge_many(project, 6)
    assert [r.outputs["reasoning"] for r in results] == [f"C{i}" for i in range(6)]


def test_it_needs_a_connection_in_its_parameters():
    from evalsite.errors import InvalidInput
    from evaluators.services import parameters_validate

    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("llm_judge"), {})
    assert "parameters.connection" in caught.value.fields


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        (
            {"score_type": "categorical", "categories": [{"label": "a", "score": 1}]},
            "two categories",
        ),
        ({"score_type": "rubric"}, "at least one criterion"),
        ({"score_min": 5, "score_max": 1}, "score_min must be below score_max"),
        ({"prompt_source": "script"}, "needs a script"),
        ({"messages": []}, "at least one message"),
    ],
)
def test_it_refuses_inconsistent_settings(parameters, reason):
    from evalsite.errors import InvalidInput
    from evaluators.services import parameters_validate

    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("llm_judge"), {"connection": "x", **parameters})
    assert reason in str(caught.value.fields)


def test_every_preset_is_valid_and_renders(project, llm_connection, llm_server):
    kind = get_kind("llm_judge")
    assert {p.slug for p in kind.presets} >= {
        "correctness",
        "hallucination",
        "conciseness",
        "answer_relevancy",
        "helpfulness",
        "rubric",
    }
    for preset in kind.presets:
        if preset.parameters.get("prompt_source") == "script":
            continue
        parameters = {**preset.parameters, "connection": "local"}
        llm_server.answer = lambda request: Reply(500)
        result = judge(project, max_retries=0, **parameters)
        assert result.error["code"] == "model_unavailable", (preset.slug, result.error)
        assert result.details["rendered_prompt"], preset.slug


# --- the seam other kinds use -------------------------------------------------------------------

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "score": {"type": "number"}},
    "required": ["reasoning", "score"],
    "additionalProperties": False,
}


def test_structured_call_returns_the_checked_answer_and_traces_it(
    project, llm_connection, llm_server
):
    llm_server.queue("not json", {"reasoning": "fine", "score": 0.4})
    messages = [{"role": "user", "content": "Grade this."}]
    answer = structured_call(
        project=project,
        connection="local",
        messages=messages,
        schema=ANSWER_SCHEMA,
        name="agent_goal",
    )
    assert answer == {"reasoning": "fine", "score": 0.4}
    body = llm_server.calls[0].json()
    assert body["response_format"]["json_schema"]["name"] == "agent_goal"
    assert body["messages"] == messages
    trace = Trace.objects.get(source="judge")
    assert trace.name == "judge agent_goal" and trace.span_count == 3


def test_structured_call_raises_what_went_wrong(project, llm_connection, llm_server):
    llm_server.answer = failure(401, "bad key")
    with pytest.raises(EvaluationError) as caught:
        structured_call(project=project, connection="local", messages=[], schema=ANSWER_SCHEMA)
    assert caught.value.code == "connection_auth_failed"
    llm_connection.refresh_from_db()
    assert llm_connection.is_failing
    with pytest.raises(EvaluationError) as caught:
        structured_call(project=project, connection="nope", messages=[], schema=ANSWER_SCHEMA)
    assert caught.value.code == "no_connection"


# --- the generated settings form and the try-it panel -------------------------------------------


def test_the_settings_form_is_generated_and_creates_a_judge(editor_client, project, llm_connection):
    page = editor_client.get("/p/acme/evaluators/new?kind=llm_judge&preset=helpfulness")
    html = page.content.decode()
    assert page.status_code == 200
    assert "Model connection" in html and "partially_helpful" in html
    messages = [{"role": "user", "content": "Is {{outputs}} helpful for {{question}}?"}]
    response = editor_client.post(
        "/p/acme/evaluators/new?kind=llm_judge",
        {
            "kind": "llm_judge",
            "name": "Helpful",
            "p__connection": "local",
            "p__prompt_source": "messages",
            "p__template_format": "curly",
            "p__messages": json.dumps(messages),
            "p__score_type": "binary",
            "p__reasoning": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    revision = EvaluatorRevision.objects.get(evaluator__slug="helpful")
    assert revision.parameters["messages"] == messages
    assert revision.schemas["outputs"]["required"] == ["success"]


def test_the_try_panel_returns_the_rendered_prompt(
    editor_client, project, llm_connection, llm_server
):
    evaluator_create(
        project=project, kind="llm_judge", name="J", parameters={"connection": "local"}
    )
    llm_server.answer = {"reasoning": "r", "score": 0.9}
    response = editor_client.post(
        "/p/acme/evaluators/j/try",
        {"inputs": json.dumps(INPUTS), "outputs": '"Paris"', "trace": "null"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    result = response.context["result"]
    assert result.status == "success"
    assert result.details["rendered_prompt"][-1]["content"].startswith("Input:\nFrance")
