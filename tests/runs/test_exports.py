"""CSV and JSONL exports of a run's scenario table, of a comparison and of a testset, on the pages
and the API: built by PostgreSQL and streamed in chunks, the run page's filters respected,
errors exported as errors (never 0), each cell as the table (or the comparison page) reads it,
a fixed number of queries whatever the rows, and the query cancelled when the client leaves."""

from __future__ import annotations

import csv
import io
import json

import psycopg
import pytest
from django.db import connection
from django.http import QueryDict, StreamingHttpResponse
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import bulk, compare, exports, selectors
from runs import testsets as ts
from runs.applications import application_create
from runs.models import Result, Run, Scenario, Testcase
from tests.runs.factories import make_testset
from tests.runs.test_compare import JUDGE_SCHEMA, questions, scored_run, scores


@pytest.fixture
def judge(project):
    from evaluators.services import evaluator_create

    return evaluator_create(
        project=project, kind="feedback", name="Judge", slug="judge", outputs_schema=JUDGE_SCHEMA
    )


@pytest.fixture
def pair(project, judge):
    version = questions(project, 4)
    base = scored_run(project, version, judge.head, scores([0.2, 0.5, 0.9, "boom"]), "Base run")
    cand = scored_run(project, version, judge.head, scores([0.4, 0.5, 0.6, 0.7]), "Cand run")
    return base, cand


def body(response) -> str:
    assert isinstance(response, StreamingHttpResponse) and response.streaming
    return b"".join(response.streaming_content).decode()


def table(response) -> list[dict]:
    return list(csv.DictReader(io.StringIO(body(response))))


def lines(response) -> list[dict]:
    return [json.loads(line) for line in body(response).splitlines()]


def python_csv(rows: list[list]) -> str:
    """CSV as Python's writer writes it (what the exports wrote before PostgreSQL did)."""
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def test_it_exports_a_run_as_csv_with_errors_as_errors(viewer_client, pair):
    run = pair[0]
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=csv")
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-scenarios.csv"'
    text = body(response)
    assert text.startswith(
        "index,status,q,answer,outputs,judge.label,judge.score,judge.success,judge.latency_ms\r\n"
        "0,success,question 0,a0,Base run answer 0,,0.2,false,\r\n"
    )
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["judge.score"] for r in rows] == ["0.2", "0.5", "0.9", "error: boom"]
    assert [r["judge.success"] for r in rows] == ["false", "true", "true", "error: boom"]
    assert rows[3]["status"] == "errors" and rows[0]["outputs"] == "Base run answer 0"


def test_it_exports_a_run_as_jsonl_with_error_objects(viewer_client, pair):
    run = pair[0]
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=jsonl")
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    text = body(response)
    assert text.startswith(
        '{"index": 0, "status": "success", "values": {"q": "question 0", "answer": "a0", '
        '"outputs": "Base run answer 0", "judge.label": null, "judge.score": 0.2, '
        '"judge.success": false, "judge.latency_ms": null}, "errors": {}}\n'
    )
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0]["values"]["judge.score"] == 0.2 and rows[0]["errors"] == {}
    assert "judge.score" not in rows[3]["values"]
    assert rows[3]["errors"]["judge.score"]["code"] == "boom"
    assert rows[3]["errors"]["judge.score"]["message"] == "judge failed"


@pytest.mark.parametrize(
    ("query", "indexes"),
    [
        ("errors=1", [3]),
        ("sort=-judge.score", [2, 1, 0, 3]),
        ("sort=judge.score", [0, 1, 2, 3]),
        ("sort=-q", [3, 2, 1, 0]),
        ("sort=-index", [3, 2, 1, 0]),
        ("column=judge.score&low=0.4", [1, 2]),
        ("column=judge.score&low=0.4&sort=-judge.score", [2, 1]),
        ("failed=1", [0]),
        ("q=answer 1", [1]),
    ],
)
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_it_respects_the_run_pages_filters(viewer_client, pair, query, indexes, fmt):
    run = pair[0]
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format={fmt}&{query}")
    rows = table(response) if fmt == "csv" else lines(response)
    assert [int(r["index"]) for r in rows] == indexes


@pytest.mark.parametrize(
    "query",
    [
        "",
        "sort=-index",
        "sort=judge.score",
        "sort=-judge.score",
        "sort=-judge.success",
        "sort=q",
        "sort=-q",
        "errors=1&sort=-judge.score",
        "column=judge.score&low=0.3&sort=-judge.score",
        "column=judge.score&high=0.5&sort=judge.success",
        "failed=1&sort=-judge.score",
    ],
)
def test_it_orders_rows_as_the_run_page_does(viewer_client, project, judge, query):
    """Ties, errored cells (no value) and cells never judged (not in the read model) fall
    where the page puts them."""
    version = questions(project, 8)
    cells = scores([0.5, 0.2, 0.5, "boom", None, 0.9, 0.5, "late"])
    run = scored_run(project, version, judge.head, cells)
    page = selectors.table_page(run, selectors.TableQuery.from_params(QueryDict(query)), limit=100)
    rows = lines(viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=jsonl&{query}"))
    assert [r["index"] for r in rows] == [s.index for s in page.scenarios]


@pytest.mark.parametrize(
    ("query", "field"),
    [("sort=nope", "sort"), ("sort=judge.label", "sort"), ("column=q&low=1", "column")],
)
def test_it_refuses_a_sort_or_range_the_page_refuses(viewer_client, viewer_api, pair, query, field):
    run = pair[0]
    assert viewer_client.get(f"/p/acme/runs/{run.pk}/export?{query}").status_code == 400
    response = viewer_api.get(f"/api/v1/runs/{run.pk}/export?format=csv&{query}")
    assert response.status_code == 400  # the error as JSON text (exports render no other body)
    assert list(json.loads(response.content)["error"]["fields"]) == [field]


TRICKY = [
    {"q": '=HYPERLINK("http://x")', "answer": 'a, "quoted"\nsecond line'},
    {"q": "-1+2", "answer": {"nested": [1, "x", None], "ok": True}},
    {"q": None, "answer": ""},
    {"q": 3, "answer": "h\u00e9llo \u2603 \t tab"},
    {"q": "@sum", "answer": 2.5},
]
OUTPUTS = ["+cmd", {"text": "hi", "n": 1}, None, 42, "plain"]


@pytest.fixture
def tricky(project, judge):
    """A run whose inputs and outputs hold what CSV and spreadsheets trip on, with values of
    every JSON type, an error, an error without a code and a cell never judged."""
    from runs.engine import results_log, run_close, run_create_logged

    version = make_testset(project, TRICKY, "tricky")
    app = application_create(project=project, name="Logged", slug="logged", kind="logged")
    run = run_create_logged(
        project=project, name="tricky", testset_version=version, application=app,
        revisions=[judge.head],
    )  # fmt: skip
    steps = {s.type: s.key for s in run.steps.all()}
    judged = [
        {"outputs": {"score": 1, "success": True, "label": "good"}},
        {"outputs": {"score": 0.25, "success": False, "latency_ms": 12.5}},
        {"error": {"code": "boom", "message": "judge failed"}},
        None,  # never judged: no value, no error
        {"error": {"message": "no code"}},
    ]
    entries = []
    for i, (outputs, cell) in enumerate(zip(OUTPUTS, judged, strict=True)):
        entries += [
            {"scenario": i, "step_key": steps["input"]},
            {"scenario": i, "step_key": steps["invocation"], "outputs": outputs},
        ]
        if cell:
            entries.append({"scenario": i, "step_key": steps["annotation"], **cell})
    results_log(run=run, entries=entries)
    Result.objects.filter(run=run, scenario__index=4, step_key=steps["annotation"]).update(
        error={"message": "no code"}
    )
    return run_close(run=run)


def table_rows(run: Run) -> list[dict]:
    """The scenario table's rows, read the way the run page reads them."""
    return selectors.scenario_rows(run, list(Scenario.objects.filter(run=run).order_by("index")))


def test_it_writes_each_cell_as_the_table_reads_it(viewer_client, tricky):
    run = tricky
    names = [m["column"]["name"] for m in run.mappings]
    expected = [
        {
            "index": row["scenario"].index,
            "status": row["scenario"].status,
            "values": row["values"],
            "errors": row["errors"],
        }
        for row in table_rows(run)
    ]
    got = lines(viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=jsonl"))
    assert got == expected
    assert got[0]["values"]["q"] == '=HYPERLINK("http://x")'  # JSONL is exact
    assert (
        got[2]["errors"]["judge.score"]["code"] == "boom" and "judge.score" not in got[2]["values"]
    )
    assert "judge.score" not in got[3]["values"] and got[3]["errors"] == {}  # never judged
    assert got[4]["errors"]["judge.score"] == {"message": "no code"}

    text = body(viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=csv"))
    assert text == python_csv(
        [
            ["index", "status", *names],
            *(
                [
                    row["index"],
                    row["status"],
                    *(
                        exports.csv_error(row["errors"][name])
                        if name in row["errors"]
                        else exports.csv_cell(row["values"].get(name))
                        for name in names
                    ),
                ]
                for row in expected
            ),
        ]
    )
    cells = list(csv.DictReader(io.StringIO(text)))
    assert [c["q"] for c in cells] == ['\'=HYPERLINK("http://x")', "'-1+2", "", "3", "'@sum"]
    assert cells[0]["outputs"] == "'+cmd" and cells[1]["outputs"] == '{"n": 1, "text": "hi"}'
    assert cells[0]["judge.score"] == "1" and cells[1]["judge.latency_ms"] == "12.5"
    assert cells[4]["judge.score"] == "error: error"


def test_it_streams_in_chunks_of_whole_rows(viewer_client, project, judge, monkeypatch):
    monkeypatch.setattr(bulk, "COPY_CHUNK_BYTES", 1000)
    version = questions(project, 30)
    run = scored_run(project, version, judge.head, scores([i / 30 for i in range(30)]))
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=jsonl&sort=-judge.score")
    stream = response.streaming_content
    assert not isinstance(stream, str | bytes | list)  # a generator, not the file in memory
    chunks = list(stream)
    assert len(chunks) > 5 and all(chunk.endswith(b"\n") for chunk in chunks)
    assert all(len(chunk) < 1000 + 500 for chunk in chunks)  # a chunk and at most one row more
    rows = [json.loads(line) for chunk in chunks for line in chunk.decode().splitlines()]
    assert [r["index"] for r in rows] == list(range(29, -1, -1))


@pytest.mark.parametrize(
    "db_mode",
    [
        pytest.param("transaction", marks=pytest.mark.django_db),
        pytest.param("autocommit", marks=pytest.mark.django_db(transaction=True)),
    ],
)
def test_its_planner_settings_hold_while_it_streams_and_end_with_it(
    viewer_client, project, judge, db_mode, monkeypatch
):
    """An export plans without JIT and Memoize, with more work_mem: its settings are in force
    while the COPY streams (one more, application_name, shows it to another connection); the
    connection goes back to its own settings for the next request's queries, in a transaction
    (set for it alone) as in autocommit."""
    assert bulk._EXPORT_PLANNER == {"jit": "off", "enable_memoize": "off", "work_mem": "16MB"}
    monkeypatch.setitem(bulk._EXPORT_PLANNER, "application_name", "evalsite-export-under-test")

    def settings() -> tuple:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('jit'), current_setting('enable_memoize'),"
                " current_setting('work_mem'), current_setting('application_name')"
            )
            return cursor.fetchone()

    run = scored_run(project, questions(project, 1), judge.head, [None], "big")
    with connection.cursor() as cursor:  # more rows than the sockets hold: it streams a while
        cursor.execute(
            "INSERT INTO runs_scenario (project_id, run_id, index, inputs, status, created_at,"
            " updated_at) SELECT %s, %s, g, jsonb_build_object('q', repeat('x', 20000) || g),"
            " 'success', now(), now() FROM generate_series(1, 2000) g",
            [project.pk, run.pk],
        )
    before = settings()
    assert before[1] == "on" and before[2] != "16MB"  # what the export changes, to change back
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=csv")
    stream = iter(response.streaming_content)
    assert next(stream).startswith(b"index,status,q,")
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as watcher:
        exporting = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY (SELECT%%'"
            " AND application_name = 'evalsite-export-under-test'"
        ).fetchone()[0]
    assert exporting == 1
    assert sum(chunk.count(b"\r\n") for chunk in stream) > 1000
    assert settings() == before


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_it_reads_as_many_queries_for_30_rows_as_for_3(viewer_client, project, judge, fmt):
    counts = []
    for n in (3, 30):
        version = questions(project, n, slug=f"qa{n}")
        run = scored_run(project, version, judge.head, scores([i / n for i in range(n)]))
        body(viewer_client.get(f"/p/acme/runs/{run.pk}/export?format={fmt}"))  # sessions, caches
        with CaptureQueriesContext(connection) as queries:
            response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format={fmt}")
            assert len(body(response).splitlines()) == n + (fmt == "csv")
        counts.append(len(queries))
        assert [q["sql"][:6] for q in queries.captured_queries].count("COPY (") == 1
    assert counts[0] == counts[1]


@pytest.mark.django_db(transaction=True)
def test_it_cancels_the_query_when_the_client_goes_away(viewer_client, project, judge):
    """Far more rows than the sockets hold: after the first chunk PostgreSQL is still writing,
    until the response is closed (what a WSGI server does when the client disconnects)."""
    version = questions(project, 1)
    run = scored_run(project, version, judge.head, [None], "big")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_scenario (project_id, run_id, index, inputs, status, created_at,"
            " updated_at) SELECT %s, %s, g, jsonb_build_object('q', repeat('x', 20000) || g),"
            " 'success', now(), now() FROM generate_series(1, 4000) g",
            [project.pk, run.pk],
        )
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=csv")
    stream = iter(response.streaming_content)
    assert next(stream).startswith(b"index,status,q,")
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as watcher:

        def exporting() -> int:
            return watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                " AND query LIKE 'COPY (SELECT%%' AND pid <> pg_backend_pid()"
            ).fetchone()[0]

        assert exporting() == 1
        response.close()
        assert exporting() == 0
    with connection.cursor() as cursor:  # the connection is clean for its next use
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_it_guards_csv_cells_against_formulas():
    assert exports.csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert exports.csv_cell(-0.5) == "-0.5" and exports.csv_cell({"a": 1}) == '{"a": 1}'
    assert exports.csv_cell(None) == "" and exports.csv_cell(True) == "true"


def test_it_refuses_unknown_formats_and_other_projects(viewer_client, outsider_api, pair):
    run = pair[0]
    assert viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=xlsx").status_code == 400
    assert outsider_api.get(f"/api/v1/runs/{run.pk}/export?format=csv").status_code == 404


def test_it_exports_a_run_through_the_api(viewer_api, pair):
    run = pair[0]
    rows = table(viewer_api.get(f"/api/v1/runs/{run.pk}/export?format=csv&errors=1"))
    assert [(r["index"], r["judge.score"]) for r in rows] == [("3", "error: boom")]
    response = viewer_api.get(f"/api/v1/runs/{run.pk}/export?format=jsonl")
    assert response.status_code == 200 and len(lines(response)) == 4
    by_accept = viewer_api.get(f"/api/v1/runs/{run.pk}/export", HTTP_ACCEPT="application/x-ndjson")
    assert by_accept["Content-Type"].startswith("application/x-ndjson")


# --- a comparison -------------------------------------------------------------------------------


def test_it_exports_a_comparison_as_csv(viewer_client, pair):
    base, cand = pair
    response = viewer_client.get(
        f"/p/acme/runs/compare/export?runs={base.pk},{cand.pk}&metric=judge.score&format=csv"
    )
    rows = table(response)
    assert list(rows[0]) == [
        "index",
        "q",
        "answer",
        f"outputs [run {base.pk}]",
        f"outputs [run {cand.pk}]",
        f"judge.score [run {base.pk}]",
        f"judge.score [run {cand.pk}]",
        f"judge.score delta [run {cand.pk} - run {base.pk}]",
    ]
    delta = f"judge.score delta [run {cand.pk} - run {base.pk}]"
    assert [r[delta] for r in rows] == ["0.2", "0.0", "-0.3", ""]
    assert rows[3][f"judge.score [run {base.pk}]"] == "error: boom"
    assert rows[3][f"judge.score [run {cand.pk}]"] == "0.7"


def test_it_exports_a_filtered_comparison_as_jsonl(viewer_client, viewer_api, pair):
    base, cand = pair
    query = f"runs={base.pk},{cand.pk}&metric=judge.score&filter=regressions&format=jsonl"
    rows = lines(viewer_client.get(f"/p/acme/runs/compare/export?{query}"))
    assert [r["index"] for r in rows] == [2]
    assert rows[0]["inputs"] == {"q": "question 2", "answer": "a2"}
    assert [c["values"]["judge.score"] for c in rows[0]["runs"]] == [0.9, 0.6]
    assert rows[0]["runs"][1]["deltas"]["judge.score"] == pytest.approx(-0.3)
    api_rows = lines(viewer_api.get(f"/api/v1/runs/compare/export?{query}"))
    assert api_rows == rows
    everything = lines(
        viewer_api.get(f"/api/v1/runs/compare/export?runs={base.pk},{cand.pk}&format=jsonl")
    )
    assert everything[3]["runs"][0]["errors"]["judge.score"]["code"] == "boom"
    assert set(everything[0]["runs"][0]["values"]) == {"judge.score", "judge.success"}


@pytest.fixture
def three(project, judge):
    """Three runs over testsets of 5 and 6 rows (so a row only the last runs have), with
    errors on either side, values moving both ways and a never-judged cell."""
    version = questions(project, 5)
    longer = ts.testset_rows_add(testset=version.testset, rows=[{"q": "q5", "answer": "a5"}])
    return [
        scored_run(project, version, judge.head, scores([0.2, 0.5, 0.9, "boom", 0.4]), "a"),
        scored_run(project, longer, judge.head, scores([0.4, 0.5, 0.6, 0.7, "late", 1]), "b"),
        scored_run(project, longer, judge.head, scores([0.1, None, 0.9, 0.3, 0.4, 0]), "c"),
    ]


def comparison_csv(comparison, rows: list[dict], chosen) -> str:
    """The comparison page's rows as the CSV export wrote them before it was SQL."""
    out = [exports.comparison_header(comparison, chosen)]
    for row in rows:
        cells = row["runs"]
        line = [row["index"], *(exports.csv_cell(v) for v in row["inputs"].values())]
        line += [exports.csv_cell(cell.get("outputs")) for cell in cells]
        for metric in chosen:
            for cell in cells:
                if metric.name in cell["errors"]:
                    line.append(exports.csv_error(cell["errors"][metric.name]))
                else:
                    line.append(exports.csv_cell(cell["values"].get(metric.name)))
            line += [exports.csv_cell(cell["deltas"].get(metric.name)) for cell in cells[1:]]
        out.append(line)
    return python_csv(out)


def test_a_comparison_export_reads_as_many_queries_for_30_rows_as_for_3(
    viewer_client, project, judge
):
    counts = []
    for n in (3, 30):
        version = questions(project, n, slug=f"qa{n}")
        runs = [scored_run(project, version, judge.head, scores([i / n] * n)) for i in (1, 2)]
        url = f"/p/acme/runs/compare/export?runs={runs[0].pk},{runs[1].pk}&format=jsonl"
        body(viewer_client.get(url))  # sessions, caches
        with CaptureQueriesContext(connection) as queries:
            assert len(body(viewer_client.get(url)).splitlines()) == n
        counts.append(len(queries))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("show", ["", "regressions", "improvements", "changed"])
@pytest.mark.parametrize("metric", ["", "judge.score", "judge.success"])
@pytest.mark.parametrize("read_model", ["current", "stale"])
def test_a_comparison_export_has_the_comparison_pages_rows(
    viewer_client, project, three, show, metric, read_model
):
    if read_model == "stale":  # cells landed after the last refresh: both read the results
        Run.objects.filter(pk__in=[r.pk for r in three]).update(progressed_at=timezone.now())
    compare.comparison._CACHE.clear()
    comparison = compare.comparison_get(project=project, run_ids=[str(r.pk) for r in three])
    report = compare.comparison_report(comparison, metric=metric, show=show, limit=1000)
    query = f"runs={','.join(str(r.pk) for r in three)}&metric={metric}&filter={show}"
    got = lines(viewer_client.get(f"/p/acme/runs/compare/export?{query}&format=jsonl"))
    assert got == report["rows"]
    text = body(viewer_client.get(f"/p/acme/runs/compare/export?{query}&format=csv"))
    assert text == comparison_csv(comparison, report["rows"], report["metrics"])
    if not show:
        assert [r["index"] for r in got] == [0, 1, 2, 3, 4, 5]
        assert got[5]["runs"][0] == {
            "run": three[0].pk,
            "present": False,
            "values": {},
            "errors": {},
        }


def test_it_refuses_a_bad_comparison_export(viewer_client, viewer_api, pair):
    ids = ",".join(str(i) for i in range(1, 12))
    assert viewer_client.get(f"/p/acme/runs/compare/export?runs={ids}").status_code == 400
    assert viewer_api.get(f"/api/v1/runs/compare/export?runs={ids}&format=csv").status_code == 400


# --- a testset ------------------------------------------------------------------------------------


def old_testset_csv(rows: list[dict], columns: list[str]) -> str:
    def cell(value):
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return python_csv([columns, *([cell(row.get(c)) for c in columns] for row in rows)])


def test_a_testset_exports_as_python_wrote_it(owner_client, project):
    """Byte for byte what the Python writers made: CSV without a formula guard (it must come
    back in unchanged), JSON keys in column order, extra keys after them."""
    version = make_testset(project, [*TRICKY, {"answer": "b", "q": "late"}, {"z": [1], "q": "x"}])
    version.columns = ["q", "answer"]  # "z" is a key no column names
    version.save(update_fields=["columns"])
    stored = list(
        Testcase.objects.filter(version=version).order_by("index").values_list("data", flat=True)
    )
    columns = ["q", "answer"]
    csv_text = body(owner_client.get("/p/acme/testsets/capitals/export?format=csv"))
    assert csv_text == old_testset_csv(stored, columns)
    assert csv_text.splitlines()[1] == '"=HYPERLINK(""http://x"")","a, ""quoted""'
    ordered = [ts.row_ordered(row, columns) for row in stored]
    jsonl = body(owner_client.get("/p/acme/testsets/capitals/export?format=jsonl"))
    assert jsonl == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered)
    assert json.loads(jsonl.splitlines()[-1]) == {"q": "x", "z": [1]}
    array = body(owner_client.get("/p/acme/testsets/capitals/export?format=json"))
    assert array == "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in ordered) + "\n]\n"


def test_a_one_column_testset_keeps_its_empty_rows(owner_client, project):
    make_testset(project, [{"q": "a"}, {"q": ""}, {"q": None}, {"q": "b"}], "single")
    text = body(owner_client.get("/p/acme/testsets/single/export?format=csv"))
    assert text == 'q\r\na\r\n""\r\n""\r\nb\r\n'
    assert [r["q"] for r in csv.DictReader(io.StringIO(text))] == ["a", "", "", "b"]
