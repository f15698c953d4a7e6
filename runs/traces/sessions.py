"""Sessions: the traces that share a session id, in time order (DOMAIN.md).

A trace's session comes from its spans (``ag.meta.session_id``, set at ingest from the native
``session_id`` field, ``session.id`` or ``gen_ai.conversation.id``). The ``Session`` row sums its
traces up for lists and for idle-time rules; it is recomputed from the traces in one statement
whenever one of them is stored, so two ingests touching one session leave it right whatever
their order. ``session_dict`` is what session evaluators receive: the traces and the
conversation assembled from their root inputs and outputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import connection

from runs.models import Session, Trace
from runs.traces.reads import trace_dicts

REFRESH_SQL = """
INSERT INTO runs_session AS s (
    project_id, session_id, trace_count, start_time, last_activity, duration_ms, status,
    tokens, cost, created_at, updated_at
)
SELECT project_id, session_id, count(*), min(start_time),
       max(coalesce(end_time, start_time)),
       extract(epoch FROM max(coalesce(end_time, start_time)) - min(start_time)) * 1000,
       CASE WHEN bool_or(status = 'error') THEN 'error' ELSE 'ok' END,
       sum(tokens), sum(cost), now(), now()
FROM runs_trace
WHERE project_id = %s AND session_id = ANY(%s)
GROUP BY project_id, session_id
ON CONFLICT (project_id, session_id) DO UPDATE SET
    trace_count = EXCLUDED.trace_count, start_time = EXCLUDED.start_time,
    last_activity = EXCLUDED.last_activity, duration_ms = EXCLUDED.duration_ms,
    status = EXCLUDED.status, tokens = EXCLUDED.tokens, cost = EXCLUDED.cost,
    updated_at = EXCLUDED.updated_at
"""

# Where a turn's words are, in order, when a root span's inputs or outputs are an object.
TEXT_KEYS = (
    "content", "message", "question", "query", "input", "prompt", "text", "user_input",
    "answer", "output", "response", "result",
)  # fmt: skip


def sessions_refresh(project_id: int, session_ids: Iterable[str]) -> None:
    """Recompute the named sessions of a project from their traces (one statement)."""
    ids = sorted({sid for sid in session_ids if sid})
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(REFRESH_SQL, [project_id, ids])


def session_traces(session: Session) -> list[Trace]:
    """The session's traces in time order (oldest first)."""
    return list(
        Trace.objects.filter(project_id=session.project_id, session_id=session.session_id).order_by(
            "start_time", "id"
        )
    )


def session_dict(session: Session, traces: list[Trace] | None = None) -> dict[str, Any]:
    """The session as evaluators receive it: ``{"session_id", "traces", "messages"}``."""
    traces = session_traces(session) if traces is None else traces
    dicts = trace_dicts(traces)
    ordered = [dicts[trace.pk] for trace in traces]
    return {"session_id": session.session_id, "traces": ordered, "messages": messages(ordered)}


def messages(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation, OpenAI-style, from each trace's root inputs and outputs.

    A turn whose inputs carry ``messages`` (a chat history re-sent each turn) adds only the
    messages the conversation does not have yet; otherwise its inputs are one user message.
    Its outputs are one assistant message (or the messages it returns).
    """
    history: list[dict[str, Any]] = []
    for trace in traces:
        data = _root_data(trace)
        inputs, outputs = data.get("inputs"), data.get("outputs")
        sent = _chat(inputs)
        if sent is not None:
            history.extend(sent[len(history) :] if sent[: len(history)] == history else sent[-1:])
        elif inputs is not None:
            history.append({"role": "user", "content": _text(inputs)})
        returned = _chat(outputs)
        if returned is not None:
            history.extend(message for message in returned if message.get("role") != "user")
        elif outputs is not None:
            history.append({"role": "assistant", "content": _text(outputs)})
    return history


def first_user_turn(session: dict[str, Any]) -> Any:
    """The inputs of the session's first trace: where a replayed conversation starts."""
    traces = session.get("traces") or []
    return _root_data(traces[0]).get("inputs") if traces else None


def _root_data(trace: dict[str, Any]) -> dict[str, Any]:
    roots = list((trace.get("spans") or {}).values())
    data = roots[0].get("attributes", {}).get("ag", {}).get("data") if roots else None
    return data if isinstance(data, dict) else {}


def _chat(value: Any) -> list[dict[str, Any]] | None:
    found = value.get("messages") if isinstance(value, dict) else value
    if (
        isinstance(found, list)
        and found
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in found)
    ):
        return [dict(m) for m in found]
    return None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
        for key in TEXT_KEYS:
            if isinstance(value.get(key), str):
                return value[key]
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
