"""Native trace ingestion, the tree and its metrics, trace_dict and trace_record."""

import copy
import threading
import time

import pytest
from django.db import connection, transaction

from evalsite.errors import InvalidInput
from evaluators.samples import SAMPLE_TRACE
from runs.models import Session, Span, Trace
from runs.traces import TooLarge, trace_dict, trace_ingest, trace_record

T = "4bf92f3577b34da6a3ce929d0e0e4736"


def span(span_id, parent_id=None, *, start="10:00:00", end="10:00:01", **extra):
    return {
        "trace_id": T,
        "span_id": span_id,
        "parent_id": parent_id,
        "name": extra.pop("name", span_id),
        "kind": extra.pop("kind", "task"),
        "start_time": f"2026-11-20T{start}Z",
        "end_time": f"2026-11-20T{end}Z" if end else None,
        **extra,
    }


def llm(span_id, parent_id, prompt, completion, cost=None, **extra):
    unit = {"tokens": {"prompt": prompt, "completion": completion}}
    if cost is not None:
        unit["costs"] = {"total": cost}
    return span(
        span_id, parent_id, kind="llm", attributes={"ag": {"metrics": {"unit": unit}}}, **extra
    )


def metrics(data, *path):
    node = data["spans"]
    for span_id in path[:-1]:
        node = node[span_id]["children"]
    return node[path[-1]]["attributes"]["ag"]["metrics"]


def test_it_stores_flat_spans_as_a_tree(project):
    [trace] = trace_ingest(
        project=project,
        spans=[
            span("root", name="rag", kind="workflow", end="10:00:02"),
            span("retrieve", "root", start="10:00:00.100000", end="10:00:00.300000"),
            llm("chat", "root", 40, 10, cost=0.001, start="10:00:00.400000", end="10:00:01.900000"),
        ],
    )
    assert (trace.name, trace.root_span_id, trace.span_count) == ("rag", "root", 3)
    assert trace.duration_ms == 2000.0 and trace.tokens == 50 and trace.cost == 0.001
    data = trace_dict(trace)
    root = data["spans"]["root"]
    assert list(root["children"]) == ["retrieve", "chat"]
    assert root["parent_id"] is None and root["children"]["chat"]["parent_id"] == "root"
    assert root["start_time"] == "2026-11-20T10:00:00.000Z"
    assert root["children"]["retrieve"]["start_time"] == "2026-11-20T10:00:00.100Z"
    assert root["attributes"]["ag"]["metrics"]["unit"] == {"duration": {"total": 2000.0}}
    assert root["attributes"]["ag"]["metrics"]["acc"] == {
        "duration": {"total": 2000.0},
        "tokens": {"prompt": 40, "completion": 10, "total": 50},
        "costs": {"total": 0.001},
    }


def test_it_takes_the_nested_contract_shape_and_gives_it_back(project):
    [trace] = trace_ingest(project=project, spans=[SAMPLE_TRACE])
    data = trace_dict(trace)
    assert data["trace_id"] == SAMPLE_TRACE["trace_id"]
    expected = copy.deepcopy(SAMPLE_TRACE["spans"])
    root = data["spans"]["a1b2c3d4e5f60001"]
    assert set(root["children"]) == set(expected["a1b2c3d4e5f60001"]["children"])
    assert (
        root["attributes"]["ag"]["data"] == expected["a1b2c3d4e5f60001"]["attributes"]["ag"]["data"]
    )
    assert root["attributes"]["ag"]["metrics"] == {
        "unit": {"duration": {"total": 1234.5}},
        "acc": expected["a1b2c3d4e5f60001"]["attributes"]["ag"]["metrics"]["acc"],
    }
    chat = root["children"]["a1b2c3d4e5f60003"]
    assert chat["attributes"]["gen_ai.request.model"] == "gpt-4o-mini"
    assert list(chat["attributes"]) == ["ag", "gen_ai.request.model"]
    assert list(chat["attributes"]["ag"]) == ["data", "metrics", "meta"]
    # Re-ingesting what trace_dict returns changes nothing.
    trace_ingest(project=project, spans=[data])
    assert trace_dict(Trace.objects.get()) == data


def test_it_unnests_children_given_inline_with_a_flat_span(project):
    root = {**span("root"), "children": [llm("chat", None, 3, 4), span("tool", "elsewhere")]}
    [trace] = trace_ingest(project=project, spans=[root])
    children = trace_dict(trace)["spans"]["root"]["children"]
    assert list(children) == ["chat", "tool"] and children["tool"]["parent_id"] == "root"
    assert trace.tokens == 7


def test_it_accumulates_when_children_arrive_in_a_later_request(project):
    trace_ingest(project=project, spans=[span("root", end="10:00:05")])
    trace_ingest(project=project, spans=[span("agent", "root", end="10:00:04")])
    [trace] = trace_ingest(
        project=project,
        spans=[llm("a", "agent", 10, 5, cost=0.25), llm("b", "agent", 20, 5, cost=0.5)],
    )
    data = trace_dict(trace)
    assert metrics(data, "root")["acc"]["tokens"] == {"prompt": 30, "completion": 10, "total": 40}
    assert metrics(data, "root")["acc"]["costs"] == {"total": 0.75}
    assert metrics(data, "root", "agent")["acc"]["tokens"]["total"] == 40
    assert metrics(data, "root", "agent", "a")["unit"]["tokens"]["total"] == 15
    assert "tokens" not in metrics(data, "root")["unit"]
    trace.refresh_from_db()
    assert (trace.span_count, trace.tokens, trace.cost) == (4, 40, 0.75)


def test_it_keeps_an_orphan_until_its_parent_arrives(project):
    [trace] = trace_ingest(
        project=project, spans=[llm("child", "parent", 7, 3, start="10:00:01", end="10:00:02")]
    )
    data = trace_dict(trace)
    assert list(data["spans"]) == ["child"]
    assert data["spans"]["child"]["parent_id"] == "parent"
    assert (trace.name, trace.root_span_id) == ("child", "child")

    trace_ingest(project=project, spans=[span("parent", start="10:00:00", end="10:00:03")])
    data = trace_dict(Trace.objects.get())
    assert list(data["spans"]) == ["parent"]
    assert list(data["spans"]["parent"]["children"]) == ["child"]
    assert metrics(data, "parent")["acc"]["tokens"]["total"] == 10
    assert Trace.objects.get().root_span_id == "parent"


def test_it_puts_the_real_root_before_orphans(project):
    [trace] = trace_ingest(
        project=project,
        spans=[span("late-orphan", "missing", start="09:00:00", end="09:00:01"), span("root")],
    )
    assert list(trace_dict(trace)["spans"]) == ["root", "late-orphan"]
    assert trace.name == "root"


def test_it_survives_a_parent_cycle(project):
    [trace] = trace_ingest(project=project, spans=[span("a", "b"), span("b", "a")])
    data = trace_dict(trace)
    assert list(data["spans"]) == ["a"] and list(data["spans"]["a"]["children"]) == ["b"]


def test_it_upserts_a_resent_span(project):
    trace_ingest(project=project, spans=[span("root"), llm("chat", "root", 10, 10)])
    trace_ingest(project=project, spans=[span("root"), llm("chat", "root", 10, 10)])
    assert Span.objects.count() == 2 and Trace.objects.count() == 1
    trace_ingest(
        project=project,
        spans=[llm("chat", "root", 100, 10, status="error", status_message="rate limited")],
    )
    trace = Trace.objects.get()
    assert (trace.tokens, trace.status, trace.span_count) == (110, "error", 2)
    data = trace_dict(trace)
    assert metrics(data, "root")["acc"]["tokens"]["total"] == 110
    assert data["spans"]["root"]["children"]["chat"]["status_message"] == "rate limited"


def test_it_keeps_traces_apart_per_project(project, other_project):
    trace_ingest(project=project, spans=[span("root")])
    trace_ingest(project=other_project, spans=[span("root", name="theirs")])
    assert Trace.objects.filter(trace_id=T).count() == 2
    assert Trace.objects.get(project=project).name == "root"


def test_it_fills_duration_and_genai_tokens_and_data_from_attributes(project):
    attributes = {
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 8,
        "input.value": '{"question": "2+2?"}',
        "input.mime_type": "application/json",
        "output.value": "4",
        "ag.meta.env": "prod",
    }
    [trace] = trace_ingest(
        project=project,
        spans=[span("root", start="10:00:00", end="10:00:00.250000", attributes=attributes)],
    )
    root = trace_dict(trace)["spans"]["root"]
    ag = root["attributes"]["ag"]
    assert ag["data"] == {"inputs": {"question": "2+2?"}, "outputs": "4"}
    assert ag["meta"] == {"env": "prod", "model": "gpt-4o-mini", "system": "openai"}
    assert ag["metrics"]["unit"] == {
        "duration": {"total": 250.0},
        "tokens": {"prompt": 12, "completion": 8, "total": 20},
    }
    assert root["attributes"]["gen_ai.usage.input_tokens"] == 12
    assert "input.value" not in root["attributes"] and "ag.meta.env" not in root["attributes"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"start_time": "yesterday"}, "spans[1].start_time: invalid datetime"),
        ({"span_id": ""}, "spans[1].span_id: String should have at least 1 character"),
        ({"end_time": "2026-11-20T09:00:00Z"}, "spans[1].end_time: is before start_time"),
        ({"status": "maybe"}, "spans[1].status: Input should be 'ok' or 'error'"),
        (
            {"attributes": {"ag": {"metrics": {"unit": {"tokens": {"prompt": "many"}}}}}},
            "spans[1].attributes.ag.metrics.unit.tokens.prompt: must be a number",
        ),
        ({"name": "a\x00b"}, "spans[1].name: contains a NUL character (\\u0000)"),
        (
            {"attributes": {"ag": {"meta": {"session_id": "chat\x00"}}}},
            "spans[1].attributes.ag.meta.session_id: contains a NUL character (\\u0000)",
        ),
        (
            {"attributes": {"ag": "not an object", "ag.data.inputs": "hi"}},
            "spans[1].attributes.ag: Input should be a valid dictionary",
        ),
    ],
)
def test_it_names_the_first_bad_field_and_stores_nothing(project, bad, message):
    with pytest.raises(InvalidInput) as caught:
        trace_ingest(project=project, spans=[span("root"), {**span("child", "root"), **bad}])
    assert str(caught.value) == message
    assert not Trace.objects.exists() and not Span.objects.exists()


def test_it_names_a_missing_field_inside_a_nested_trace(project):
    broken = copy.deepcopy(SAMPLE_TRACE)
    del broken["spans"]["a1b2c3d4e5f60001"]["children"]["a1b2c3d4e5f60002"]["name"]
    with pytest.raises(InvalidInput) as caught:
        trace_ingest(project=project, spans=[broken])
    assert str(caught.value) == (
        "spans[0].spans.a1b2c3d4e5f60001.children.a1b2c3d4e5f60002.name: required"
    )


def test_it_refuses_more_spans_than_the_limit(project, settings):
    settings.EVALSITE_TRACE_MAX_SPANS = 2
    with pytest.raises(TooLarge, match="3 spans in one request; the limit is 2"):
        trace_ingest(project=project, spans=[span("a"), span("b"), span("c")])
    assert not Span.objects.exists()


def test_it_refuses_oversized_attributes(project, settings):
    settings.EVALSITE_TRACE_MAX_ATTRIBUTES_BYTES = 1000
    big = span("big", "root", attributes={"ag": {"data": {"inputs": "x" * 2000}}})
    with pytest.raises(TooLarge, match=r"spans\[1\]\.attributes: \d+ bytes of JSON"):
        trace_ingest(project=project, spans=[span("root"), big])
    assert not Span.objects.exists()


def test_it_refuses_what_postgres_cannot_store(project):
    nul = span("root", attributes={"note": "a\x00b"})
    with pytest.raises(InvalidInput, match="NUL"):
        trace_ingest(project=project, spans=[nul])
    nan = span("root", attributes={"score": float("nan")})
    with pytest.raises(InvalidInput, match="not storable as JSON"):
        trace_ingest(project=project, spans=[nan])


def test_it_reads_a_trace_in_one_query(project, django_assert_num_queries):
    spans = [span("root")] + [llm(f"c{i}", "root", 1, 1) for i in range(30)]
    [trace] = trace_ingest(project=project, spans=spans)
    with django_assert_num_queries(1):
        data = trace_dict(trace)
    assert len(data["spans"]["root"]["children"]) == 30


def test_it_ingests_a_batch_with_a_fixed_number_of_queries(project, django_assert_max_num_queries):
    batch = [
        {**span(f"s{t}-{i}", f"s{t}-0" if i else None), "trace_id": f"{t:032x}"}
        for t in range(20)
        for i in range(5)
    ]
    with django_assert_max_num_queries(6):
        traces = trace_ingest(project=project, spans=batch)
    assert len(traces) == 20 and Span.objects.count() == 100


def test_it_stores_new_traces_with_one_statement_and_the_copy(project, django_assert_num_queries):
    batch = [{**span(f"s{t}"), "trace_id": f"{t:032x}"} for t in range(10)]
    # The traces' INSERT (which also asks whether the project's traces are watched), between
    # the savepoint's two statements; no lock and no read for traces nobody stored yet. The
    # spans go in by COPY, which Django's query log does not count.
    with django_assert_num_queries(3) as queries:
        traces = trace_ingest(project=project, spans=batch)
    [insert] = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert insert.startswith("WITH watched") and "pg_advisory_xact_lock" not in insert
    assert len(traces) == 10 and Span.objects.count() == 10


def test_it_numbers_new_traces_in_the_order_they_came(project):
    # Inserted in trace id order (no two requests wait on each other in a circle), numbered in
    # the request's: newest-first lists keep the order of arrival.
    ids = ["f" * 32, "a" * 32, "c" * 32]
    traces = trace_ingest(project=project, spans=[{**span("r"), "trace_id": t} for t in ids])
    assert [t.trace_id for t in traces] == ids
    assert [t.trace_id for t in Trace.objects.order_by("pk")] == ids


def test_it_locks_and_merges_only_the_traces_stored_already(project, django_assert_num_queries):
    trace_ingest(project=project, spans=[span("root", end="10:00:05")])
    other = "0" * 31 + "1"
    batch = [llm("chat", "root", 10, 5), {**span("solo"), "trace_id": other}]
    with django_assert_num_queries(8) as queries:
        traces = trace_ingest(project=project, spans=batch)
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    # The insert; the lock, the read of the stored trace and of its spans; its summary's upsert
    # and its root's (whose acc the new child changed).
    assert len(statements) == 6
    assert sum("pg_advisory_xact_lock" in sql for sql in statements) == 1
    assert [trace.trace_id for trace in traces] == [T, other]
    stored = Trace.objects.get(trace_id=T)
    assert (stored.span_count, stored.tokens, stored.pk) == (2, 15, traces[0].pk)
    assert metrics(trace_dict(stored), "root")["acc"]["tokens"]["total"] == 15
    assert Trace.objects.get(trace_id=other).span_count == 1


def test_it_records_an_invocation_without_reading(project, django_assert_num_queries):
    # The trace's INSERT; its spans go in by COPY, which Django's query log does not count.
    with django_assert_num_queries(1):
        trace = trace_record(
            project=project,
            name="capital-qa",
            inputs={"country": "France"},
            outputs="Paris",
            duration_ms=1234.5,
            tokens={"prompt": 42, "completion": 9},
            costs=0.0004,
            children=[
                {
                    "name": "chat",
                    "kind": "llm",
                    "start_time": "2026-11-20T10:00:00Z",
                    "attributes": {"gen_ai.usage.input_tokens": 5},
                }
            ],
        )
    assert (trace.source, trace.span_count, trace.duration_ms) == ("invocation", 2, 1234.5)
    data = trace_dict(trace)
    [root] = data["spans"].values()
    ag = root["attributes"]["ag"]
    assert ag["data"] == {"inputs": {"country": "France"}, "outputs": "Paris"}
    assert ag["metrics"]["unit"]["duration"] == {"total": 1234.5}
    assert ag["metrics"]["unit"]["tokens"] == {"prompt": 42, "completion": 9, "total": 51}
    assert ag["metrics"]["acc"]["tokens"] == {"prompt": 47, "completion": 9, "total": 56}
    assert [c["name"] for c in root["children"].values()] == ["chat"]


def test_it_records_a_failed_invocation(project):
    error = {"code": "timeout", "type": "TimeoutError", "message": "no answer in 10 s"}
    trace = trace_record(project=project, name="app", inputs={}, outputs=None, error=error)
    [root] = trace_dict(trace)["spans"].values()
    assert (trace.status, root["status"]) == ("error", "error")
    assert root["status_message"] == "no answer in 10 s"
    assert root["attributes"]["ag"]["meta"]["error"] == error


def stored_rows(project) -> tuple[list, list]:
    """Every stored span and trace, all columns: what sending a batch again must not change."""
    spans = Span.objects.filter(project=project).order_by("trace__trace_id", "span_id")
    traces = Trace.objects.filter(project=project).order_by("trace_id")
    return list(spans.values()), list(traces.values())


def pieces() -> tuple[list[dict], list[dict]]:
    """Three traces in two requests: one whole, one root before its children, one children
    (orphans until then) before their root."""
    first, second = [], []
    for name, early in {"a": "all", "b": "root", "c": "rest"}.items():
        trace_id = f"{ord(name):032x}"
        tree = [
            span("root", kind="workflow", end="10:00:05"),
            span("agent", "root", start="10:00:01", end="10:00:04"),
            llm("chat", "agent", 40, 10, cost=0.002, start="10:00:02", end="10:00:03"),
            llm("chat2", "agent", 5, 5, start="10:00:03", end="10:00:04"),
        ]
        for item in tree:
            item["trace_id"] = trace_id
            part = "root" if item["span_id"] == "root" else "rest"
            (first if early in ("all", part) else second).append(item)
    return first, second


def test_it_stores_every_span_once_however_often_batches_are_resent(api, project):
    first, second = pieces()
    for batch in (first, second):
        assert api.post("/api/v1/traces", {"spans": batch}, format="json").status_code == 200
    spans, traces = stored_rows(project)
    assert len(spans) == 12 and len(traces) == 3
    assert {(t["span_count"], t["tokens"], t["cost"]) for t in traces} == {(4, 60.0, 0.002)}

    for batch in (second, first, first + second):
        response = api.post("/api/v1/traces", {"spans": batch}, format="json")
        assert response.status_code == 200 and response.json()["spans"] == len(batch)

    assert stored_rows(project) == (spans, traces)  # same rows, ids, acc, summaries


@pytest.mark.django_db(transaction=True)
def test_two_requests_bringing_one_new_trace_at_once_store_it_once_and_whole(project):
    """The second waits at the insert for the first to commit, then merges into what it
    stored: every span once, the tree and its sums over both requests."""
    errors = []

    def second() -> None:
        try:
            trace_ingest(project=project, spans=[llm("chat", "root", 10, 5)])
        except Exception as exc:  # the assertion below names it
            errors.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        trace_ingest(project=project, spans=[span("root", end="10:00:05")])
        thread = threading.Thread(target=second)
        thread.start()
        _wait_for_a_lock_wait()
    thread.join(30)
    assert not thread.is_alive() and not errors
    trace = Trace.objects.get()
    assert (trace.span_count, trace.tokens, trace.root_span_id) == (2, 15, "root")
    assert Span.objects.count() == 2
    assert metrics(trace_dict(trace), "root")["acc"]["tokens"]["total"] == 15


def _wait_for_a_lock_wait(seconds: float = 30) -> None:
    """Until another connection of this database waits on a lock (the second request at the
    insert of the trace this transaction inserted)."""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            # Inside a transaction the activity view is read once, unless cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the second request never waited for the first")


def test_deleting_a_project_deletes_its_spans_without_a_database_key(project, other_project):
    # Spans hold neither a database foreign key to their project (migration 0012) nor an index
    # on it (0015): they go with the project's traces, and other projects' spans stay.
    trace_ingest(project=project, spans=[span("root"), span("child", "root")])
    trace_ingest(project=other_project, spans=[span("root", name="theirs")])
    project.delete()
    assert not Span.objects.filter(project_id=project.pk).exists()
    assert Span.objects.filter(project=other_project).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_ingests_into_one_session_at_once_count_both_turns(project):
    """Without a lock per session the second ingest would count only the turns it saw and,
    committing last, overwrite the first's: the session would hold one turn."""
    errors = []

    def turn(trace_id: str) -> list[dict]:
        return [{**span("root"), "trace_id": trace_id, "session_id": "chat-1"}]

    def second() -> None:
        try:
            trace_ingest(project=project, spans=turn("b" * 32))
        except Exception as exc:  # the assertion below names it
            errors.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        trace_ingest(project=project, spans=turn("a" * 32))
        thread = threading.Thread(target=second)
        thread.start()
        _wait_for_a_lock_wait()
    thread.join(30)
    assert not thread.is_alive() and not errors
    assert Session.objects.get(project=project, session_id="chat-1").trace_count == 2


def test_it_keeps_the_first_200_characters_of_a_session_id_its_sender_set(project):
    long = "s" * 300
    [trace] = trace_ingest(
        project=project, spans=[span("root", attributes={"ag": {"meta": {"session_id": long}}})]
    )
    trace.refresh_from_db()
    assert trace.session_id == long[:200]
