"""The scenario table's read path: sorted by a metric from the read model through its index,
paged by keyset (cursors) in both directions, filtered, counted cheaply; pages whose query
count does not grow with the run; and the API that lists a run's scenarios the same way."""

import re

import pytest
from django.db import connection, reset_queries
from django.test.utils import CaptureQueriesContext

from evaluators.services import evaluator_create
from runs import metrics
from runs.applications import application_create
from runs.engine import (
    results_log,
    run_create,
    run_create_logged,
    run_execute_inline,
    scenarios_add,
)
from runs.models import Run
from runs.selectors import Cursor, TableQuery, table_page
from tests.runs.factories import make_testset

OUTPUTS = {
    "type": "object",
    "properties": {"score": {"type": "number"}, "success": {"type": "boolean"}},
}
ERROR = {"code": "evaluator_exception", "message": "boom"}
# Scenario index -> what the judge logged: a score, an error, or nothing yet (None).
CELLS = {
    0: 0.5,
    1: 0.1,
    2: ERROR,
    3: 0.9,
    4: None,
    5: 0.1,
    6: 0.7,
    7: ERROR,
    8: 0.3,
    9: None,
    10: 0.9,
    11: 0.2,
    12: 0.6,
}


@pytest.fixture
def judged(project):
    """A logged run of 13 scenarios judged as ``CELLS`` says, its read model refreshed."""
    judge = evaluator_create(
        project=project, kind="feedback", name="Judge", outputs_schema=OUTPUTS
    ).head
    app = application_create(project=project, name="Logged", kind="logged")
    run = run_create_logged(project=project, name="judged", application=app, revisions=[judge])
    scenarios_add(
        run=run,
        rows=[
            {"inputs": {"q": f"question {i}", "city": "Lisbon" if i % 4 == 0 else ""}}
            for i in CELLS
        ],
    )
    steps = {s.type: s.key for s in run.steps.all()}
    step = steps["annotation"]
    entries = []
    for index, cell in CELLS.items():
        entries += [
            {"scenario": index, "step_key": steps["input"]},
            {"scenario": index, "step_key": steps["invocation"], "outputs": f"answer {index}"},
        ]
        if isinstance(cell, float):
            entries.append(
                {
                    "scenario": index,
                    "step_key": step,
                    "outputs": {"score": cell, "success": cell >= 0.5},
                }
            )
        elif cell is not None:
            entries.append({"scenario": index, "step_key": step, "error": cell})
    results_log(run=run, entries=entries)
    run = Run.objects.get(pk=run.pk)
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.run_refresh(run=run)
    return Run.objects.get(pk=run.pk)


def _order(desc: bool, keep=lambda index: True) -> list[int]:
    """The table's order: scored scenarios by score (ties by index, both reversed descending),
    then those with an error, then those not judged yet, each by index in both directions."""
    scored = sorted(
        (i for i, c in CELLS.items() if isinstance(c, float) and keep(i)),
        key=lambda i: (CELLS[i], i),
        reverse=desc,
    )
    errored = [i for i, c in CELLS.items() if isinstance(c, dict) and keep(i)]
    waiting = [i for i, c in CELLS.items() if c is None and keep(i)]
    return scored + errored + waiting


def _walk_forward(run, query, limit):
    pages, cursor = [], None
    while True:
        page = table_page(run, query, cursor=cursor, limit=limit)
        pages.append(page)
        if page.next is None:
            return pages
        cursor = Cursor.decode(page.next.encode())  # as a link carries it


def _indexes(pages) -> list[int]:
    return [s.index for page in pages for s in page.scenarios]


@pytest.mark.parametrize("desc", [False, True])
def test_it_sorts_by_a_metric_with_errors_and_unjudged_scenarios_after_the_scores(judged, desc):
    page = table_page(judged, TableQuery(sort="judge.score", desc=desc), limit=50)
    assert [s.index for s in page.scenarios] == _order(desc)
    assert page.total == len(CELLS) and page.next is None and page.previous is None


@pytest.mark.parametrize("desc", [False, True])
@pytest.mark.parametrize("limit", [1, 3, 4, 13])
def test_it_pages_by_cursor_over_every_scenario_once_forward_and_back(judged, desc, limit):
    query = TableQuery(sort="judge.score", desc=desc)
    forward = _walk_forward(judged, query, limit)
    assert _indexes(forward) == _order(desc)
    assert [p.rank for p in forward] == list(range(0, len(CELLS), limit))
    backward, page = [], forward[-1]
    while page.previous is not None:
        page = table_page(judged, query, cursor=Cursor.decode(page.previous.encode()), limit=limit)
        backward.insert(0, page)
    assert _indexes(backward) == _indexes(forward[:-1])
    assert [p.rank for p in backward] == [p.rank for p in forward[:-1]]


@pytest.mark.parametrize("desc", [False, True])
def test_it_pages_by_index_with_cursors_too(judged, desc):
    forward = _walk_forward(judged, TableQuery(desc=desc), 5)
    assert _indexes(forward) == sorted(CELLS, reverse=desc)


def test_an_input_column_sorts_in_full_and_its_cursors_still_cover_every_row(judged):
    query = TableQuery(sort="inputs", desc=True)
    forward = _walk_forward(judged, query, 4)
    assert _indexes(forward) == sorted(CELLS, key=lambda i: f"question {i}", reverse=True)
    back = table_page(judged, query, cursor=forward[-1].previous, limit=4)
    assert [s.index for s in back.scenarios] == [s.index for s in forward[-2].scenarios]


def test_an_old_page_number_reads_the_same_rows_as_the_cursor_that_leads_there(judged):
    query = TableQuery(sort="judge.score", desc=True)
    second = table_page(judged, query, cursor=table_page(judged, query, limit=4).next, limit=4)
    numbered = table_page(judged, query, offset=4, limit=4)
    assert [s.index for s in numbered.scenarios] == [s.index for s in second.scenarios]
    assert numbered.rank == second.rank == 4
    # Deep in the unscored scenarios by number, then onwards by cursor: nothing twice.
    last = table_page(judged, query, offset=10, limit=5)
    assert [s.index for s in last.scenarios] == _order(True)[10:]


@pytest.mark.parametrize(
    ("params", "keep"),
    [
        ({"errors": "1"}, lambda i: isinstance(CELLS[i], dict)),
        ({"failed": "1"}, lambda i: isinstance(CELLS[i], float) and CELLS[i] < 0.5),
        ({"column": "judge.score", "low": "0.2", "high": "0.7"}, lambda i: _within(i, 0.2, 0.7)),
        ({"column": "judge.success", "low": "1"}, lambda i: _within(i, 0.5, 1)),
        ({"q": "lisbon"}, lambda i: i % 4 == 0),
        ({"q": "lisbon", "failed": "1"}, lambda i: i == 8),
        ({"q": "question 1", "column": "judge.score", "low": "0.15"}, lambda i: i >= 10),
        ({"q": "answer 1"}, lambda i: i == 1 or i >= 10),
    ],
)
@pytest.mark.parametrize("desc", [False, True])
def test_filters_combine_with_the_sort_and_the_cursors(judged, params, keep, desc):
    query = TableQuery.from_params({**params, "sort": f"{'-' if desc else ''}judge.score"})
    pages = _walk_forward(judged, query, 2)
    assert _indexes(pages) == _order(desc, keep)
    assert pages[0].total == len(_order(desc, keep))
    by_index = _walk_forward(judged, TableQuery.from_params(params), 2)
    assert _indexes(by_index) == sorted(_order(desc, keep))


def _within(index: int, low: float, high: float) -> bool:
    return isinstance(CELLS[index], float) and low <= CELLS[index] <= high


def test_the_unfiltered_total_is_the_runs_own_count_not_a_count_of_its_rows(judged):
    with CaptureQueriesContext(connection) as queries:
        page = table_page(judged, TableQuery(sort="judge.score"), limit=5)
    assert page.total == judged.scenario_count == len(CELLS)
    assert not [q for q in queries.captured_queries if "count(" in q["sql"].lower()]


def test_it_refuses_a_cursor_or_a_column_it_cannot_read(owner_client, judged):
    url = f"/p/acme/runs/{judged.pk}/"
    for params, field in [
        ("cursor=a0~5~3", "cursor"),
        ("cursor=a0~5~3~nan~", "cursor"),
        ("sort=judge.score&cursor=a0~1~3~~", "cursor"),  # a row of the index order
        ("sort=nope", "sort"),
        ("column=q&low=1", "column"),
        ("q=a%00b", "q"),
    ]:
        response = owner_client.get(f"{url}?{params}")
        assert response.status_code == 400, params
        assert field in response.content.decode()
    # The export is refused before it streams: no 200 whose body breaks off.
    response = owner_client.get(f"{url}export?format=csv&q=%00")
    assert response.status_code == 400
    assert "NUL" in response.content.decode()


def test_the_second_page_of_a_plain_table_links_back_to_the_first(owner_client, project):
    run = _engine_run(project, 70, *_app_and_judge(project))
    fragment = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    url = f"/p/acme/runs/{run.pk}/"
    first = owner_client.get(url, **fragment).content.decode()
    second = owner_client.get(url + _link(first, "next"), **fragment).content.decode()
    assert "51–70 of 70" in second and 'rel="next"' not in second
    assert _link(second, "prev") == "?"  # no filter, no sort: the page itself
    back = owner_client.get(url + _link(second, "prev"), **fragment).content.decode()
    assert _rows(back) == _rows(first) and "1–50 of 70" in back


def test_the_pages_links_carry_cursors_and_read_both_ways(owner_client, project):
    run = _engine_run(project, 120, *_app_and_judge(project))
    fragment = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    url = f"/p/acme/runs/{run.pk}/"
    first = owner_client.get(f"{url}?sort=-exact.success", **fragment).content.decode()
    assert "page 1 of 3" in first and 'rel="prev"' not in first
    second = owner_client.get(url + _link(first, "next"), **fragment).content.decode()
    assert "51–100 of 120" in second and "cursor=" in _link(second, "next")
    third = owner_client.get(url + _link(second, "next"), **fragment).content.decode()
    assert "101–120 of 120" in third and 'rel="next"' not in third
    back = owner_client.get(url + _link(third, "prev"), **fragment).content.decode()
    assert _rows(back) == _rows(second)
    assert "cursor=" not in _link(second, "prev")  # the first page is a plain link


def _link(html: str, rel: str) -> str:
    anchor = html[: html.index(f'rel="{rel}"')]
    href = anchor[anchor.rindex('href="') + 6 :]
    return href[: href.index('"')].replace("&amp;", "&")


def _rows(html: str) -> list[str]:
    return [part.split("/")[0] for part in html.split("/scenarios/")[1:]]


def _app_and_judge(project):
    app = application_create(
        project=project, name="QA", kind="column", config={"outputs_column": "outputs"}
    )
    return app, evaluator_create(project=project, kind="exact_match", name="Exact").head


def _engine_run(project, size: int, app, exact) -> Run:
    """A run of ``size`` scenarios through the engine: a third right, a few without truth."""
    rows = [
        {"country": f"country {i}", "correct_answer": f"city {i}", "outputs": f"city {i % 3}"}
        for i in range(size)
    ]
    for row in rows[1::7]:
        del row["correct_answer"]  # exact match errors
    version = make_testset(project, rows, slug=f"rows-{size}")
    run = run_create(
        project=project,
        name=f"run of {size}",
        testset_version=version,
        application=app,
        revisions=[exact],
    )
    return run_execute_inline(run=run)


def _queries(client, url: str, **headers) -> int:
    client.get(url, **headers)  # the first visit of a project writes the session
    reset_queries()
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url, **headers).status_code == 200
    return len(queries)


def test_the_pages_query_counts_do_not_grow_with_the_run(owner_client, project):
    fragment = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    counts, judge = {}, _app_and_judge(project)
    for size in (3, 30):
        run = _engine_run(project, size, *judge)
        base = f"/p/acme/runs/{run.pk}/"
        counts[size] = {
            "run page": _queries(owner_client, base),
            "table sorted by a metric": _queries(
                owner_client, f"{base}?sort=-exact.success", **fragment
            ),
            "table filtered": _queries(
                owner_client, f"{base}?q=country&column=exact.success&low=0", **fragment
            ),
            "drill-in": _queries(owner_client, f"{base}scenarios/1/"),
        }
    assert counts[3] == counts[30]


# --- the API lists a run's scenarios the same way -------------------------------------------------


def test_the_api_pages_a_sorted_filtered_table_by_its_next_links(api, judged):
    url = f"/api/v1/runs/{judged.pk}/scenarios?sort=-judge.score&limit=4"
    seen, pages = [], 0
    while url:
        body = api.get(url).json()
        assert body["count"] == len(CELLS)
        seen += [row["index"] for row in body["rows"]]
        url, pages = body["next"], pages + 1
    assert seen == _order(True) and pages == 4
    errored = api.get(f"/api/v1/runs/{judged.pk}/scenarios?errors=1").json()
    assert [r["index"] for r in errored["rows"]] == [2, 7] and errored["next"] is None
    assert errored["rows"][0]["errors"]["judge.score"]["code"] == "evaluator_exception"
    assert "judge.score" not in errored["rows"][0]["values"]  # an error is never a score


def test_the_api_walks_back_by_its_previous_links(api, judged):
    url = f"/api/v1/runs/{judged.pk}/scenarios?sort=judge.score&limit=5"
    last = api.get(api.get(api.get(url).json()["next"]).json()["next"]).json()
    middle = api.get(last["previous"]).json()
    first = api.get(middle["previous"]).json()
    assert [r["index"] for r in first["rows"] + middle["rows"] + last["rows"]] == _order(False)
    assert "cursor" not in middle["previous"] and first["previous"] is None


def test_the_api_keeps_its_offset_and_limit(api, judged):
    body = api.get(f"/api/v1/runs/{judged.pk}/scenarios?offset=10&limit=2").json()
    assert [r["index"] for r in body["rows"]] == [10, 11]
    assert body["count"] == len(CELLS) and "offset" not in body["next"]
    assert [r["index"] for r in api.get(body["next"]).json()["rows"]] == [12]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ("cursor=oops", "cursor"),
        ("cursor=a0~1~2~inf~", "cursor"),
        ("sort=judge.nope", "sort"),
        ("column=judge.score&low=high", "low"),
        ("column=q&high=2", "column"),
        ("offset=-1", "offset"),
        ("offset=" + "9" * 5000, "offset"),
        ("limit=18446744073709551616", "limit"),
    ],
)
def test_the_api_names_a_parameter_it_cannot_read(api, judged, params, field):
    response = api.get(f"/api/v1/runs/{judged.pk}/scenarios?{params}")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


# --- the page reads its rows through an index ------------------------------------------------------


@pytest.fixture
def big(judged):
    """The judged run grown to 20,000 scenarios, values and all, in SQL, then analyzed: enough
    rows that a plan reading the whole run would cost the planner more than the index."""
    step = judged.steps.get(type="annotation").key
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_scenario (project_id, run_id, index, inputs, status, created_at,"
            " updated_at) SELECT %s, %s, g, '{}', 'success', now(), now()"
            " FROM generate_series(100, 20099) g",
            [judged.project_id, judged.pk],
        )
        cursor.execute(
            "INSERT INTO runs_scenariovalue (run_id, scenario_id, index, step_key, key, value,"
            " errors) SELECT s.run_id, s.id, s.index, %s, 'score', random(), 0"
            " FROM runs_scenario s WHERE s.run_id = %s AND s.index >= 100",
            [step, judged.pk],
        )
        cursor.execute("ANALYZE runs_scenario; ANALYZE runs_scenariovalue")
    Run.objects.filter(pk=judged.pk).update(scenario_count=len(CELLS) + 20_000)
    return Run.objects.get(pk=judged.pk)


@pytest.mark.parametrize("sort", ["judge.score", "-judge.score", "", "-index"])
def test_a_sorted_page_reads_its_rows_through_an_index_without_sorting_the_run(big, sort):
    query = TableQuery.from_params({"sort": sort})
    cursor = table_page(big, query, offset=1000, limit=50).next
    with CaptureQueriesContext(connection) as queries:
        page = table_page(big, query, cursor=cursor, limit=50)
    assert len(page.scenarios) == 50 and page.rank == 1050
    [read] = [q["sql"] for q in queries.captured_queries if " LIMIT " in q["sql"]]
    with connection.cursor() as db:
        db.execute(f"EXPLAIN {read}")
        plan = "\n".join(row[0] for row in db.fetchall())
    index = "scenariovalue_sort" if "score" in sort else "scenario_unique_index"
    backward = " Backward" if sort.startswith("-") else ""
    assert re.search(f"Index (Only )?Scan{backward} using {index}", plan), plan
    assert "Sort" not in plan.replace("scenariovalue_sort", ""), plan
    assert "Seq Scan" not in plan, plan
