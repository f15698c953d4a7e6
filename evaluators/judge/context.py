"""What a judge's prompt can read about one evaluation: the one context builder.

:func:`evaluation_context` builds the fields that script prompt templates receive on stdin
(DOMAIN.md: ``question``, ``candidate_answer``, ``reference_answer``, ``expected_outcome``,
``expected_messages``, ``output_messages``, ``guideline_files``, ``input_files``,
``input_messages``, ``trace_summary``, ``config``; plus ``trace_outline``, the trace as a
compact span tree within the token budget ``config.outline_tokens`` (evaluators/judge/outline.py),
and the raw ``inputs``, ``outputs`` and ``trace``; and for a session evaluation ``session``,
``session_transcript`` and ``session_outline`` (evaluators/judge/sessions.py), null otherwise).
It is the same for every runtime and for code evaluators that want the same view
(``from evaluators.judge.context import evaluation_context``).

:func:`template_variables` adds what ``{{...}}`` templates resolve: ``inputs`` (the whole dict),
every input column by its own name, ``outputs``, ``trace``, ``parameters``, and ``reference`` /
``correct_answer`` / ``ground_truth`` when the ground-truth column is present. A judge without a
ground-truth column is normal: those three names are then simply absent. The session names
exist only in a session evaluation, where ``trace`` is the last turn's trace.

Where the fields come from, first match wins:

- ``question``: the ``question``, ``input``, ``query`` or ``prompt`` column; else the last user
  message of ``input_messages``; else the one remaining column (ground truth aside); else the
  remaining columns as JSON.
- ``candidate_answer``: ``outputs`` when it is a string; the last assistant message when it is a
  list of messages; else ``outputs`` as JSON.
- ``reference_answer``: the ground-truth column (``correct_answer_key``), or null.
- ``input_messages``: a ``messages`` column; else the root span's ``inputs.messages``; else one
  user message holding ``question``.
- ``output_messages``: ``outputs`` when it is a list of messages (or ``{"messages": [...]}``);
  else one assistant message holding ``candidate_answer``.
- ``expected_outcome``, ``expected_messages``, ``guideline_files``, ``input_files``: the columns
  of those names (null, or an empty list).
- ``trace_summary``: null without a trace; else counts and totals from the root span (below).
"""

from __future__ import annotations

import json
from typing import Any

from evalsite.jsonpaths import dig
from evaluators.judge.outline import outline_budget, trace_outline
from evaluators.judge.sessions import SESSION_VARIABLES, session_fields

QUESTION_COLUMNS = ("question", "input", "query", "prompt")
REFERENCE_ALIASES = ("reference", "correct_answer", "ground_truth")
CONTEXT_FIELDS = (
    "question",
    "candidate_answer",
    "reference_answer",
    "expected_outcome",
    "expected_messages",
    "output_messages",
    "guideline_files",
    "input_files",
    "input_messages",
    "trace_summary",
    "trace_outline",
    "config",
)


def evaluation_context(
    *,
    inputs: dict[str, Any],
    outputs: Any,
    trace: dict[str, Any] | None,
    correct_answer_key: str = "correct_answer",
    config: dict[str, Any] | None = None,
    outline: bool = True,
    session: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The snake_case context of one evaluation (see the module docstring). ``outline=False``
    skips rendering ``trace_outline`` and ``session_outline`` (None) for a template that names
    neither. With a ``session``, ``trace`` is expected to be its last turn's."""
    inputs = inputs if isinstance(inputs, dict) else {}
    sessions = (
        session_fields(session, outline_budget(config), outline=outline)
        if session is not None
        else dict.fromkeys(SESSION_VARIABLES)
    )
    input_messages = _input_messages(inputs, trace)
    question = _question(inputs, correct_answer_key, input_messages)
    candidate = _candidate_answer(outputs)
    return {
        "question": question,
        "candidate_answer": candidate,
        "reference_answer": inputs.get(correct_answer_key),
        "expected_outcome": inputs.get("expected_outcome"),
        "expected_messages": _list(inputs.get("expected_messages")),
        "output_messages": _output_messages(outputs, candidate),
        "guideline_files": _list(inputs.get("guideline_files")),
        "input_files": _list(inputs.get("input_files")),
        "input_messages": input_messages or [{"role": "user", "content": question}],
        "trace_summary": trace_summary(trace),
        "trace_outline": trace_outline(trace, outline_budget(config)) if outline else None,
        "config": config or {},
        "inputs": inputs,
        "outputs": outputs,
        "trace": trace,
        **sessions,
    }


def template_variables(
    *,
    inputs: dict[str, Any],
    outputs: Any,
    trace: dict[str, Any] | None,
    correct_answer_key: str = "correct_answer",
    parameters: dict[str, Any] | None = None,
    outline: bool = True,
    session: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every name a prompt template may use. Context fields < input columns < core names.
    The session names are there only with a ``session``."""
    inputs = inputs if isinstance(inputs, dict) else {}
    context = evaluation_context(
        inputs=inputs,
        outputs=outputs,
        trace=trace,
        correct_answer_key=correct_answer_key,
        config=(parameters or {}).get("config"),
        outline=outline,
        session=session,
    )
    variables = {key: context[key] for key in CONTEXT_FIELDS}
    variables.update(inputs)
    variables.update(inputs=inputs, outputs=outputs, trace=trace, parameters=parameters or {})
    if session is not None:
        variables.update({key: context[key] for key in SESSION_VARIABLES})
    if correct_answer_key in inputs:
        variables.update(dict.fromkeys(REFERENCE_ALIASES, inputs[correct_answer_key]))
    return variables


def trace_summary(trace: dict[str, Any] | None) -> dict[str, Any] | None:
    """``span_count``, ``tool_names``, ``tool_calls_by_name``, ``error_count``, ``duration_ms``,
    ``token_usage`` ({prompt, completion, total}) and ``cost_usd`` of a contract-shaped trace."""
    if not isinstance(trace, dict) or not isinstance(trace.get("spans"), dict):
        return None
    spans = list(_walk(trace["spans"]))
    tools: dict[str, int] = {}
    for span in spans:
        if span.get("kind") == "tool":
            name = str(span.get("name") or "tool")
            tools[name] = tools.get(name, 0) + 1
    roots = [s for s in trace["spans"].values() if isinstance(s, dict)]
    root = roots[0] if roots else {}
    metrics = _metrics(root)
    unit = _object(metrics.get("unit"))
    acc = _object(metrics.get("acc")) or unit
    duration = dig(unit.get("duration") or acc.get("duration"), "total")
    return {
        "span_count": len(spans),
        "tool_names": sorted(tools),
        "tool_calls_by_name": tools,
        "error_count": sum(1 for s in spans if s.get("status") == "error"),
        "duration_ms": duration,
        "token_usage": acc.get("tokens") or None,
        "cost_usd": dig(acc, "costs.total"),
    }


def _walk(spans: Any):
    if not isinstance(spans, dict):  # a sender's odd shape: no children
        return
    for span in spans.values():
        if isinstance(span, dict):
            yield span
            yield from _walk(span.get("children"))


def _metrics(span: dict[str, Any]) -> dict[str, Any]:
    return _object(dig(span, "attributes.ag.metrics"))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _question(inputs: dict, correct_answer_key: str, input_messages: list) -> Any:
    for column in QUESTION_COLUMNS:
        if column in inputs:
            return inputs[column]
    for message in reversed(input_messages):
        if message.get("role") == "user":
            return message.get("content")
    rest = {k: v for k, v in inputs.items() if k != correct_answer_key}
    if len(rest) == 1:
        return next(iter(rest.values()))
    return json.dumps(rest, ensure_ascii=False) if rest else ""


def _candidate_answer(outputs: Any) -> str:
    if isinstance(outputs, str):
        return outputs
    messages = _messages(outputs)
    for message in reversed(messages or []):
        if message.get("role") == "assistant" and isinstance(message.get("content"), str):
            return message["content"]
    return json.dumps(outputs, ensure_ascii=False)


def _input_messages(inputs: dict, trace: dict | None) -> list[dict]:
    found = _messages(inputs.get("messages"))
    if found:
        return found
    if isinstance(trace, dict) and isinstance(trace.get("spans"), dict):
        for root in trace["spans"].values():
            found = _messages(dig(root, "attributes.ag.data.inputs"))
            if found:
                return found
    return []


def _output_messages(outputs: Any, candidate: str) -> list[dict]:
    return _messages(outputs) or [{"role": "assistant", "content": candidate}]


def _messages(value: Any) -> list[dict] | None:
    if isinstance(value, dict):
        value = value.get("messages")
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and "role" in m for m in value)
    ):
        return value
    return None


def _list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]
