"""The spans table is partitioned by day: reads by trace, by time window and by session touch
only their days' partitions (EXPLAIN shows it), and so do the admin's span list and a run's
output search; partitions are created ahead, a span whose day has none lands in the default
partition instead of being refused; spans have no database foreign key to traces (deleting a
trace still takes its spans); migrating a database that has spans keeps every one of them."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import Result, Run, RunStep, Scenario, Session, Span, Trace
from runs.selectors import TableQuery, table_page
from runs.traces import (
    partitions_ensure,
    trace_dict,
    trace_dicts,
    trace_ingest,
    trace_list,
    trace_record,
)
from runs.traces.partitions import (
    DEFAULT,
    day_start,
    default_rows,
    partition_create,
    partitions_list,
)
from runs.traces.reads import trace_spans
from runs.traces.sessions import session_dict, session_traces

DAY1, DAY2, DAY3 = (datetime(2031, 3, d, tzinfo=UTC) for d in (1, 2, 3))


def _name(day: datetime) -> str:
    return f"runs_span_p{day:%Y%m%d}"


def ingest(project, trace_id: str, *, session: str = "", when: datetime | None = None) -> Trace:
    """A two-span trace; ``when`` moves it (trace and spans) to another day of arrival."""
    start = timezone.now().replace(microsecond=0)
    root = {
        "trace_id": trace_id,
        "span_id": "root",
        "name": "agent",
        "start_time": start.isoformat(),
        "end_time": (start + timedelta(seconds=1)).isoformat(),
        "attributes": {"ag": {"data": {"inputs": {"q": trace_id}, "outputs": "done"}}},
        **({"session_id": session} if session else {}),
    }
    child = {**root, "span_id": "tool", "parent_id": "root", "name": "search", "kind": "tool"}
    [trace] = trace_ingest(project=project, spans=[root, child])
    if when is not None:
        move(trace, when)
    # As if the ingest had committed: its deferred foreign-key checks run now (PostgreSQL will
    # not drop a partition while checks on its rows are pending in the transaction).
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
    return trace


def move(trace: Trace, when: datetime) -> None:
    """As if the trace had arrived at ``when``: its spans move to that day's partition."""
    Trace.objects.filter(pk=trace.pk).update(created_at=when)
    Span.objects.filter(trace_id=trace.pk).update(trace_time=when)
    trace.refresh_from_db()


def scanned(queryset) -> set[str]:
    """The tables PostgreSQL's plan reads for a queryset."""
    return _relations(json.loads(queryset.explain(format="json")))


def read(sql: str) -> set[str]:
    """The tables an executed statement read rows from: run-time pruning shows in ANALYZE as
    partitions never executed."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        return _relations(cursor.fetchone()[0], executed=True)


def _relations(plan, *, executed: bool = False) -> set[str]:
    plan = plan[0] if isinstance(plan, list) else plan
    names: set[str] = set()

    def walk(node):
        if "Relation Name" in node and not (executed and node.get("Actual Loops") == 0):
            names.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return names


def _span_queries(queries) -> list[str]:
    return [
        q["sql"] for q in queries if 'FROM "runs_span"' in q["sql"] or "runs_span qs" in q["sql"]
    ]


def partition_of(span_pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM runs_span WHERE id = %s", [span_pk])
        return cursor.fetchone()[0]


@pytest.fixture
def days(db):
    for day in (DAY1, DAY2, DAY3):
        partition_create(day)


# --- the table -----------------------------------------------------------------------------------


def test_the_spans_table_is_partitioned_by_day_from_today_on_with_a_default(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'runs_span'")
        assert cursor.fetchone()[0] == "p"
    names = {p.name for p in partitions_list()}
    assert _name(day_start(timezone.now())) in names
    assert DEFAULT in names
    default = next(p for p in partitions_list() if p.name == DEFAULT)
    assert (default.start, default.end) == (None, None)


def test_an_ingested_span_lands_in_the_partition_of_its_traces_day(project):
    trace = ingest(project, "t-today")
    spans = list(Span.objects.filter(trace=trace))
    assert {s.trace_time for s in spans} == {trace.created_at}
    assert {partition_of(s.pk) for s in spans} == {_name(trace.created_at)}
    assert default_rows() == 0


def test_ensure_creates_today_and_the_days_ahead_once(db):
    now = datetime(2031, 6, 10, 15, 30, tzinfo=UTC)
    first = partitions_ensure(now=now, ahead=2)
    assert first.created == ["runs_span_p20310610", "runs_span_p20310611", "runs_span_p20310612"]
    assert first.blocked == []
    again = partitions_ensure(now=now, ahead=3)
    assert again.created == ["runs_span_p20310613"]
    bounds = {p.name: (p.start, p.end) for p in partitions_list()}
    assert bounds["runs_span_p20310611"] == (
        datetime(2031, 6, 11, tzinfo=UTC),
        datetime(2031, 6, 12, tzinfo=UTC),
    )


def test_a_span_whose_day_has_no_partition_is_kept_in_the_default_partition(project):
    trace = ingest(project, "t-late", when=datetime(2031, 9, 1, 12, tzinfo=UTC))
    assert {partition_of(s.pk) for s in Span.objects.filter(trace=trace)} == {DEFAULT}
    assert default_rows() == 2
    assert set(trace_dict(trace)["spans"]["root"]["children"]) == {"tool"}


def test_ensure_moves_nothing_and_leaves_a_day_whose_spans_are_in_the_default(project):
    trace = ingest(project, "t-late", when=datetime(2031, 9, 1, 12, tzinfo=UTC))
    ensured = partitions_ensure(now=datetime(2031, 9, 1, tzinfo=UTC), ahead=1)
    assert ensured.blocked == ["runs_span_p20310901"]
    assert ensured.created == ["runs_span_p20310902"]
    assert default_rows() == 2
    assert len(trace_dict(trace)["spans"]["root"]["children"]) == 1


@pytest.mark.django_db(transaction=True)
def test_two_hosts_ensuring_at_once_create_each_partition_once():
    now = datetime(2033, 1, 1, tzinfo=UTC)
    barrier, created, errors = threading.Barrier(2), [], []

    def host():
        try:
            barrier.wait()
            created.extend(partitions_ensure(now=now, ahead=2).created)
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    hosts = [threading.Thread(target=host) for _ in range(2)]
    try:
        for thread in hosts:
            thread.start()
        for thread in hosts:
            thread.join()
        assert errors == []
        assert sorted(created) == [
            "runs_span_p20330101",
            "runs_span_p20330102",
            "runs_span_p20330103",
        ]
    finally:
        with connection.cursor() as cursor:
            for name in ("runs_span_p20330101", "runs_span_p20330102", "runs_span_p20330103"):
                cursor.execute(f"DROP TABLE IF EXISTS {name}")


# --- reads prune -------------------------------------------------------------------------------


def test_a_read_by_trace_scans_only_its_days_partition(project, days):
    trace = ingest(project, "t2", when=DAY2 + timedelta(hours=5))
    ingest(project, "t1", when=DAY1 + timedelta(hours=5))
    assert scanned(trace_spans([trace])) == {_name(DAY2)}
    assert len(scanned(Span.objects.filter(trace=trace))) > 3  # without its day: every one
    assert set(trace_dicts([trace])[trace.pk]["spans"]) == {"root"}


def test_a_read_by_time_window_scans_only_the_days_in_it(project, days):
    ingest(project, "t2", when=DAY2 + timedelta(hours=5))
    window = Span.objects.filter(
        project=project, trace_time__gte=DAY2, trace_time__lt=DAY2 + timedelta(hours=12)
    )
    assert scanned(window) == {_name(DAY2)}
    assert window.count() == 2
    two_days = Span.objects.filter(trace_time__gte=DAY1, trace_time__lt=DAY3)
    assert scanned(two_days) == {_name(DAY1), _name(DAY2)}


def test_a_read_by_session_scans_only_the_days_of_its_traces(project, days):
    first = ingest(project, "turn-1", session="chat", when=DAY1 + timedelta(hours=1))
    last = ingest(project, "turn-2", session="chat", when=DAY3 + timedelta(hours=1))
    ingest(project, "elsewhere", when=DAY2 + timedelta(hours=1))
    session = Session.objects.get(project=project, session_id="chat")
    assert scanned(trace_spans(session_traces(session))) == {_name(DAY1), _name(DAY3)}
    assert [t["trace_id"] for t in session_dict(session)["traces"]] == ["turn-1", "turn-2"]
    assert {first.pk, last.pk} == {t.pk for t in session_traces(session)}


def test_the_admin_lists_a_traces_spans_from_its_days_partition_only(
    project, days, client, django_user_model
):
    trace = ingest(project, "t2", when=DAY2 + timedelta(hours=5))
    ingest(project, "t1", when=DAY1 + timedelta(hours=5))
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(root)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/admin/runs/trace/{trace.pk}/change/")
    assert page.status_code == 200
    assert "search" in page.content.decode() and "agent" in page.content.decode()
    [spans] = _span_queries(queries.captured_queries)
    assert read(spans) == {_name(DAY2)}


def _run_with_outputs(project, outputs_by_day: dict) -> Run:
    """A run whose invocation step recorded one trace per (day, output)."""
    run = Run.objects.create(project=project, name="Nightly")
    RunStep.objects.create(run=run, key="application-qa", type="invocation")
    for index, (day, output) in enumerate(outputs_by_day.items()):
        scenario = Scenario.objects.create(
            project=project, run=run, index=index, inputs={"country": f"country {index}"}
        )
        trace = trace_record(project=project, name="qa", inputs=scenario.inputs, outputs=output)
        move(trace, day + timedelta(hours=2))
        Result.objects.create(
            project=project, run=run, scenario=scenario, step_key="application-qa", trace=trace
        )
    return run


def test_a_runs_output_search_reads_each_traces_day_only(project, days):
    run = _run_with_outputs(project, {DAY1: "Lisbon", DAY3: "Porto"})
    with CaptureQueriesContext(connection) as queries:
        page = table_page(run, TableQuery(q="lisbon"))
    assert ([s.index for s in page.scenarios], page.total) == ([0], 1)
    spans = _span_queries(queries.captured_queries)
    partitions = [{n for n in read(sql) if n.startswith("runs_span")} for sql in spans]
    assert len(partitions) == 2  # the count and the page
    assert all(tables and tables <= {_name(DAY1), _name(DAY3)} for tables in partitions)


def test_an_attribute_filter_still_finds_the_trace_on_its_day(project, days):
    ingest(project, "t1", when=DAY1 + timedelta(hours=1))
    ingest(project, "t2", when=DAY2 + timedelta(hours=1))
    found = trace_list(project=project, attributes={"ag.data.inputs.q": "t2"})
    assert [t.trace_id for t in found] == ["t2"]


# --- no foreign key from spans to traces --------------------------------------------------------


def _trace_keys() -> set[str]:
    """The tables holding a foreign key from runs_span (or a partition) to runs_trace."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' "
            "AND confrelid = 'runs_trace'::regclass AND conrelid::regclass::text LIKE 'runs_span%'"
        )
        return {row[0] for row in cursor.fetchall()}


def test_deleting_a_trace_through_django_still_deletes_its_spans(project):
    trace = ingest(project, "t-gone")
    kept = ingest(project, "t-kept")
    trace.delete()
    assert not Span.objects.filter(trace_id=trace.pk).exists()
    assert Span.objects.filter(trace=kept).count() == 2


@pytest.mark.django_db(transaction=True)
def test_no_partition_has_a_foreign_key_to_traces_and_going_back_restores_it(db):
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    assert _trace_keys() == set()
    _migrate([("runs", "0009_session_rules")])
    try:
        assert _trace_keys() == {"runs_span"} | {p.name for p in partitions_list()}
    finally:
        _migrate(latest)
    assert _trace_keys() == set()


# --- migrating a database that has spans ---------------------------------------------------------

SPAN_COLUMNS = (
    "id, project_id, trace_id, span_id, parent_id, name, kind, start_time, end_time, status, "
    "status_message, attributes, trace_time"
)


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _spans() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {SPAN_COLUMNS} FROM runs_span ORDER BY id")
        return cursor.fetchall()


def _insert_old_traces(project_id: int, now: datetime) -> None:
    """Traces of three days and their spans, written as 0007's tables take them."""
    with connection.cursor() as cursor:
        for age in (3, 1, 0):
            arrived = now - timedelta(days=age, hours=1)
            cursor.execute(
                "INSERT INTO runs_trace (project_id, trace_id, name, root_span_id, status, "
                "span_count, source, session_id, created_at, updated_at) "
                "VALUES (%s, %s, 'agent', 'root', 'ok', 2, 'api', '', %s, %s) RETURNING id",
                [project_id, f"old-{age}", arrived, arrived],
            )
            trace_pk = cursor.fetchone()[0]
            for span_id, parent in (("root", ""), ("tool", "root")):
                cursor.execute(
                    "INSERT INTO runs_span (project_id, trace_id, span_id, parent_id, name, kind, "
                    "start_time, end_time, status, status_message, attributes, trace_time) "
                    "VALUES (%s, %s, %s, %s, 'step', 'task', %s, %s, 'ok', '', %s, %s)",
                    [
                        project_id,
                        trace_pk,
                        span_id,
                        parent,
                        arrived,
                        arrived + timedelta(seconds=1),
                        json.dumps({"ag": {"data": {"inputs": {"age": age}}}, "x": [1, 2]}),
                        arrived,
                    ],
                )


@pytest.mark.django_db(transaction=True)
def test_migrating_an_existing_database_keeps_every_span_and_ingest_goes_on(project):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    _migrate([("runs", "0007_sessions_trace_time")])
    now = timezone.now()
    _insert_old_traces(project.pk, now)
    before = _spans()
    assert len(before) == 6

    _migrate(latest)

    assert _spans() == before
    assert _trace_keys() == set()
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'runs_span'")
        assert cursor.fetchone()[0] == "p"
    for span_pk, *_, trace_time in before:
        assert partition_of(span_pk) == _name(trace_time)
    assert default_rows() == 0
    old = Trace.objects.get(trace_id="old-3")
    assert trace_dict(old)["spans"]["root"]["attributes"]["x"] == [1, 2]
    new = ingest(project, "after-migration")
    new_ids = list(Span.objects.filter(trace=new).values_list("pk", flat=True))
    assert len(new_ids) == 2 and min(new_ids) > max(row[0] for row in before)
