"""Evaluators judging a whole session (DOMAIN.md, "The evaluator contract"): code in the three
runtimes through the real sandbox, an LLM judge against the local chat-completions server, the
agent score over a conversation, the service's refusals, and the invoke API."""

import copy
import json

import pytest

from evaluators.judge.context import template_variables
from evaluators.judge.sessions import session_fields, session_transcript
from evaluators.judge.templates import render
from evaluators.kinds.code import session_batches
from evaluators.services import (
    evaluation_invoke,
    evaluator_create,
    revision_session_problem,
    session_evaluations_invoke_many,
    session_shape_problem,
)
from runs.traces.sessions import messages

# --- a five-turn support conversation, shaped as runs.traces.sessions.session_dict builds it ------


def tool_turn(number: int, question: str, answer: str, *, failed: bool = False) -> dict:
    """One turn whose agent calls lookup_order once (failing when ``failed``) and answers."""
    call_id = f"call_{number}"
    result = {"error": "order service timed out"} if failed else {"ok": True, "status": "shipped"}
    outputs = {
        "messages": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order": 42}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
            {"role": "assistant", "content": answer},
        ]
    }
    tool = span(
        f"tool{number}",
        "lookup_order",
        "tool",
        number,
        inputs={"order": 42},
        outputs=result,
        status="error" if failed else "ok",
        status_message="order service timed out" if failed else None,
        tokens=0,
    )
    tool["attributes"]["gen_ai.tool.call.id"] = call_id
    return trace(number, {"message": question}, outputs, children=[tool])


def text_turn(number: int, question: str, answer: str) -> dict:
    return trace(number, {"message": question}, answer)


def span(
    span_id, name, kind, number, *, inputs, outputs, status="ok", status_message=None, tokens=30
):
    return {
        "span_id": span_id,
        "parent_id": None,
        "name": name,
        "kind": kind,
        "start_time": f"2026-11-20T10:0{number}:00.000Z",
        "end_time": f"2026-11-20T10:0{number}:01.000Z",
        "status": status,
        **({"status_message": status_message} if status_message else {}),
        "attributes": {
            "ag": {
                "data": {"inputs": inputs, "outputs": outputs},
                "metrics": {
                    "unit": {
                        "duration": {"total": 1000.0},
                        "tokens": {"prompt": tokens, "completion": 0, "total": tokens},
                    }
                },
            }
        },
        "children": {},
    }


def trace(number: int, inputs, outputs, children=()) -> dict:
    root = span(f"root{number}", "support_agent", "agent", number, inputs=inputs, outputs=outputs)
    root["children"] = {
        child["span_id"]: {**child, "parent_id": root["span_id"]} for child in children
    }
    return {"trace_id": f"{number:032x}", "spans": {root["span_id"]: root}}


def conversation(failed_turn: int | None = None) -> dict:
    traces = [
        text_turn(1, "Hi, where is my order 42?", "Let me look that up."),
        tool_turn(2, "It was due Monday.", "Order 42 shipped on Friday.", failed=failed_turn == 2),
        tool_turn(3, "Can you check again?", "The order service is down.", failed=failed_turn == 3),
        text_turn(4, "Can I get a refund?", "Refunds open once an order arrives."),
        text_turn(5, "Thanks, bye.", "You're welcome, goodbye!"),
    ]
    return {"session_id": "support-7", "traces": traces, "messages": messages(traces)}


SESSION = conversation()


def judge_session(session=SESSION, inputs=None, outputs=None, **call):
    return session_evaluations_invoke_many(items=[(inputs or {}, outputs, session)], **call)[0]


# --- code evaluators, in the real sandbox ---------------------------------------------------------

PYTHON = """
def evaluate(inputs, outputs, trace):
    return True

def evaluate_session(inputs, outputs, session):
    users = [m["content"] for m in session["messages"] if m["role"] == "user"]
    return {
        "score": 1.0 if len(session["traces"]) == 5 else 0.0,
        "turns": len(session["traces"]),
        "first_question": users[0],
        "inputs": inputs.get("message"),
        "outputs": outputs,
        "session_id": session["session_id"],
    }
"""
JAVASCRIPT = """
function evaluateSession(inputs, outputs, session) {
  const users = session.messages.filter((m) => m.role === 'user').map((m) => m.content);
  return {
    score: session.traces.length === 5 ? 1 : 0,
    turns: session.traces.length,
    first_question: users[0],
    inputs: inputs.message,
    outputs,
    session_id: session.session_id,
  };
}
"""
TYPESCRIPT = """
interface Message { role: string; content: string }
interface Session { session_id: string; traces: unknown[]; messages: Message[] }

export function evaluate(inputs: any, outputs: any, trace: any): boolean {
  return true;
}

export async function evaluateSession(inputs: any, outputs: any, session: Session) {
  const users: string[] = session.messages.filter((m) => m.role === 'user').map((m) => m.content);
  return {
    score: session.traces.length === 5 ? 1 : 0,
    turns: session.traces.length,
    first_question: users[0],
    inputs: inputs.message as string,
    outputs,
    session_id: session.session_id,
  };
}
"""
SESSION_CODE = {"python": PYTHON, "javascript": JAVASCRIPT, "typescript": TYPESCRIPT}


@pytest.mark.parametrize("runtime", ["python", "javascript", "typescript"])
def test_a_code_evaluator_scores_a_five_turn_session(project, runtime):
    result = judge_session(
        kind="code",
        parameters={"runtime": runtime, "code": SESSION_CODE[runtime], "version": "2"},
        project=project,
    )
    assert result.status == "success", result.error
    assert result.outputs == {
        "score": 1,
        "turns": 5,
        "first_question": "Hi, where is my order 42?",
        # Empty inputs are the first turn's, missing outputs the last turn's.
        "inputs": "Hi, where is my order 42?",
        "outputs": "You're welcome, goodbye!",
        "session_id": "support-7",
    }


@pytest.mark.parametrize("runtime", ["python", "javascript", "typescript"])
def test_a_session_only_evaluator_is_saved_and_refuses_traces(project, runtime):
    code = SESSION_CODE[runtime]
    code = code.replace("def evaluate(inputs", "def _unused(inputs")  # Python: session only
    code = code.replace("export function evaluate(", "function unused(")  # TypeScript too
    evaluator = evaluator_create(
        project=project,
        kind="code",
        name=f"S {runtime}",
        parameters={"runtime": runtime, "code": code},
    )
    assert judge_session(revision=evaluator.head, project=project).status == "success"
    on_a_trace = evaluation_invoke(revision=evaluator.head, inputs={}, outputs="x", project=project)
    assert on_a_trace.status == "error"
    assert on_a_trace.error["type"] == "MissingEvaluate"
    assert (
        "evaluate_session" in on_a_trace.error["message"]
        or "evaluateSession" in (on_a_trace.error["message"])
    )


def test_a_v2_evaluator_without_evaluate_session_is_an_error_not_a_zero(project):
    evaluator = evaluator_create(
        project=project,
        kind="code",
        name="Trace only",
        parameters={"code": "def evaluate(inputs, outputs, trace):\n    return 0.0\n"},
    )
    problem = revision_session_problem(evaluator.head)
    assert "define def evaluate_session(inputs, outputs, session)" in problem
    items = [({}, None, SESSION), ({}, None, conversation(failed_turn=3))]
    results = session_evaluations_invoke_many(revision=evaluator.head, items=items, project=project)
    for result in results:
        assert result.status == "error"
        assert result.outputs is None
        assert result.error["code"] == "session_unsupported"
        assert result.error["message"] == problem


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        (
            "python",
            "def evaluate(inputs, outputs, trace):\n    return 1\n\nif False:\n"
            "    def evaluate_session(inputs, outputs, session):\n        return 1\n",
        ),
        ("javascript", "// evaluateSession: later\nfunction evaluate(i, o, t) { return 1; }\n"),
    ],
)
def test_a_session_entry_point_named_but_not_defined_fails_in_the_sandbox(project, runtime, code):
    result = judge_session(
        kind="code", parameters={"runtime": runtime, "code": code, "version": "2"}, project=project
    )
    assert result.status == "error"
    assert result.error["code"] == "session_unsupported"
    assert "cannot judge sessions" in result.error["message"]


@pytest.mark.parametrize(
    "code",
    [
        "def _turns(inputs, outputs, session):\n    return len(session['traces'])\n\n"
        "evaluate, evaluate_session = (lambda inputs, outputs, trace: 1), _turns\n",
        "def make():\n    return lambda inputs, outputs, session: len(session['traces'])\n\n"
        "globals()['evaluate_session'] = make()\n",
    ],
    ids=["tuple-assignment", "globals"],
)
def test_a_session_entry_point_defined_by_assignment_judges_sessions(project, code):
    evaluator = evaluator_create(
        project=project, kind="code", name="Assigned", parameters={"code": code}
    )
    assert revision_session_problem(evaluator.head) is None
    result = judge_session(revision=evaluator.head, project=project)
    assert result.status == "success", result.error
    assert result.outputs == {"score": 5, "success": True}


@pytest.mark.parametrize("runtime", ["javascript", "typescript"])
def test_a_lone_default_export_named_evaluate_session_is_not_used_on_traces(project, runtime):
    code = "export default function evaluateSession(inputs, outputs, session) {\n"
    code += "  return session.traces.length;\n}\n"
    parameters = {"runtime": runtime, "code": code, "version": "2"}
    assert judge_session(kind="code", parameters=parameters).outputs == {
        "score": 5,
        "success": True,
    }
    on_a_trace = evaluation_invoke(kind="code", parameters=parameters, inputs={}, outputs="x")
    assert on_a_trace.status == "error"
    assert on_a_trace.error["type"] == "MissingEvaluate"
    assert "evaluateSession" in on_a_trace.error["message"]


def large_session(number: int, messages_count: int = 75_000) -> dict:
    """About 4.5 MB of JSON: a long conversation without traces."""
    said = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} hello"}
        for i in range(messages_count)
    ]
    return {"session_id": f"long-{number}", "traces": [], "messages": said}


LARGE_SESSION_CODE = {
    "python": "def evaluate_session(inputs, outputs, session):\n"
    "    return {'id': session['session_id'], 'messages': len(session['messages'])}\n",
    "javascript": "function evaluateSession(inputs, outputs, session) {\n"
    "  return { id: session.session_id, messages: session.messages.length };\n}\n",
}


@pytest.mark.parametrize("runtime", ["python", "javascript"])
def test_a_batch_of_ten_large_sessions_judges_every_one(project, runtime):
    sessions = [large_session(number) for number in range(10)]
    assert all(4_000_000 < len(json.dumps(s)) < 5_000_000 for s in sessions)
    results = session_evaluations_invoke_many(
        kind="code",
        parameters={"runtime": runtime, "code": LARGE_SESSION_CODE[runtime], "version": "2"},
        items=[({}, "x", session) for session in sessions],
        project=project,
    )
    assert [r.error for r in results] == [None] * 10
    assert [r.outputs for r in results] == [
        {"id": f"long-{number}", "messages": 75_000} for number in range(10)
    ]


def test_sessions_go_to_the_sandbox_in_batches_under_a_byte_budget():
    items = [({}, None, {"session_id": str(n), "traces": [], "messages": []}) for n in range(5)]
    size = len(json.dumps(items[0][2], separators=(",", ":")))
    batches = list(session_batches(items, 2 * size))
    assert batches == [items[0:2], items[2:4], items[4:5]]
    # A session larger than the budget goes alone.
    assert list(session_batches(items[:2], size - 1)) == [items[0:1], items[1:2]]


def test_the_session_size_limit_counts_compact_json(project, settings):
    settings.EVALSITE_MAX_BODY_BYTES = len(json.dumps(SESSION, separators=(",", ":")))
    result = judge_session(
        kind="code", parameters={"code": PYTHON, "version": "2"}, project=project
    )
    assert result.status == "success", result.error


def test_a_legacy_v1_evaluator_cannot_judge_sessions(project):
    code = "def evaluate_session(inputs, outputs, session):\n    return 1\n"
    result = judge_session(kind="code", parameters={"code": code}, project=project)
    assert result.error["code"] == "session_unsupported"
    assert "Interface version 1" in result.error["message"]


def test_a_session_larger_than_the_body_limit_is_refused_with_the_limit(project, settings):
    settings.EVALSITE_MAX_BODY_BYTES = 2000
    result = judge_session(
        kind="code", parameters={"code": PYTHON, "version": "2"}, project=project
    )
    assert result.status == "error"
    assert result.error["code"] == "session_too_large"
    assert "EVALSITE_MAX_BODY_BYTES" in result.error["message"]
    assert "2,000 bytes" in result.error["message"]


def test_a_malformed_session_fails_alone(project):
    items = [({}, None, {"session_id": "x", "traces": "nope"}), ({}, None, SESSION)]
    bad, good = session_evaluations_invoke_many(
        kind="code", parameters={"code": PYTHON, "version": "2"}, items=items, project=project
    )
    assert bad.error["code"] == "invalid_session"
    assert "traces: must be a list" in bad.error["message"]
    assert good.status == "success", good.error


def odd_sessions() -> list[dict]:
    """Sessions whose outer shape is right (``session_shape_problem`` passes them) and whose
    insides are not what a tracer would send."""
    odd = []
    for where, value in [
        ("tool_calls", 5),
        ("tool_calls", {"id": "c"}),
        ("content", {"parts": 1}),
        ("tool_call_id", ["c"]),
        ("children", 5),
        ("children", ["x"]),
        ("metrics", "fast"),
        ("status", 5),
    ]:
        session = copy.deepcopy(conversation(failed_turn=3))
        for turn in (3, 5):  # a tool turn, and the last turn (what ``trace`` is)
            root = session["traces"][turn - 1]["spans"][f"root{turn}"]
            if where in ("children", "status"):
                root[where] = value
            elif where == "metrics":
                root["attributes"]["ag"]["metrics"] = value
        if where not in ("children", "status", "metrics"):
            session["messages"][3][where] = value
        odd.append(session)
    return odd


@pytest.mark.parametrize("session", odd_sessions())
def test_odd_insides_of_an_accepted_session_crash_no_reader(project, session):
    assert session_shape_problem(session) is None
    fields = session_fields(session, 2000)
    assert fields["session_transcript"].startswith("user: Hi, where is my order 42?")
    assert fields["session_outline"].startswith("Turn 1")
    variables = template_variables(
        inputs={}, outputs="bye", trace=session["traces"][-1], session=session
    )
    prompt = "{{session_transcript}}\n{{session_outline}}\n{{trace_outline}}"
    assert "Turn 5" in render(prompt, variables)
    scored = judge_session(kind="agent_score", parameters={}, session=session)
    assert scored.status == "success" or scored.error["code"] == "malformed_history"
    code = judge_session(kind="code", parameters={"code": PYTHON, "version": "2"}, session=session)
    assert code.status == "success", code.error


def test_the_transcript_reads_tool_calls_that_are_not_a_list_as_none():
    said = [{"role": "assistant", "content": "One moment.", "tool_calls": 5}]
    assert session_transcript(said) == "assistant: One moment."


# --- which revisions judge sessions -------------------------------------------------------------


def test_it_says_which_revisions_judge_sessions_and_why_not(project):
    def head(kind, **parameters):
        return evaluator_create(project=project, kind=kind, name=kind, parameters=parameters).head

    assert revision_session_problem(head("code", code=PYTHON)) is None
    assert revision_session_problem(head("agent_score")) is None
    assert "one trace at a time" in revision_session_problem(head("exact_match"))
    assert "annotation queues" in revision_session_problem(head("human"))


def test_a_kind_without_sessions_answers_session_unsupported(project):
    result = judge_session(kind="regex", parameters={"pattern": "bye"}, project=project)
    assert result.status == "error"
    assert result.error["code"] == "session_unsupported"
    assert "judge one trace at a time, not sessions" in result.error["message"]


# --- the LLM judge ------------------------------------------------------------------------------

SESSION_PROMPT = [
    {"role": "system", "content": "You grade support conversations."},
    {
        "role": "user",
        "content": "Conversation:\n{{session_transcript}}\n\nWhat the agent did:\n"
        "{{session_outline}}\n\nLast answer: {{outputs}}",
    },
]


def test_an_llm_judge_reads_the_session_transcript(project, llm_connection, llm_server):
    llm_server.answer = {"reasoning": "polite and correct", "score": 0.9}
    result = judge_session(
        kind="llm_judge",
        parameters={"connection": "local", "messages": SESSION_PROMPT},
        project=project,
        session=conversation(failed_turn=3),
    )
    assert result.status == "success", result.error
    assert result.outputs["score"] == 0.9
    [call] = llm_server.calls
    sent = call.json()["messages"][-1]["content"]
    assert (
        "user: Hi, where is my order 42?\nassistant: Let me look that up.\n"
        "user: It was due Monday.\n"
        'assistant: [calls lookup_order({"order": 42})]\n'
        'tool (lookup_order): {"ok": true, "status": "shipped"}\n'
        "assistant: Order 42 shipped on Friday.\n"
    ) in sent
    assert "user: Thanks, bye.\nassistant: You're welcome, goodbye!" in sent
    for number in range(1, 6):
        assert f"Turn {number} · trace {number:032x}" in sent
    assert "[tool] lookup_order · 1000 ms · ERROR: order service timed out" in sent
    assert "Last answer: You're welcome, goodbye!" in sent
    assert result.details["rendered_prompt"] == call.json()["messages"]


def test_an_llm_judge_renders_session_as_json_and_trace_as_the_last_turn(
    project, llm_connection, llm_server
):
    template = "{{session.session_id}} | {{trace.trace_id}} | {{session.messages[0]}}"
    result = judge_session(
        kind="llm_judge",
        parameters={"connection": "local", "messages": [{"role": "user", "content": template}]},
        project=project,
    )
    assert result.status == "success", result.error
    sent = llm_server.calls[0].json()["messages"][-1]["content"]
    assert sent == (
        f'support-7 | {5:032x} | {{"role": "user", "content": "Hi, where is my order 42?"}}'
    )


def test_a_session_variable_in_a_trace_evaluation_says_it_exists_only_for_sessions(
    project, llm_connection, llm_server
):
    result = evaluation_invoke(
        kind="llm_judge",
        parameters={
            "connection": "local",
            "messages": [{"role": "user", "content": "{{session_transcript}}"}],
        },
        inputs={"question": "Hi"},
        outputs="Hello",
        project=project,
    )
    assert result.status == "error"
    assert result.error["code"] == "unresolved_variables"
    assert "exist only when the judge evaluates a whole session" in result.error["message"]
    assert llm_server.calls == []


@pytest.mark.parametrize(
    ("runtime", "script"),
    [
        (
            "python",
            "@define_prompt_template\ndef prompt(ctx):\n"
            "    return ctx.session_transcript.splitlines()[0] + ' / ' + ctx.session['session_id']\n",
        ),
        (
            "javascript",
            "definePromptTemplate((ctx) => "
            "`${ctx.sessionTranscript.split('\\n')[0]} / ${ctx.session.session_id}`);",
        ),
    ],
)
def test_a_script_prompt_reads_the_session(project, llm_connection, llm_server, runtime, script):
    result = judge_session(
        kind="llm_judge",
        parameters={
            "connection": "local",
            "prompt_source": "script",
            "script_runtime": runtime,
            "script": script,
        },
        project=project,
    )
    assert result.status == "success", result.error
    sent = llm_server.calls[0].json()["messages"][-1]["content"]
    assert sent == "user: Hi, where is my order 42? / support-7"


# --- the agent score ----------------------------------------------------------------------------


def test_the_agent_score_scores_the_whole_conversation_with_turn_three_failing(project):
    result = judge_session(kind="agent_score", parameters={}, session=conversation(failed_turn=3))
    assert result.status == "success", result.error
    outputs = result.outputs
    details = outputs["details"]
    assert details["tool_calls"] == 2
    assert details["failed_calls"] == 1
    assert details["retries"] == 0  # the same tool in the next turn after it worked: a new ask
    steps = details["trajectory"]
    assert [(s["turn"], s["name"], s["status"]) for s in steps] == [
        (2, "lookup_order", "ok"),
        (3, "lookup_order", "failed"),
    ]
    assert steps[1]["error"] == "order service timed out"
    assert steps[1]["span_id"] == "tool3"
    assert steps[1]["duration_ms"] == 1000.0
    # (1 of 2 succeeded) - 0.10 x 1 failure
    assert outputs["error_free_execution"] == 0.4
    assert outputs["goal_completion"] == 0.8  # the conversation ends with an answer
    assert outputs["score"] == 0.68  # docs/agent-evaluators.md, "Scoring a whole session"
    # Tokens: the largest single span of any turn (30), not one turn's alone.
    assert details["tokens"] == 30 and details["token_source"] == "trace_peak"

    clean = judge_session(kind="agent_score", parameters={}, session=SESSION).outputs
    assert clean["error_free_execution"] == 1.0
    assert clean["details"]["retries"] == 0
    assert clean["score"] > outputs["score"]


def test_the_agent_score_counts_a_tool_called_again_after_a_failed_turn_as_a_retry(project):
    result = judge_session(kind="agent_score", parameters={}, session=conversation(failed_turn=2))
    assert result.status == "success", result.error
    details = result.outputs["details"]
    assert [(s["turn"], s["status"], s["retry"]) for s in details["trajectory"]] == [
        (2, "failed", False),
        (3, "ok", True),
    ]
    assert details["retries"] == 1
    # (1 of 2 succeeded) - 0.05 x 1 retry - 0.10 x 1 failure
    assert result.outputs["error_free_execution"] == 0.35


def test_the_agent_score_sees_no_retry_in_a_tool_used_once_every_turn(project):
    traces = [tool_turn(n, f"Where is order {n}?", f"Order {n} shipped.") for n in range(1, 22)]
    session = {"session_id": "orders", "traces": traces, "messages": messages(traces)}
    outputs = judge_session(kind="agent_score", parameters={}, session=session).outputs
    assert outputs["details"]["tool_calls"] == 21
    assert outputs["details"]["retries"] == 0
    assert outputs["error_free_execution"] == 1.0


@pytest.mark.parametrize("with_user_messages", [True, False])
def test_the_agent_score_counts_a_re_sent_history_once(project, with_user_messages):
    turns = []
    history = []
    for number in range(1, 4):
        history = [*history, {"role": "user", "content": f"q{number}"}]
        call = {
            "id": f"c{number}",
            "type": "function",
            "function": {"name": f"tool_{number}", "arguments": "{}"},
        }
        history += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{number}", "content": "done"},
            {"role": "assistant", "content": f"a{number}"},
        ]
        # Each turn's outputs carry the whole conversation so far, as many chat clients send
        # it. Leaving out the turn's own question (it is in the inputs), no turn's history
        # starts with the previous one's: the call ids tell the repeated calls apart.
        question = {"role": "user", "content": f"q{number}"}
        sent = [m for m in history if with_user_messages or m != question]
        turns.append(trace(number, {"message": f"q{number}"}, {"messages": sent}))
    session = {"session_id": "s", "traces": turns, "messages": history}
    details = judge_session(kind="agent_score", parameters={}, session=session).outputs["details"]
    assert [(s["turn"], s["name"]) for s in details["trajectory"]] == [
        (1, "tool_1"),
        (2, "tool_2"),
        (3, "tool_3"),
    ]
    assert details["tool_calls"] == 3


# --- the invoke API -----------------------------------------------------------------------------


def test_invoke_judges_a_session(api, project):
    evaluator_create(
        project=project,
        kind="code",
        name="Conversation length",
        parameters={"code": PYTHON},
    )
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"evaluator": "conversation-length", "session": SESSION},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "success", body["error"]
    assert body["outputs"]["turns"] == 5
    assert body["outputs"]["outputs"] == "You're welcome, goodbye!"


def test_invoke_answers_session_unsupported_for_a_trace_only_kind(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"kind": "regex", "parameters": {"pattern": "bye"}, "session": SESSION},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["status"] == "error"
    assert response.json()["error"]["code"] == "session_unsupported"


@pytest.mark.parametrize(
    ("session", "reason"),
    [
        ("five turns", "a session is an object"),
        ({"session_id": "s", "messages": []}, "traces: must be a list"),
        ({"traces": [{"trace_id": "x"}]}, "traces[0]: must be a trace"),
        ({"traces": [], "messages": [{"content": "hi"}]}, "messages[0]: must be a message"),
        ({"traces": [], "messages": []}, "the session is empty"),
    ],
)
def test_invoke_refuses_a_bad_session_naming_the_field(api, session, reason):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"kind": "code", "parameters": {"code": PYTHON, "version": "2"}, "session": session},
        format="json",
    )
    assert response.status_code == 400
    assert reason in response.json()["error"]["fields"]["session"][0]


def test_invoke_refuses_a_trace_and_a_session_together(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {
            "kind": "regex",
            "parameters": {"pattern": "a"},
            "outputs": "a",
            "trace": SESSION["traces"][0],
            "session": SESSION,
        },
        format="json",
    )
    assert response.status_code == 400
    assert "not both" in response.json()["error"]["fields"]["session"][0]


def test_invoke_with_a_trace_still_needs_outputs(api):
    response = api.post(
        "/api/v1/evaluators/invoke",
        {"kind": "regex", "parameters": {"pattern": "a"}},
        format="json",
    )
    assert response.status_code == 400
    assert "outputs" in response.json()["error"]["fields"]


# --- the playground -----------------------------------------------------------------------------

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_the_playground_judges_a_session(owner_client, project):
    evaluator_create(project=project, kind="code", name="Turns", parameters={"code": PYTHON})
    response = owner_client.post(
        "/p/acme/evaluators/turns/try",
        {"inputs": "{}", "outputs": "null", "session": json.dumps(SESSION)},
        **HTMX,
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.strip().startswith('<section class="card playground" id="try-panel"')
    assert "badge-success" in html and "&quot;turns&quot;: 5" in html


def test_the_playground_shows_a_bad_session_inline(owner_client, project):
    evaluator_create(project=project, kind="code", name="Turns", parameters={"code": PYTHON})
    response = owner_client.post(
        "/p/acme/evaluators/turns/try",
        {"inputs": "{}", "outputs": "null", "session": '{"traces": 3}'},
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert "<html" in html and "Not a session: traces: must be a list" in html
