"""Sessions: the traces that share a session id, in time order (DOMAIN.md).

A trace's session comes from its spans (``ag.meta.session_id``, set at ingest from the native
``session_id`` field, ``session.id`` or ``gen_ai.conversation.id``). The ``Session`` row sums its
traces up for lists and for idle-time rules. A trace stored for the first time is added to it
(one statement reading that trace only, whatever the session's size); a trace stored again,
moved to another session or removed has its sessions recomputed from all their traces. A lock
per session held to commit makes two ingests touching one session leave it right whatever
their order. ``session_dict`` is what session evaluators receive: the traces and the
conversation assembled from their root inputs and outputs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.db.models import BigIntegerField, Func, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from evalsite.models import Project
from runs.models import Session, Trace
from runs.traces.reads import trace_dicts, trace_roots, trace_spans

# updated_at is the session's arrival time for idle rules: clock_timestamp(), taken as the
# ingest ends (this statement runs last in it), not now(), the start of a transaction that may
# have run for longer than a rule's idle time. "session_id <> ''" says what the ids do, so that
# the prepared statement's generic plan can use the partial trace_session index.
REFRESH_SQL = """
INSERT INTO runs_session AS s (
    project_id, session_id, trace_count, start_time, last_activity, duration_ms, status,
    tokens, cost, created_at, updated_at
)
SELECT project_id, session_id, count(*), min(start_time),
       max(coalesce(end_time, start_time)),
       extract(epoch FROM max(coalesce(end_time, start_time)) - min(start_time)) * 1000,
       CASE WHEN bool_or(status = 'error') THEN 'error' ELSE 'ok' END,
       sum(tokens), sum(cost), now(), clock_timestamp()
FROM runs_trace
WHERE project_id = %s AND session_id = ANY(%s) AND session_id <> ''
GROUP BY project_id, session_id
ON CONFLICT (project_id, session_id) DO UPDATE SET
    trace_count = EXCLUDED.trace_count, start_time = EXCLUDED.start_time,
    last_activity = EXCLUDED.last_activity, duration_ms = EXCLUDED.duration_ms,
    status = EXCLUDED.status, tokens = EXCLUDED.tokens, cost = EXCLUDED.cost,
    updated_at = CASE WHEN %s THEN EXCLUDED.updated_at ELSE s.updated_at END
"""

# Where a turn's words are, in order, when a root span's inputs or outputs are an object.
TEXT_KEYS = (
    "content", "message", "question", "query", "input", "prompt", "text", "user_input",
    "answer", "output", "response", "result",
)  # fmt: skip


LOCK_SQL = """
SELECT count(pg_advisory_xact_lock(hashtextextended(%s::text || ':' || u.id, 1397052243)))
FROM (SELECT id FROM unnest(%s::text[]) AS id ORDER BY id) u
"""


# The traces an ingest inserted, added to their sessions: the same sums as REFRESH_SQL, over
# those traces only, combined with the row's (LEAST/GREATEST skip NULLs, as min/max do). The
# sessions' locks (LOCK_SQL) are taken in the same statement, before any session row: the
# count() in the MATERIALIZED CTE takes every lock before it yields its one row, and every row
# the INSERT reads is joined to that row.
ADD_SQL = """
WITH locked AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock(hashtextextended(%(project)s::text || ':' || u.id, 1397052243)))
    FROM (SELECT id FROM unnest(%(sessions)s::text[]) AS id ORDER BY id) u
)
INSERT INTO runs_session AS s (
    project_id, session_id, trace_count, start_time, last_activity, duration_ms, status,
    tokens, cost, created_at, updated_at
)
SELECT project_id, session_id, count(*), min(start_time),
       max(coalesce(end_time, start_time)),
       extract(epoch FROM max(coalesce(end_time, start_time)) - min(start_time)) * 1000,
       CASE WHEN bool_or(status = 'error') THEN 'error' ELSE 'ok' END,
       sum(tokens), sum(cost), now(), clock_timestamp()
FROM runs_trace CROSS JOIN locked
WHERE project_id = %(project)s AND id = ANY(%(traces)s::bigint[]) AND session_id <> ''
GROUP BY project_id, session_id
ON CONFLICT (project_id, session_id) DO UPDATE SET
    trace_count = s.trace_count + EXCLUDED.trace_count,
    start_time = LEAST(s.start_time, EXCLUDED.start_time),
    last_activity = GREATEST(s.last_activity, EXCLUDED.last_activity),
    duration_ms = extract(epoch FROM GREATEST(s.last_activity, EXCLUDED.last_activity)
                                     - LEAST(s.start_time, EXCLUDED.start_time)) * 1000,
    status = CASE WHEN s.status = 'error' OR EXCLUDED.status = 'error' THEN 'error' ELSE 'ok' END,
    tokens = CASE WHEN s.tokens IS NULL THEN EXCLUDED.tokens
                  WHEN EXCLUDED.tokens IS NULL THEN s.tokens
                  ELSE s.tokens + EXCLUDED.tokens END,
    cost = CASE WHEN s.cost IS NULL THEN EXCLUDED.cost
                WHEN EXCLUDED.cost IS NULL THEN s.cost
                ELSE s.cost + EXCLUDED.cost END,
    updated_at = EXCLUDED.updated_at
"""


def sessions_refresh(
    project_id: int,
    session_ids: Iterable[str],
    *,
    touch: bool = True,
    added: Iterable[tuple[int, str]] = (),
) -> None:
    """Bring a project's sessions up to date: ``session_ids`` recomputed from all their traces
    (traces stored again, moved or removed), and the sessions of ``added`` traces, (primary
    key, session id) pairs this transaction inserted, counted in by adding those traces alone:
    an ingest into a session of 50,000 traces costs what one into a session of five does.

    ``updated_at`` is when something of the session last arrived: session rules judge a session
    once it stopped moving. Removing traces (retention) passes ``touch=False`` to keep it."""
    recount = sorted({sid for sid in session_ids if sid})
    skip = set(recount)  # recomputed: they would count the added traces twice
    new = [pk for pk, sid in added if sid and sid not in skip]
    ids = sorted(skip | {sid for _, sid in added if sid})
    if not ids:
        return
    with prepared_cursor() as cursor:
        # Two ingests into one session would each count the traces they see, and the second to
        # commit would overwrite the first's turn. A lock per session, held to commit and taken
        # in one order, makes the second wait; its statements then start after the first's
        # commit and count both. An ingest of new traces only (most) takes them as it adds.
        if recount:
            cursor.execute(LOCK_SQL, [project_id, ids])
        if new:
            cursor.execute(ADD_SQL, {"project": project_id, "sessions": ids, "traces": new})
        if recount:
            cursor.execute(REFRESH_SQL, [project_id, recount, touch])


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """A cursor whose statements PostgreSQL prepares once per connection, their parameters bound
    apart (Django's cursors write them into the SQL): planning the ingest's statements cost
    about as much again as running them. For statements run often, whose plan does not hang on
    their values. Django turns psycopg's preparing off (``prepare_threshold`` None, for
    transaction-mode poolers); it stays off for every other statement (a threshold nothing
    reaches), and these are prepared because they ask."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    if connection.connection.prepare_threshold is None:
        connection.connection.prepare_threshold = sys.maxsize
    cursor = _PreparingCursor(connection.connection)
    logged = connection.queries_logged
    wrapper = connection.make_debug_cursor(cursor) if logged else connection.make_cursor(cursor)
    with wrapper:
        yield wrapper


class _PreparingCursor(psycopg.Cursor):
    def execute(self, query, params=None, *, prepare=True, binary=None):
        return super().execute(query, params, prepare=prepare, binary=binary)

    def _send_query_prepared(self, name, pgq, *, binary=None):
        # Django's query log reads the statement off _query, which psycopg sets only for a
        # statement it runs unprepared.
        self._query = pgq
        super()._send_query_prepared(name, pgq, binary=binary)


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


# --- reads for the session pages and API ------------------------------------------------------

TURNS_PER_PAGE = 200
# Spans of the trace trees drawn inline on one page of turns (about 1.7 KB of HTML each); the
# later turns load theirs from the trace page when opened.
TREE_SPAN_BUDGET = 300
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Cursor = tuple[datetime | None, int]


@dataclass
class Turn:
    """One trace of a session page: its messages and, while the page's budget lasts, its tree."""

    trace: Trace
    messages: list[dict[str, Any]]
    tree: dict[str, Any] | None
    error: str = ""  # the root span's status message when it failed


def session_get(
    *, project: Project, session_id: str | None = None, pk: int | None = None
) -> Session | None:
    """One session of the project, by its id (the API) or by its pk (the pages: a session id is
    the client's free text, and one holding a newline or a ``..`` segment cannot be a URL path)."""
    sessions = Session.objects.for_project(project)
    found = sessions.filter(pk=pk) if pk is not None else sessions.filter(session_id=session_id)
    return found.first()


def session_pks(*, project: Project, session_ids: Iterable[str]) -> dict[str, int]:
    """The pk of each of these sessions of the project (one query), for the pages that link to
    sessions from their traces."""
    ids = {sid for sid in session_ids if sid}
    if not ids:
        return {}
    found = Session.objects.for_project(project).filter(session_id__in=ids)
    return dict(found.values_list("session_id", "pk"))


def session_list(
    *,
    project: Project,
    search: str = "",
    session_id: str | None = None,
    status: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    min_traces: int | None = None,
    before: Cursor | None = None,
) -> QuerySet[Session]:
    """Sessions of the project, most recently active first: ``search`` in the session id,
    exactly ``session_id``, ``status``, ``since`` / ``until`` on the last activity, at least
    ``min_traces`` traces.

    ``before`` (from ``session_cursor_parse``) keeps the sessions after that one in this order:
    keyset pages, so sessions that grow move to the top instead of shifting every page.
    """
    sessions = Session.objects.for_project(project)
    if search:
        sessions = sessions.filter(session_id__icontains=search)
    if session_id is not None:
        sessions = sessions.filter(session_id=session_id)
    if status:
        sessions = sessions.filter(status=status)
    if since:
        sessions = sessions.filter(last_activity__gte=since)
    if until:
        sessions = sessions.filter(last_activity__lt=until)
    if min_traces:
        sessions = sessions.filter(trace_count__gte=min_traces)
    if before is not None:
        sessions = sessions.filter(_after(before))
    # PostgreSQL sorts NULLs first in DESC, as the (project, -last_activity) index does.
    return sessions.order_by("-last_activity", "-id")


def _after(cursor: Cursor) -> Q:
    moment, pk = cursor
    if moment is None:  # only a session of traces without times has none; they come first
        return Q(last_activity__isnull=True, pk__lt=pk) | Q(last_activity__isnull=False)
    return Q(last_activity__lt=moment) | Q(last_activity=moment, pk__lt=pk)


def session_cursor(session: Session) -> str:
    """Where a page of ``session_list`` ends: ``<microseconds since 1970>_<id>``."""
    moment = session.last_activity
    micros = "none" if moment is None else str((moment - EPOCH) // timedelta(microseconds=1))
    return f"{micros}_{session.pk}"


def session_cursor_parse(text: str) -> Cursor | None:
    """The cursor ``session_cursor`` wrote, or None when ``text`` is not one."""
    micros, _, pk = text.partition("_")
    try:
        moment = None if micros == "none" else EPOCH + timedelta(microseconds=int(micros))
        return (moment, int(pk)) if int(pk) > 0 else None
    except (ValueError, OverflowError):
        return None


def session_turns(
    session: Session,
    *,
    page: int | str = 1,
    size: int = TURNS_PER_PAGE,
    span_budget: int = TREE_SPAN_BUDGET,
) -> tuple[Page, list[Turn]]:
    """One page of the session's traces in time order, each as a ``Turn``: the messages it adds
    (``turn_messages``) and its contract dict while the page's trees stay within
    ``span_budget`` spans. Four queries at most, whatever the session's size."""
    found = Paginator(_traces_of(session).order_by("start_time", "id"), size).get_page(page)
    drawn, spans = [], 0
    for trace in found.object_list:
        if spans + trace.span_count > span_budget:
            break
        drawn.append(trace)
        spans += trace.span_count
    trees = trace_dicts(drawn)
    roots = _root_dicts([trace for trace in found.object_list if trace.pk not in trees])
    turns = []
    for trace in found.object_list:
        tree = trees.get(trace.pk)
        contract = tree or roots[trace.pk]
        turns.append(Turn(trace, turn_messages(contract), tree, _root_error(contract)))
    return found, turns


def session_overview(session: Session, *, limit: int) -> tuple[list[Trace], list[dict[str, Any]]]:
    """The session's first ``limit`` traces in time order and the conversation their root spans
    hold (as ``messages`` assembles it), reading root spans only."""
    traces = list(_traces_of(session).order_by("start_time", "id")[:limit])
    roots = _root_dicts(traces)
    return traces, messages([roots[trace.pk] for trace in traces])


def session_traces_until(
    session: Session, *, activity: datetime, count: int | None = None
) -> list[Trace]:
    """The session as it stood when its activity was ``activity`` (a session rule's judged
    ``last_activity``): its traces that ended (or, without an end, started) by then, in time
    order, the first ``count`` of them. Turns that came later are left out, and so is nothing
    else when some of the judged ones were deleted since (retention)."""
    ended = Coalesce("end_time", "start_time")
    traces = (
        _traces_of(session)
        .alias(ended=ended)
        .filter(Q(ended__lte=activity) | Q(ended__isnull=True))
        .order_by("start_time", "id")
    )
    return list(traces if count is None else traces[:count])


def spans_stored_bytes(traces: list[Trace]) -> int:
    """The size of these traces' span attributes as PostgreSQL stores them (compressed: the
    JSON is larger), in one query that reads no attribute: bounds a whole-session read before it
    loads anything."""
    size = Func("attributes", function="pg_column_size", output_field=BigIntegerField())
    return trace_spans(traces).aggregate(total=Sum(size))["total"] or 0


def session_span_count(session: Session) -> int:
    """How many spans ``session_dict`` would load."""
    return _traces_of(session).aggregate(spans=Sum("span_count"))["spans"] or 0


def turn_messages(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages one trace adds to its conversation, read on its own (a turn of the session
    page): its inputs as a user message, or, when they carry a chat history, the messages after
    its last assistant message; then its answer, as ``messages`` reads it."""
    data = _root_data(trace)
    inputs, outputs = data.get("inputs"), data.get("outputs")
    said: list[dict[str, Any]] = []
    sent = _chat(inputs)
    if sent is not None:
        answered = [i for i, message in enumerate(sent) if message.get("role") == "assistant"]
        said.extend(sent[answered[-1] + 1 :] if answered else sent)
    elif inputs is not None:
        said.append({"role": "user", "content": _text(inputs)})
    returned = _chat(outputs)
    if returned is not None:
        said.extend(message for message in returned if message.get("role") != "user")
    elif outputs is not None:
        said.append({"role": "assistant", "content": _text(outputs)})
    return said


def _root_error(trace: dict[str, Any]) -> str:
    roots = list((trace.get("spans") or {}).values())
    if roots and roots[0].get("status") == "error":
        return roots[0].get("status_message") or "failed"
    return ""


def _traces_of(session: Session) -> QuerySet[Trace]:
    return Trace.objects.filter(project_id=session.project_id, session_id=session.session_id)


def _root_dicts(traces: list[Trace]) -> dict[int, dict[str, Any]]:
    """Each trace as a contract dict holding its root span only, and of that span only what the
    messages read (its status and ``ag.data`` inputs and outputs, picked out in PostgreSQL)."""
    roots = trace_roots(traces, "inputs", "outputs")
    return {trace.pk: _root_dict(trace, roots.get(trace.pk)) for trace in traces}


def _root_dict(trace: Trace, root: dict[str, Any] | None) -> dict[str, Any]:
    if root is None:
        return {"trace_id": trace.trace_id, "spans": {}}
    data = {key: root[key] for key in ("inputs", "outputs") if root[key] is not None}
    span = {
        "status": root["status"],
        "status_message": root["status_message"] or None,
        "attributes": {"ag": {"data": data}},
    }
    return {"trace_id": trace.trace_id, "spans": {root["span_id"]: span}}
