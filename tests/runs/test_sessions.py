"""Sessions: the reads (list, keyset pages, turns), the pages (full and HTMX), the API, project
isolation, and a conversation sent through the real OpenTelemetry SDK exporter."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from django.db import connection, transaction

from evalsite.models import Role
from evalsite.services import api_key_create
from runs.api import sessions as api_sessions
from runs.models import Session, Trace
from runs.traces import trace_ingest
from runs.traces.sessions import (
    ADD_SQL,
    session_cursor,
    session_cursor_parse,
    session_dict,
    session_get,
    session_list,
    session_turns,
    turn_messages,
)
from runs.views import sessions as views

HTMX = {"HTTP_HX_REQUEST": "true"}
URL = "/api/v1/sessions"
DAY = datetime(2026, 11, 20, tzinfo=UTC)


def turn(session_id, n, *, at, question="hi", answer="hello", status="ok", tokens=None, **extra):
    """One trace of a conversation: a root span naming the session, and an LLM span under it."""
    trace_id = f"{re.sub('[^A-Za-z0-9-]', '-', session_id)}-{n}"
    root = {
        "trace_id": trace_id,
        "span_id": "root",
        "name": "chat_turn",
        "kind": "workflow",
        "start_time": at.isoformat(),
        "end_time": (at + timedelta(seconds=2)).isoformat(),
        "status": status,
        "session_id": session_id,
        "attributes": {"ag": {"data": {"inputs": {"question": question}, "outputs": answer}}},
        **extra,
    }
    llm = {
        "trace_id": trace_id,
        "span_id": "llm",
        "parent_id": "root",
        "name": "chat",
        "kind": "llm",
        "start_time": (at + timedelta(milliseconds=100)).isoformat(),
        "end_time": (at + timedelta(seconds=1)).isoformat(),
        "attributes": {"ag": {"metrics": {"unit": {"tokens": {"total": tokens or 10}}}}},
    }
    return [root, llm]


def conversation(project, session_id, turns, *, start=DAY, gap=timedelta(minutes=1), **kw):
    spans = []
    for n in range(turns):
        spans += turn(session_id, n + 1, at=start + n * gap, question=f"q{n + 1}", **kw)
    trace_ingest(project=project, spans=spans)
    return Session.objects.get(project=project, session_id=session_id)


# --- reads --------------------------------------------------------------------------------------


def test_it_lists_sessions_most_recently_active_first(project):
    conversation(project, "old", 3, start=DAY)
    conversation(project, "new", 1, start=DAY + timedelta(hours=1))
    conversation(project, "middle", 2, start=DAY + timedelta(minutes=30))
    assert [s.session_id for s in session_list(project=project)] == ["new", "middle", "old"]


def test_it_filters_sessions(project):
    conversation(project, "chat-a", 3, start=DAY)
    conversation(project, "chat-b", 1, start=DAY + timedelta(hours=2), status="error")
    conversation(project, "other", 2, start=DAY + timedelta(hours=4))

    def ids(**filters):
        return [s.session_id for s in session_list(project=project, **filters)]

    assert ids(search="CHAT") == ["chat-b", "chat-a"]
    assert ids(status="error") == ["chat-b"]
    assert ids(status="ok") == ["other", "chat-a"]
    assert ids(min_traces=2) == ["other", "chat-a"]
    assert ids(min_traces=3) == ["chat-a"]
    # since/until read the last activity: chat-a's last turn ends at 00:02:02.
    assert ids(since=DAY + timedelta(minutes=2)) == ["other", "chat-b", "chat-a"]
    assert ids(since=DAY + timedelta(minutes=3)) == ["other", "chat-b"]
    assert ids(until=DAY + timedelta(hours=3)) == ["chat-b", "chat-a"]


def test_it_pages_with_a_keyset_cursor_that_growing_sessions_do_not_shift(project):
    for n in range(4):
        conversation(project, f"s{n}", 1, start=DAY + timedelta(minutes=n))
    first = list(session_list(project=project)[:2])
    assert [s.session_id for s in first] == ["s3", "s2"]
    # s0 gets a new turn between the two pages: it moves to the top, s1 stays next.
    trace_ingest(project=project, spans=turn("s0", 2, at=DAY + timedelta(hours=1)))
    after = session_cursor_parse(session_cursor(first[-1]))
    assert [s.session_id for s in session_list(project=project, before=after)] == ["s1"]
    assert session_list(project=project)[0].session_id == "s0"


def test_it_breaks_ties_on_the_last_activity_by_id(project):
    for name in ("a", "b", "c"):
        conversation(project, name, 1, start=DAY)
    ordered = list(session_list(project=project))
    assert [s.pk for s in ordered] == sorted((s.pk for s in ordered), reverse=True)
    after = session_cursor_parse(session_cursor(ordered[0]))
    assert list(session_list(project=project, before=after)) == ordered[1:]


def test_it_refuses_a_cursor_it_did_not_write():
    for text in ("", "abc", "12", "12_x", "12_0", "99999999999999999999999_1", "none_-3"):
        assert session_cursor_parse(text) is None, text
    moment = DAY + timedelta(microseconds=7)
    assert session_cursor_parse(session_cursor(Session(pk=5, last_activity=moment))) == (moment, 5)
    assert session_cursor_parse(session_cursor(Session(pk=5))) == (None, 5)


def test_a_turn_shows_its_own_messages():
    def trace(inputs, outputs):
        return {
            "spans": {"r": {"attributes": {"ag": {"data": {"inputs": inputs, "outputs": outputs}}}}}
        }

    assert turn_messages(trace({"question": "Capital of Peru?"}, "Lima")) == [
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima"},
    ]
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima"},
        {"role": "user", "content": "And Chile?"},
    ]
    # A re-sent chat history: only what came after the last answer is this turn's.
    assert turn_messages(trace({"messages": history}, {"content": "Santiago"})) == [
        {"role": "user", "content": "And Chile?"},
        {"role": "assistant", "content": "Santiago"},
    ]
    assert turn_messages(trace({"messages": history[:2]}, None)) == history[:2]
    assert turn_messages({"spans": {}}) == []


def test_it_draws_trees_while_the_pages_span_budget_lasts(project, django_assert_max_num_queries):
    session = conversation(project, "chat", 3)
    with django_assert_max_num_queries(4):
        page, turns = session_turns(session, span_budget=4)
    assert [t.trace.trace_id for t in turns] == ["chat-1", "chat-2", "chat-3"]
    assert [t.tree is not None for t in turns] == [True, True, False]
    assert [t.messages[0]["content"] for t in turns] == ["q1", "q2", "q3"]  # all have words
    assert list(turns[0].tree["spans"]["root"]["children"]) == ["llm"]
    page, turns = session_turns(session, page=2, size=2)
    assert [t.trace.trace_id for t in turns] == ["chat-3"] and page.number == 2


# --- pages --------------------------------------------------------------------------------------


def test_it_lists_sessions_on_a_page(viewer_client, project):
    session = conversation(project, "chat-1", 3, tokens=21)
    page = viewer_client.get("/p/acme/sessions/").content.decode()
    assert "<html" in page and 'id="session-table"' in page
    assert f'<a class="mono" href="/p/acme/sessions/{session.pk}/">chat-1</a>' in page
    assert '<td class="num">3</td>' in page and "63" in page  # turns, tokens
    assert "2026-11-20 00:00:00" in page and "2026-11-20 00:02:02" in page
    assert 'href="/p/acme/sessions/"' in page  # the nav entry


def test_it_swaps_only_the_table_for_htmx(viewer_client, project):
    conversation(project, "chat-1", 1)
    conversation(project, "other", 1)
    response = viewer_client.get("/p/acme/sessions/?q=chat", **HTMX)
    fragment = response.content.decode()
    assert fragment.strip().startswith('<div id="session-table">')
    assert "chat-1" in fragment and "other" not in fragment and "<html" not in fragment


def test_it_filters_by_status_and_turns_on_the_page(viewer_client, project):
    conversation(project, "long-ok", 3)
    conversation(project, "short-failed", 1, status="error")
    page = viewer_client.get("/p/acme/sessions/?min_turns=2").content.decode()
    assert "long-ok" in page and "short-failed" not in page
    page = viewer_client.get("/p/acme/sessions/?status=error").content.decode()
    assert "short-failed" in page and "long-ok" not in page


@pytest.mark.parametrize("query", ["since=someday", "min_turns=0", "before=garbage"])
def test_it_shows_a_bad_filter_instead_of_failing(viewer_client, project, query):
    response = viewer_client.get(f"/p/acme/sessions/?{query}", **HTMX)
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()


def test_it_pages_to_older_sessions(viewer_client, project, monkeypatch):
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    for n in range(3):
        conversation(project, f"chat-{n}", 1, start=DAY + timedelta(minutes=n))
    page = viewer_client.get("/p/acme/sessions/?q=chat").content.decode()
    assert "chat-2" in page and "chat-1" in page and "chat-0" not in page
    link = next(part for part in page.split('"') if "before=" in part).replace("&amp;", "&")
    assert "q=chat" in link
    fragment = viewer_client.get(link, **HTMX).content.decode()
    assert "chat-0" in fragment and "chat-2" not in fragment and "Newest" in fragment


def test_it_offers_editors_a_replay_of_the_filtered_sessions(client, editor, viewer, project):
    conversation(project, "chat-1", 1)
    client.force_login(editor)
    page = client.get("/p/acme/sessions/?q=chat&status=ok&min_turns=1").content.decode()
    assert (
        'href="/p/acme/replay/new?source=sessions&amp;q=chat&amp;status=ok&amp;min_turns=1"' in page
    )
    client.force_login(viewer)
    assert "Replay as testset" not in client.get("/p/acme/sessions/").content.decode()


def test_it_reads_a_session_as_its_conversation(viewer_client, project):
    session = conversation(project, "chat-1", 3, answer="It is <b>Lima</b>.", tokens=7)
    response = viewer_client.get(f"/p/acme/sessions/{session.pk}/")
    page = response.content.decode()
    assert response.status_code == 200
    assert page.index(">q1<") < page.index(">q2<") < page.index(">q3<")
    # Escaped, in each turn's answer and again in its tree's root span.
    assert page.count("It is &lt;b&gt;Lima&lt;/b&gt;.") == 6 and "<b>Lima" not in page
    assert page.count('<details class="fold turn-tree">') == 3
    assert page.count('<div class="span-tree"') == 3  # each turn's tree, folded
    assert 'href="/p/acme/traces/chat-1-2/"' in page
    assert "21" in page  # the session's tokens in the header
    assert 'href="/api/v1/sessions?project=acme&amp;session_id=chat-1"' in page


def test_a_failed_turn_shows_its_error(viewer_client, project):
    session = conversation(project, "chat", 1, status="error", status_message="tool <timed> out")
    page = viewer_client.get(f"/p/acme/sessions/{session.pk}/").content.decode()
    assert 'class="turn turn-error"' in page and "tool &lt;timed&gt; out" in page
    page, [failed] = session_turns(Session.objects.get(), span_budget=0)
    assert failed.tree is None and failed.error == "tool <timed> out"


def test_it_folds_long_text_and_shows_chat_histories(viewer_client, project):
    history = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of Peru?"},
    ]
    spans = turn("chat", 1, at=DAY)
    spans[0]["attributes"]["ag"]["data"] = {
        "inputs": {"messages": history},
        "outputs": "Lima. " * 200,
    }
    trace_ingest(project=project, spans=spans)
    page = viewer_client.get(f"/p/acme/sessions/{Session.objects.get().pk}/").content.decode()
    assert 'class="msg msg-system"' in page and "Answer in one word." in page
    assert 'class="msg msg-user"' in page and "Capital of Peru?" in page
    assert '<details class="fold"><summary><span class="preview">' in page


def test_it_pages_a_long_sessions_turns(viewer_client, project, monkeypatch):
    monkeypatch.setattr(views, "TURNS_PER_PAGE", 2)
    url = f"/p/acme/sessions/{conversation(project, 'chat', 5).pk}/"
    page = viewer_client.get(url).content.decode()
    assert ">q1<" in page and ">q2<" in page and ">q3<" not in page
    assert "page 1 of 3" in page and 'href="?page=2"' in page
    page = viewer_client.get(f"{url}?page=3").content.decode()
    assert ">q5<" in page and ">q4<" not in page and "#5" in page
    assert viewer_client.get(f"{url}?page=x").status_code == 200


def test_turns_past_the_budget_fetch_their_tree_from_the_trace_page(
    viewer_client, project, monkeypatch
):
    monkeypatch.setattr(views, "TREE_SPAN_BUDGET", 2)
    session = conversation(project, "chat", 2)
    page = viewer_client.get(f"/p/acme/sessions/{session.pk}/").content.decode()
    assert page.count('<div class="span-tree"') == 1
    assert 'hx-get="/p/acme/traces/chat-2/" hx-trigger="toggle once" hx-select=".span-tree"' in page
    assert '<a href="/p/acme/traces/chat-2/">Open the trace</a>' in page  # without JS
    tree = viewer_client.get("/p/acme/traces/chat-2/", **HTMX).content.decode()
    assert '<div class="span-tree" id="span-tree-chat-2">' in tree


@pytest.mark.parametrize("session_id", ["a\nb", "..", "a/../b", "user/42/chat?x=1"])
def test_pages_link_to_a_session_whatever_its_id(viewer_client, project, session_id):
    """A session id is the client's free text: a newline, a dot segment (which browsers fold
    away) or a ``?`` cannot be a URL path, so pages link to sessions by pk."""
    session = conversation(project, session_id, 1)
    trace = Trace.objects.get()
    link = f"/p/acme/sessions/{session.pk}/"
    for url in ("/p/acme/sessions/", "/p/acme/traces/", f"/p/acme/traces/{trace.trace_id}/"):
        response = viewer_client.get(url)
        assert response.status_code == 200, url
        assert f'href="{link}' in response.content.decode(), url
    page = viewer_client.get(link).content.decode()
    assert ">q1<" in page
    api_link = next(part for part in page.split('"') if part.startswith("/api/v1/sessions?"))
    found = viewer_client.get(api_link.replace("&amp;", "&")).json()["results"]
    assert [s["session_id"] for s in found] == [session_id]


def test_traces_link_to_their_session(viewer_client, project):
    session = conversation(project, "chat-1", 1)
    listing = viewer_client.get("/p/acme/traces/").content.decode()
    assert f'href="/p/acme/sessions/{session.pk}/"' in listing
    detail = viewer_client.get("/p/acme/traces/chat-1-1/").content.decode()
    assert f'href="/p/acme/sessions/{session.pk}/#turn-chat-1-1"' in detail


def test_it_hides_other_projects_sessions_from_pages(outsider_client, project):
    session = conversation(project, "secret", 1)
    assert outsider_client.get("/p/acme/sessions/").status_code == 404
    assert outsider_client.get(f"/p/acme/sessions/{session.pk}/").status_code == 404
    assert outsider_client.get(f"/p/other/sessions/{session.pk}/").status_code == 404
    assert "secret" not in outsider_client.get("/p/other/sessions/").content.decode()


# --- API ----------------------------------------------------------------------------------------


def test_it_lists_and_filters_sessions_on_the_api(viewer_api, project):
    conversation(project, "chat-a", 3, start=DAY)
    conversation(project, "chat-b", 1, start=DAY + timedelta(hours=1), status="error")

    def ids(query=""):
        response = viewer_api.get(f"{URL}?{query}")
        assert response.status_code == 200, response.json()
        return [s["session_id"] for s in response.json()["results"]]

    assert ids() == ["chat-b", "chat-a"]
    assert ids("search=-a") == ["chat-a"]
    assert ids("status=error") == ["chat-b"]
    assert ids("min_turns=2") == ["chat-a"]
    assert ids("since=2026-11-20T00:30:00Z") == ["chat-b"]
    assert ids("until=2026-11-20T00:30:00Z") == ["chat-a"]
    assert ids("since=2026-11-20") == ["chat-b", "chat-a"]
    first = viewer_api.get(URL).json()["results"][1]
    assert first["trace_count"] == 3 and first["tokens"] == 30 and first["status"] == "ok"
    assert first["last_activity"] == "2026-11-20T00:02:02Z"


@pytest.mark.parametrize(
    ("query", "field"),
    [("since=last-week", "since"), ("min_turns=0", "min_turns"), ("cursor=zz", "cursor"),
     ("status=maybe", "status"), ("limit=501", "limit")],
)  # fmt: skip
def test_it_names_a_bad_filter_on_the_api(api, query, field):
    response = api.get(f"{URL}?{query}")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_it_pages_the_api_with_a_cursor(api, project):
    for n in range(5):
        conversation(project, f"s{n}", 1, start=DAY + timedelta(minutes=n))
    first = api.get(f"{URL}?limit=2&search=s").json()
    assert [s["session_id"] for s in first["results"]] == ["s4", "s3"]
    second = api.get(first["next"]).json()
    assert [s["session_id"] for s in second["results"]] == ["s2", "s1"]
    third = api.get(second["next"]).json()
    assert [s["session_id"] for s in third["results"]] == ["s0"] and third["next"] is None


def test_it_reads_a_session_on_the_api(viewer_api, project):
    session = conversation(project, "chat", 3, answer="Lima")
    body = viewer_api.get(f"{URL}/chat").json()
    assert body["session_id"] == "chat" and body["trace_count"] == 3
    assert [t["trace_id"] for t in body["traces"]] == ["chat-1", "chat-2", "chat-3"]
    assert body["traces"][0]["span_count"] == 2 and body["truncated"] is False
    assert body["messages"] == session_dict(session)["messages"]
    assert [m["content"] for m in body["messages"]] == ["q1", "Lima", "q2", "Lima", "q3", "Lima"]


def test_the_api_summary_reads_only_the_roots_inputs_and_outputs(
    viewer_api, project, django_assert_max_num_queries
):
    """The summary's messages come out of the root spans' attributes in PostgreSQL: neither the
    other spans nor the rest of a root's attributes are read, however large."""
    spans = turn("chat", 1, at=DAY)
    spans[0]["attributes"]["ag"]["data"]["internals"] = {"context": "x" * 50_000}
    trace_ingest(project=project, spans=spans)
    with django_assert_max_num_queries(8) as queries:
        body = viewer_api.get(f"{URL}/chat").json()
    assert [m["content"] for m in body["messages"]] == ["hi", "hello"]
    reads = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('SELECT "runs_span"')
    ]
    assert len(reads) == 1 and '"runs_span"."attributes",' not in reads[0]


@pytest.mark.parametrize("session_id", ["a\nb", "a/../b", "user/42/chat?x=1", " padded "])
def test_it_reads_a_session_by_any_id_on_the_api(viewer_api, project, session_id):
    conversation(project, session_id, 2)
    conversation(project, "a", 1)
    body = viewer_api.get(f"{URL}/{quote(session_id, safe='/')}").json()
    assert body["session_id"] == session_id and body["trace_count"] == 2
    exact = viewer_api.get(URL, {"session_id": session_id}).json()["results"]
    assert [s["session_id"] for s in exact] == [session_id]
    assert [
        s["session_id"] for s in viewer_api.get(URL, {"session_id": "a"}).json()["results"]
    ] == ["a"]


def test_it_answers_the_evaluator_contracts_session_with_full(api, project, monkeypatch):
    session = conversation(project, "chat", 2)
    response = api.get(f"{URL}/chat?full=1")
    assert response.status_code == 200
    assert response.json() == session_dict(session)
    monkeypatch.setattr(api_sessions, "FULL_MAX_SPANS", 3)
    response = api.get(f"{URL}/chat?full=1")
    assert response.status_code == 400
    assert "4 spans" in response.json()["error"]["fields"]["full"][0]


def test_it_hides_other_projects_sessions_on_the_api(api, outsider_api, project, other_project):
    conversation(project, "secret", 1)
    assert outsider_api.get(f"{URL}/secret").status_code == 404
    assert outsider_api.get(URL).json()["results"] == []
    conversation(other_project, "secret", 2)  # the same id in another project: another session
    assert api.get(f"{URL}/secret").json()["trace_count"] == 1
    assert outsider_api.get(f"{URL}/secret").json()["trace_count"] == 2
    assert session_get(project=project, session_id="secret").trace_count == 1


# --- the OpenTelemetry SDK, end to end ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_conversation_exported_by_the_opentelemetry_sdk_is_one_session(
    live_server, project, editor, client
):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    _, key = api_key_create(project=project, name="otel", created_by=editor, role=Role.EDITOR)
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/api/v1/otlp/v1/traces",
        headers={"Authorization": f"Bearer {key}"},
    )
    sent = InMemorySpanExporter()  # what the SDK exported, to compare times with
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(sent))
    tracer = provider.get_tracer("tests.sessions")
    for n in range(1, 6):
        with tracer.start_as_current_span("chat_turn") as root:
            root.set_attribute("session.id", "conv-otel")
            root.set_attribute("input.value", f"question {n}")
            with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
                chat.set_attribute("gen_ai.usage.input_tokens", 10 * n)
                chat.set_attribute("gen_ai.usage.output_tokens", n)
            root.set_attribute("output.value", f"answer {n}")
    with tracer.start_as_current_span("chat_turn") as root:
        root.set_attribute("gen_ai.conversation.id", "conv-genai")
        root.set_attribute("input.value", "another conversation")
    provider.shutdown()

    session = Session.objects.get(project=project, session_id="conv-otel")
    assert Session.objects.filter(project=project).count() == 2
    assert Session.objects.get(project=project, session_id="conv-genai").trace_count == 1
    assert session.trace_count == 5
    assert session.tokens == sum(10 * n + n for n in range(1, 6))
    ends = [
        span.end_time for span in sent.get_finished_spans() if span.attributes.get("session.id")
    ]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert session.last_activity == epoch + timedelta(microseconds=max(ends) // 1000)
    traces = Trace.objects.filter(project=project, session_id="conv-otel")
    assert session.start_time == min(t.start_time for t in traces)

    client.force_login(editor)
    page = client.get(f"/p/acme/sessions/{session.pk}/").content.decode()
    positions = [page.index(f">question {n}<") for n in range(1, 6)]
    assert positions == sorted(positions) and page.count('<li class="turn') == 5
    assert "answer 5" in page and "another conversation" not in page
    body = client.get(f"{URL}/conv-otel?project=acme").json()
    assert [t["trace_id"] for t in body["traces"]] == [
        t.trace_id for t in traces.order_by("start_time")
    ]
    assert [m["content"] for m in body["messages"]][::2] == [f"question {n}" for n in range(1, 6)]


def test_a_session_id_postgresql_cannot_hold_is_a_4xx(viewer_client, viewer_api, project):
    assert viewer_client.get("/p/acme/sessions/a%00b/").status_code in (400, 404)
    assert viewer_api.get(f"{URL}/a%00b").status_code in (400, 404)
    assert viewer_api.get(f"{URL}?session_id=a%00b").status_code == 400


# --- the session's sums as traces arrive ---------------------------------------------------------


def recounted(project, session_id: str) -> dict:
    """The session's sums read straight off its traces (what a full recount writes)."""
    traces = list(Trace.objects.filter(project=project, session_id=session_id))
    ends = [t.end_time or t.start_time for t in traces]
    tokens = [t.tokens for t in traces if t.tokens is not None]
    costs = [t.cost for t in traces if t.cost is not None]
    return {
        "trace_count": len(traces),
        "start_time": min(t.start_time for t in traces),
        "last_activity": max(ends),
        "duration_ms": pytest.approx(
            (max(ends) - min(t.start_time for t in traces)).total_seconds() * 1000
        ),
        "status": "error" if any(t.status == "error" for t in traces) else "ok",
        "tokens": sum(tokens) if tokens else None,
        "cost": pytest.approx(sum(costs)) if costs else None,
    }


def summed(project, session_id: str) -> dict:
    session = Session.objects.get(project=project, session_id=session_id)
    return {field: getattr(session, field) for field in recounted(project, session_id)}


def test_arriving_traces_keep_the_sessions_sums_exact(project):
    # New traces one request at a time and several at once, out of time order, an error,
    # traces without tokens, a trace arriving in two pieces, and a trace moving to another
    # session: after each ingest the row holds what a recount of the traces gives.
    later, earlier = DAY + timedelta(hours=2), DAY + timedelta(hours=1)
    steps = [
        turn("chat", 1, at=later, tokens=7),
        turn("chat", 2, at=earlier, status="error") + turn("chat", 3, at=later + timedelta(1)),
        [dict(span, attributes={}) for span in turn("chat", 4, at=later)][:1],  # no tokens
        turn("chat", 5, at=DAY)[1:],  # the LLM span first, its root not arrived yet
        turn("chat", 5, at=DAY)[:1],  # and then the root
        # A new trace and one stored already, of one session, in one request: the session is
        # recounted, and the new trace not added on top of the recount.
        turn("chat", 6, at=later) + turn("chat", 2, at=earlier)[:1],
        turn("other", 3, at=later),  # another session
        [{**turn("chat", 1, at=later)[0], "session_id": "other"}],  # trace 1 moves to "other"
    ]
    for spans in steps:
        trace_ingest(project=project, spans=spans)
        traces = Trace.objects.filter(project=project).exclude(session_id="")
        for session_id in set(traces.values_list("session_id", flat=True)):
            assert summed(project, session_id) == recounted(project, session_id)
    assert summed(project, "chat")["trace_count"] == 5
    assert summed(project, "chat")["status"] == "ok"  # trace 2 was sent again, without its error
    assert summed(project, "other")["trace_count"] == 2


def test_a_new_trace_is_added_to_its_session_without_reading_the_others(project):
    """EXPLAIN ANALYZE of the statement an ingest of new traces runs: it reads the new trace
    only, however many traces the session already has."""
    trace_ingest(
        project=project,
        spans=[s for n in range(200) for s in turn("big", n, at=DAY + timedelta(seconds=n))],
    )
    [new] = trace_ingest(project=project, spans=turn("big", 999, at=DAY + timedelta(hours=1)))
    undo = transaction.savepoint()  # ANALYZE runs the statement: the trace would count twice
    with connection.cursor() as cursor:
        cursor.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {ADD_SQL}",
            {"project": project.pk, "sessions": ["big"], "traces": [new.pk]},
        )
        plan = cursor.fetchone()[0]
    transaction.savepoint_rollback(undo)
    read = []

    def walk(node):
        if node.get("Relation Name") == "runs_trace":
            read.append(node["Actual Rows"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    assert read == [1]
    assert summed(project, "big") == recounted(project, "big")
