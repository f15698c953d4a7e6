"""Judging a batch: prompts, concurrent model calls, answers read back, one trace per cell.

``judge_many(parameters, items, context)`` is the ``llm_judge`` kind's ``evaluate_many``, and
``judge_sessions`` its ``evaluate_sessions`` (items carry a session; ``trace`` is then the last
turn's and the prompt may read the session variables, evaluators/judge/sessions.py). The
database is touched only from the calling thread (loading the connection, writing traces, marking
the connection); worker threads render prompts, run prompt scripts and call the model.

``context`` (from the caller): ``project`` (required), ``revision`` (names the traces),
``run_id`` or ``rule_id`` (the scope of the spend cap; without either, the batch is the scope),
``max_cost_usd`` (a cap the work carries, a run's: the lower of it and the judge's own holds).

Each ``Raw.details`` holds ``rendered_prompt`` (the messages sent), ``judge_trace_id`` (the pk of
the ``runs.Trace`` recording the calls; link it as ``Annotation.judge_trace``), ``model``,
``connection``, ``tokens``, ``cost_usd``, ``attempts`` and ``answer`` (the model's raw text).
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from django.db import transaction

from evaluators.crypto import UndecryptableKey
from evaluators.judge import scores
from evaluators.judge.client import Caller, Shared, Usage
from evaluators.judge.conf import setting
from evaluators.judge.connections import address_problem
from evaluators.judge.context import template_variables
from evaluators.judge.scripts import script_prompt
from evaluators.judge.sessions import last_trace
from evaluators.judge.shots import shot_messages, with_shots
from evaluators.judge.templates import render_all
from evaluators.judge.traces import TRACE_RECORDERS
from evaluators.models import ModelConnection
from evaluators.normalize import EvaluationError, Raw

log = logging.getLogger("evaluators.judge")
RECORD_GROUP = 50

REPAIR = (
    "Your answer could not be used: {reason}. Reply again with only the JSON object, matching "
    "the schema, and nothing else."
)


@dataclass
class Outcome:
    """One cell: the outputs or the error, and what it took."""

    started: datetime
    duration_ms: float = 0.0
    outputs: dict[str, Any] | None = None
    error: EvaluationError | None = None
    messages: list[dict[str, str]] | None = None
    answer: str = ""
    usage: Usage = field(default_factory=Usage)


def judge_many(parameters, items: list[tuple], context: dict[str, Any]) -> list[Raw]:
    cap = spend_cap(parameters, context)
    try:
        project, connection, model = _setup(parameters, context, cap)
        shared = Shared(connection, spend_scope=_spend_scope(context), max_cost_usd=cap)
    except (EvaluationError, UndecryptableKey) as exc:
        error = (
            exc if isinstance(exc, EvaluationError) else EvaluationError(str(exc), code="no_key")
        )
        return [Raw(error=error) for _ in items]
    trace_name = f"judge {getattr(context.get('revision'), 'slug', '') or 'llm_judge'}"
    raws: list[Raw | None] = [None] * len(items)
    done: list[tuple[int, Outcome]] = []
    judged = 0

    def flush() -> None:
        # One commit per group of traces, not per trace (a commit waits for the disk), and no
        # transaction open while waiting for the model.
        with transaction.atomic():
            for index, outcome in done:
                raws[index] = _raw(outcome, project, trace_name, model, connection)
        done.clear()

    for index, outcome in _outcomes(parameters, shared, model, items):
        done.append((index, outcome))
        judged += outcome.outputs is not None
        if len(done) >= RECORD_GROUP:
            flush()
    flush()
    if shared.refused.is_set():
        connection.mark_failing(shared.refusal)
    elif judged:
        connection.mark_healthy()
    return raws  # type: ignore[return-value]  # every slot is filled


def judge_sessions(parameters, items: list[tuple], context: dict[str, Any]) -> list[Raw]:
    """Judge (inputs, outputs, session) items: each prompt reads the session, and ``trace``
    stands for its last turn's trace."""
    return judge_many(
        parameters,
        [(inputs, outputs, last_trace(session), session) for inputs, outputs, session in items],
        context,
    )


def structured_call(
    *,
    project,
    connection: str,
    messages: list[dict[str, str]],
    schema: dict[str, Any],
    name: str = "answer",
    model: str = "",
    max_retries: int = 4,
    temperature: float = 0.0,
) -> dict[str, Any]:
    """One model call whose answer must match ``schema``, for kinds that consult a model (agent
    scoring): the connection's shared rate limiter, retries and Retry-After, structured output
    with one repair request, and a judge trace, exactly as for the ``llm_judge`` kind.

    Returns the answer object; raises ``EvaluationError`` (``no_connection``, ``rate_limited``,
    ``connection_auth_failed``, ``invalid_judge_answer`` ...).
    """
    settings = SimpleNamespace(connection=connection, model=model, max_cost_usd=None)
    project, connection_obj, model = _setup(settings, {"project": project}, None)
    try:
        shared = Shared(connection_obj, spend_scope="call", max_cost_usd=None)
    except UndecryptableKey as exc:
        raise EvaluationError(str(exc), code="no_key")
    options = {
        "temperature": temperature,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        },
    }
    caller = Caller(shared, model=model, max_retries=max_retries, **options)
    outcome = Outcome(started=datetime.now(UTC), messages=messages, usage=caller.usage)
    clock = time.perf_counter()
    try:
        reply = caller.chat(messages)
        outcome.answer = reply.content
        try:
            answer = scores.parse_object(reply.content, schema)
        except scores.BadAnswer as bad:
            repair = [
                *messages,
                {"role": "assistant", "content": reply.content},
                {"role": "user", "content": REPAIR.format(reason=bad)},
            ]
            reply = caller.chat(repair)
            outcome.answer = reply.content
            answer = _parse_repaired(reply.content, lambda text: scores.parse_object(text, schema))
        outcome.outputs = answer
    except EvaluationError as exc:
        outcome.error = exc
    outcome.duration_ms = round((time.perf_counter() - clock) * 1000, 3)
    if outcome.usage.attempts:
        _record(outcome, project, f"judge {name}", model, connection_obj.price_of(model))
    if shared.refused.is_set():
        connection_obj.mark_failing(shared.refusal)
    if outcome.error is not None:
        raise outcome.error
    return outcome.outputs


def judge_preview(
    parameters, inputs: dict, outputs: Any, trace: dict | None, session: dict | None = None
) -> list[dict]:
    """The messages the model would receive for one evaluation, without calling it. With a
    ``session``, ``trace`` is its last turn's whatever was given."""
    if session is not None:
        trace = last_trace(session)
    return build_messages(parameters, inputs, outputs, trace, session)


def spend_cap(parameters, context: dict[str, Any]) -> float | None:
    """The lower of the judge's own ``max_cost_usd`` and the one its work carries (a run's cap:
    its own or its project's), both counted on the run's spend counter."""
    caps = [c for c in (parameters.max_cost_usd, context.get("max_cost_usd")) if c is not None]
    return min(caps) if caps else None


def _setup(parameters, context: dict, cap: float | None):
    project = context.get("project")
    if project is None:
        raise EvaluationError("An LLM judge runs within a project.", code="no_connection")
    connection = ModelConnection.objects.for_project(project).by_ref(parameters.connection).first()
    if connection is None:
        raise EvaluationError(
            f"No model connection {parameters.connection!r} in this project; add it on the "
            f"Connections page or pick another one.",
            code="no_connection",
        )
    model = parameters.model or (connection.model_names or [""])[0]
    if not model:
        raise EvaluationError(
            f"Name a model: the connection {connection.slug!r} lists none.", code="no_model"
        )
    if connection.model_names and model not in connection.model_names:
        raise EvaluationError(
            f"The connection {connection.slug!r} has no model {model!r}; it has "
            f"{', '.join(connection.model_names)}.",
            code="unknown_model",
        )
    if cap is not None and connection.price_of(model) is None:
        raise EvaluationError(
            f"A spend cap (max_cost_usd) needs the price of {model!r}: add it to the price "
            f"table of the connection {connection.slug!r}.",
            code="no_price",
        )
    problem = address_problem(connection.base_url)
    if problem:
        raise EvaluationError(problem, code="connection_address_refused")
    return project, connection, model


def _spend_scope(context: dict) -> str:
    if context.get("run_id"):
        return f"run:{context['run_id']}"
    if context.get("rule_id"):
        return f"rule:{context['rule_id']}"
    return f"batch:{uuid.uuid4().hex}"


def _outcomes(parameters, shared: Shared, model: str, items: list[tuple]):
    """(index, Outcome) pairs as cells finish; concurrent when there is more than one."""
    if len(items) == 1:
        yield 0, judge_one(parameters, shared, model, items[0])
        return
    workers = max(1, min(int(setting("EVALSITE_JUDGE_CONCURRENCY")), len(items)))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge")
    try:
        futures = {
            pool.submit(judge_one, parameters, shared, model, item): index
            for index, item in enumerate(items)
        }
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        # On a task time limit, do not start the calls still queued nor wait for the ones running.
        pool.shutdown(wait=False, cancel_futures=True)


def judge_one(parameters, shared: Shared, model: str, item: tuple) -> Outcome:
    """Render, call, read back (with one repair request); never raises. ``item`` is
    (inputs, outputs, trace), or (inputs, outputs, last trace, session) for a session."""
    inputs, outputs, trace, *rest = item
    session = rest[0] if rest else None
    outcome = Outcome(started=datetime.now(UTC))
    clock = time.perf_counter()
    caller = Caller(shared, model=model, max_retries=parameters.max_retries, **_options(parameters))
    outcome.usage = caller.usage
    try:
        outcome.messages = build_messages(parameters, inputs, outputs, trace, session)
        reply = caller.chat(outcome.messages)
        outcome.answer = reply.content
        try:
            outcome.outputs = scores.parse(reply.content, parameters)
        except scores.BadAnswer as bad:
            repair = [
                *outcome.messages,
                {"role": "assistant", "content": reply.content},
                {"role": "user", "content": REPAIR.format(reason=bad)},
            ]
            reply = caller.chat(repair)
            outcome.answer = reply.content
            outcome.outputs = _parse_repaired(
                reply.content, lambda text: scores.parse(text, parameters)
            )
    except EvaluationError as exc:
        outcome.error = exc
    except Exception as exc:  # a bug here must cost one cell, not the batch
        log.exception("llm judge cell failed")
        outcome.error = EvaluationError(f"{type(exc).__name__}: {exc}", code="judge_exception")
    outcome.duration_ms = round((time.perf_counter() - clock) * 1000, 3)
    return outcome


def _parse_repaired(text: str, parse) -> dict[str, Any]:
    try:
        return parse(text)
    except scores.BadAnswer as bad:
        raise EvaluationError(
            f"The model's answer could not be used, even after one repair request: {bad}. "
            f"Its answer: {text[:300]!r}",
            code="invalid_judge_answer",
        )


def build_messages(
    parameters, inputs: dict, outputs: Any, trace: dict | None, session: dict | None = None
) -> list[dict]:
    if parameters.prompt_source == "script":
        prompt = script_prompt(parameters, inputs, outputs, trace, session)
        messages = [{"role": "user", "content": prompt}]
    else:
        variables = template_variables(
            inputs=inputs,
            outputs=outputs,
            trace=trace,
            correct_answer_key=parameters.correct_answer_key,
            parameters=parameters.model_dump(
                mode="json", exclude={"messages", "script", "few_shot"}
            ),
            outline=any(
                name in m.content
                for m in parameters.messages
                for name in ("trace_outline", "session_outline")
            ),
            session=session,
        )
        texts = render_all(
            [m.content for m in parameters.messages], variables, format=parameters.template_format
        )
        messages = [
            {"role": m.role, "content": text}
            for m, text in zip(parameters.messages, texts, strict=True)
        ]
    if parameters.format_instructions:
        messages = _with_instructions(messages, scores.instructions(parameters))
    # Examples are data: they join the rendered messages, never the templates.
    return with_shots(messages, shot_messages(parameters))


def _with_instructions(messages: list[dict], instructions: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{instructions}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]


def _options(parameters) -> dict[str, Any]:
    options: dict[str, Any] = {"temperature": parameters.temperature}
    if parameters.max_tokens is not None:
        options["max_tokens"] = parameters.max_tokens
    if parameters.structured_output:
        options["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": "judgement",
                "schema": scores.answer_schema(parameters),
                "strict": True,
            },
        }
    return options


# --- recording --------------------------------------------------------------------------------


def _raw(outcome: Outcome, project, name: str, model: str, connection) -> Raw:
    usage = outcome.usage
    details: dict[str, Any] = {
        "rendered_prompt": outcome.messages,
        "model": model,
        "connection": connection.slug,
        "attempts": len(usage.attempts),
    }
    if usage.attempts:
        details["tokens"] = _tokens(usage)
        details["cost_usd"] = usage.cost_usd
        details["answer"] = outcome.answer
        trace_id = _record(outcome, project, name, model, connection.price_of(model))
        if trace_id is not None:
            details["judge_trace_id"] = trace_id
    if outcome.error is not None:
        return Raw(error=outcome.error, duration_ms=outcome.duration_ms, details=details)
    return Raw(value=outcome.outputs, duration_ms=outcome.duration_ms, details=details)


def _tokens(usage: Usage) -> dict[str, int]:
    return {
        "prompt": usage.prompt_tokens,
        "completion": usage.completion_tokens,
        "total": usage.prompt_tokens + usage.completion_tokens,
    }


def _record(outcome: Outcome, project, name: str, model: str, price: dict | None) -> int | None:
    """The judge trace: the root is the whole cell, one child per HTTP request. Stored through
    the recorder the runs app registers (``traces.TRACE_RECORDERS``: evaluators never imports
    runs); with none registered, the evaluation simply has no trace."""
    if not TRACE_RECORDERS:
        return None
    trace_record = TRACE_RECORDERS[0]
    usage = outcome.usage
    error = outcome.error.as_dict() if outcome.error is not None else None
    try:
        with transaction.atomic():  # a savepoint: one bad trace must not undo its group
            trace = trace_record(
                project=project,
                name=name,
                inputs={"model": model, "messages": outcome.messages},
                outputs={"answer": outcome.answer, "outputs": outcome.outputs},
                duration_ms=outcome.duration_ms,
                start_time=outcome.started,
                error=error,
                kind="llm",
                source="judge",
                # Tokens and costs sit on the requests; the root adds them up (metrics.acc).
                children=[_attempt_span(a, model, price) for a in usage.attempts],
            )
    except Exception:  # the evaluation stands even when its trace cannot be stored
        log.exception("could not record the judge trace")
        return None
    return trace.pk


def _attempt_span(attempt, model: str, price: dict | None) -> dict[str, Any]:
    status = "ok" if attempt.status is not None and attempt.status < 400 else "error"
    unit: dict[str, Any] = {
        "duration": {"total": attempt.duration_ms},
        "tokens": {
            "prompt": attempt.prompt_tokens,
            "completion": attempt.completion_tokens,
            "total": attempt.prompt_tokens + attempt.completion_tokens,
        },
    }
    if price is not None:
        prompt = attempt.prompt_tokens * float(price.get("prompt", 0)) / 1_000_000
        completion = attempt.completion_tokens * float(price.get("completion", 0)) / 1_000_000
        unit["costs"] = {"prompt": prompt, "completion": completion, "total": prompt + completion}
    return {
        "name": "chat.completions",
        "kind": "llm",
        "start_time": attempt.started.isoformat(),
        "end_time": (attempt.started + timedelta(milliseconds=attempt.duration_ms)).isoformat(),
        "status": status,
        "status_message": attempt.error,
        "attributes": {
            "ag": {
                "metrics": {"unit": unit},
                "meta": {"http_status": attempt.status, "rate_limit_wait_ms": attempt.waited_ms},
            },
            "gen_ai.request.model": model,
        },
    }
