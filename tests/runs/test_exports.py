"""CSV and JSONL exports of a run's scenario table and of a comparison, on the pages and the
API: streamed, the run page's filters respected, errors exported as errors (never 0)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.http import StreamingHttpResponse

from runs import exports
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


def test_it_exports_a_run_as_csv_with_errors_as_errors(viewer_client, pair):
    run = pair[0]
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=csv")
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-scenarios.csv"'
    rows = table(response)
    assert list(rows[0])[:5] == ["index", "status", "q", "answer", "outputs"]
    assert [r["judge.score"] for r in rows] == ["0.2", "0.5", "0.9", "error: boom"]
    assert [r["judge.success"] for r in rows] == ["false", "true", "true", "error: boom"]
    assert rows[3]["status"] == "errors" and rows[0]["outputs"] == "Base run answer 0"


def test_it_exports_a_run_as_jsonl_with_error_objects(viewer_client, pair):
    run = pair[0]
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=jsonl")
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    rows = lines(response)
    assert rows[0]["values"]["judge.score"] == 0.2 and rows[0]["errors"] == {}
    assert "judge.score" not in rows[3]["values"]
    assert rows[3]["errors"]["judge.score"]["code"] == "boom"
    assert rows[3]["errors"]["judge.score"]["message"] == "judge failed"


@pytest.mark.parametrize(
    ("query", "indexes"),
    [
        ("errors=1", [3]),
        ("sort=-judge.score", [2, 1, 0, 3]),
        ("column=judge.score&low=0.4", [1, 2]),
        ("q=answer 1", [1]),
    ],
)
def test_it_respects_the_run_pages_filters(viewer_client, pair, query, indexes):
    run = pair[0]
    rows = table(viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=csv&{query}"))
    assert [int(r["index"]) for r in rows] == indexes


def test_it_streams_in_batches_without_losing_rows(viewer_client, project, judge, monkeypatch):
    monkeypatch.setattr(exports, "BATCH", 7)
    version = questions(project, 30)
    run = scored_run(project, version, judge.head, scores([i / 30 for i in range(30)]))
    response = viewer_client.get(f"/p/acme/runs/{run.pk}/export?format=jsonl&sort=-judge.score")
    chunks = list(response.streaming_content)
    assert len(chunks) == 5  # 30 rows in batches of 7
    rows = [json.loads(line) for chunk in chunks for line in chunk.decode().splitlines()]
    assert [r["index"] for r in rows] == list(range(29, -1, -1))


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


def test_it_refuses_a_bad_comparison_export(viewer_client, viewer_api, pair):
    ids = ",".join(str(i) for i in range(1, 12))
    assert viewer_client.get(f"/p/acme/runs/compare/export?runs={ids}").status_code == 400
    assert viewer_api.get(f"/api/v1/runs/compare/export?runs={ids}&format=csv").status_code == 400
