"""Testsets REST API: create (JSON or upload), versions, rows, streaming export, roles."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from runs import models
from runs import testsets as ts

ROWS = [
    {"country": "France", "correct_answer": "Paris"},
    {"country": "Japan", "correct_answer": "Tokyo", "meta": {"tags": ["asia"]}},
]


@pytest.fixture
def capitals(project):
    return ts.testset_create(project=project, name="Capitals", rows=ROWS)


def test_it_creates_from_json_rows(api):
    response = api.post(
        "/api/v1/testsets", {"name": "Capitals", "rows": ROWS, "message": "first"}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    assert (body["slug"], body["version"], body["row_count"]) == ("capitals", 1, 2)
    assert body["columns"] == ["country", "correct_answer", "meta"]
    assert body["head"]["message"] == "first" and body["head"]["created_by"] == "bob"
    assert body["head"]["slug"] == "capitals-v1"


def test_it_creates_from_an_uploaded_file(api):
    upload = SimpleUploadedFile("qa.jsonl", b'{"q": "1+1", "a": {"value": 2}}\n')
    response = api.post("/api/v1/testsets", {"file": upload}, format="multipart")
    assert response.status_code == 201
    assert (response.json()["name"], response.json()["columns"]) == ("qa", ["q", "a"])
    rows = api.get("/api/v1/testsets/qa/rows").json()["results"]
    assert rows == [{"index": 0, "data": {"q": "1+1", "a": {"value": 2}}}]


def test_it_honours_an_explicit_format(api):
    upload = SimpleUploadedFile("export.txt", b'[{"a": 1}]')
    response = api.post(
        "/api/v1/testsets", {"file": upload, "format": "json", "name": "A"}, format="multipart"
    )
    assert response.status_code == 201 and response.json()["row_count"] == 1


def test_it_names_the_row_of_a_bad_upload(api, project):
    upload = SimpleUploadedFile("bad.csv", b"a,b\n1,2\n3\n")
    response = api.post("/api/v1/testsets", {"file": upload}, format="multipart")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["fields"]["file"] == [
        "row 2 (line 3): expected 2 columns as in the header, found 1"
    ]
    assert error["message"].startswith("file: row 2 (line 3)")
    assert not project.testsets.exists()


def test_it_names_the_bad_row_sent_as_json(api):
    response = api.post("/api/v1/testsets", {"name": "X", "rows": [{}, 3]}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["rows"] == [
        "row 2: expected a JSON object, got a number"
    ]


def test_it_retrieves_by_slug_or_id_and_lists_with_search(api, capitals, project):
    ts.testset_create(project=project, name="Other", rows=[{"x": 1}])
    by_id = api.get(f"/api/v1/testsets/{capitals.pk}").json()
    assert by_id == api.get("/api/v1/testsets/capitals").json()
    assert by_id["head"]["columns"] == ["country", "correct_answer", "meta"]
    listed = api.get("/api/v1/testsets?search=capi").json()["results"]
    assert [t["slug"] for t in listed] == ["capitals"]


def test_it_renames_without_a_new_version(api, capitals):
    response = api.patch("/api/v1/testsets/capitals", {"name": "World"}, format="json")
    assert response.status_code == 200
    assert (response.json()["name"], response.json()["version"]) == ("World", 1)


def test_it_pages_rows_by_limit_and_offset(api, project):
    ts.testset_create(project=project, name="Many", rows=[{"i": i} for i in range(5)])
    page = api.get("/api/v1/testsets/many/rows?limit=2&offset=2").json()
    assert [row["data"]["i"] for row in page["results"]] == [2, 3]
    assert (page["count"], page["version"], page["columns"]) == (5, 1, ["i"])
    assert page["next"].endswith("offset=4") and "offset" not in page["previous"]
    last = api.get(page["next"]).json()
    assert [row["index"] for row in last["results"]] == [4] and last["next"] is None


def test_it_adds_edits_and_deletes_rows_as_new_versions(api, capitals):
    added = api.post(
        "/api/v1/testsets/capitals/rows", {"rows": [{"country": "Peru"}]}, format="json"
    )
    assert added.status_code == 201 and added.json()["version"] == 2
    edited = api.patch(
        "/api/v1/testsets/capitals/rows/2",
        {"data": {"correct_answer": "Lima"}, "merge": True, "message": "fix"},
        format="json",
    )
    assert edited.json()["version"] == 3 and edited.json()["head"]["message"] == "fix"
    assert api.get("/api/v1/testsets/capitals/rows/2").json()["data"] == {
        "country": "Peru",
        "correct_answer": "Lima",
    }
    deleted = api.delete("/api/v1/testsets/capitals/rows/0?message=gone")
    assert deleted.status_code == 200 and deleted.json()["row_count"] == 2
    versions = api.get("/api/v1/testsets/capitals/versions").json()["results"]
    assert [(v["version"], v["row_count"]) for v in versions] == [(4, 2), (3, 3), (2, 3), (1, 2)]
    old = api.get("/api/v1/testsets/capitals/rows?version=1").json()
    assert [row["data"] for row in old["results"]] == ROWS


def test_it_replaces_rows_from_json_or_a_file(api, capitals):
    response = api.put("/api/v1/testsets/capitals/rows", {"rows": [{"x": 1}]}, format="json")
    assert response.status_code == 200 and response.json()["columns"] == ["x"]
    upload = SimpleUploadedFile("v3.csv", b"y\n1\n2\n")
    response = api.put("/api/v1/testsets/capitals/rows", {"file": upload}, format="multipart")
    assert (response.json()["version"], response.json()["row_count"]) == (3, 2)
    assert response.json()["head"]["message"] == "Uploaded v3.csv"


def test_it_refuses_a_stale_base_version(api, capitals):
    api.delete("/api/v1/testsets/capitals/rows/0")
    response = api.patch(
        "/api/v1/testsets/capitals/rows/0", {"data": {"a": 1}, "base_version": 1}, format="json"
    )
    assert response.status_code == 400
    assert "base_version" in response.json()["error"]["fields"]


def test_it_answers_404_for_a_missing_row_or_version(api, capitals):
    assert api.get("/api/v1/testsets/capitals/rows/7").status_code == 404
    assert (
        api.patch("/api/v1/testsets/capitals/rows/7", {"data": {}}, format="json").status_code
        == 404
    )
    assert api.delete("/api/v1/testsets/capitals/rows/7").status_code == 404
    assert api.get("/api/v1/testsets/capitals/rows?version=9").status_code == 404


@pytest.mark.parametrize(
    ("fmt", "content_type"),
    [("csv", "text/csv"), ("json", "application/json"), ("jsonl", "application/x-ndjson")],
)
def test_it_streams_an_export_that_uploads_back_the_same(api, capitals, fmt, content_type):
    response = api.get(f"/api/v1/testsets/capitals/export?format={fmt}")
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith(content_type)
    assert response["Content-Disposition"] == f'attachment; filename="capitals-v1.{fmt}"'
    content = b"".join(response.streaming_content)
    upload = SimpleUploadedFile(f"again.{fmt}", content)
    again = api.post("/api/v1/testsets", {"file": upload}, format="multipart").json()
    rows = api.get(f"/api/v1/testsets/{again['slug']}/rows").json()["results"]
    expected = [ROWS[0] | {"meta": ""}, ROWS[1]] if fmt == "csv" else ROWS
    assert [row["data"] for row in rows] == expected


def test_it_exports_an_old_version_and_refuses_an_unknown_format(api, capitals):
    api.delete("/api/v1/testsets/capitals/rows/0")
    response = api.get("/api/v1/testsets/capitals/export?format=json&version=1")
    assert len(json.loads(b"".join(response.streaming_content))) == 2
    response = api.get("/api/v1/testsets/capitals/export?format=xlsx")
    assert response.status_code == 400 and "format" in response.json()["error"]["fields"]


def test_it_deletes_a_testset_unless_a_run_uses_it(api, capitals, project):
    run = models.Run.objects.create(project=project, name="Nightly", testset_version=capitals.head)
    response = api.delete("/api/v1/testsets/capitals")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "non_field_errors: 1 run uses this testset (v1); delete those runs first."
    )
    run.delete()
    assert api.delete("/api/v1/testsets/capitals").status_code == 204
    assert api.get("/api/v1/testsets/capitals").status_code == 404


def test_it_hides_other_projects_testsets(outsider_api, capitals):
    for url in (
        "/api/v1/testsets/capitals",
        f"/api/v1/testsets/{capitals.pk}",
        "/api/v1/testsets/capitals/rows",
        "/api/v1/testsets/capitals/versions",
        "/api/v1/testsets/capitals/export?format=csv",
    ):
        assert outsider_api.get(url).status_code == 404, url
    assert outsider_api.delete("/api/v1/testsets/capitals").status_code == 404
    assert outsider_api.get("/api/v1/testsets").json()["results"] == []


def test_it_lets_a_viewer_read_but_not_write(viewer_api, capitals):
    assert viewer_api.get("/api/v1/testsets/capitals/rows").status_code == 200
    assert viewer_api.get("/api/v1/testsets/capitals/export").status_code == 200
    writes = [
        viewer_api.post("/api/v1/testsets", {"name": "X", "rows": []}, format="json"),
        viewer_api.patch("/api/v1/testsets/capitals", {"name": "Y"}, format="json"),
        viewer_api.post("/api/v1/testsets/capitals/rows", {"rows": [{}]}, format="json"),
        viewer_api.patch("/api/v1/testsets/capitals/rows/0", {"data": {}}, format="json"),
        viewer_api.delete("/api/v1/testsets/capitals/rows/0"),
        viewer_api.delete("/api/v1/testsets/capitals"),
    ]
    assert [response.status_code for response in writes] == [403] * 6
    assert capitals.versions.count() == 1
