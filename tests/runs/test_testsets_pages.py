"""Testset pages, full and as HTMX fragments, with and without JavaScript."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from runs import models
from runs import testsets as ts

HTMX = {"HTTP_HX_REQUEST": "true"}
ROWS = [
    {"country": "France", "correct_answer": "Paris"},
    {"country": "Japan", "correct_answer": "Tokyo", "context": {"doc": "x" * 300}},
]


@pytest.fixture
def capitals(project):
    return ts.testset_create(project=project, name="Capitals", rows=ROWS)


def head_of(testset):
    testset.refresh_from_db()
    return testset.head


def test_it_lists_testsets_with_search(owner_client, capitals, project):
    ts.testset_create(project=project, name="Math", rows=[{"q": "1+1"}])
    page = owner_client.get("/p/acme/testsets/?q=capi").content.decode()
    assert "<html" in page and "Capitals" in page and ">Math<" not in page


def test_it_swaps_only_the_table_for_htmx(owner_client, capitals):
    fragment = owner_client.get("/p/acme/testsets/?q=cap", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="testset-table"')
    assert "Capitals" in fragment and "<html" not in fragment


def test_it_uploads_a_file_and_shows_it(owner_client, project):
    upload = SimpleUploadedFile("geo.jsonl", b'{"country": "France", "answer": "Paris"}\n')
    response = owner_client.post("/p/acme/testsets/new", {"file": upload, "format": ""})
    assert response.status_code == 302 and response["Location"] == "/p/acme/testsets/geo/"
    page = owner_client.get(response["Location"]).content.decode()
    assert "Testset geo created with 1 row." in page
    assert "<th>country</th><th>answer</th>" in page and "Paris" in page


def test_it_creates_from_pasted_rows(owner_client, project):
    response = owner_client.post(
        "/p/acme/testsets/new", {"text": "q,a\n1+1,2\n", "name": "Sums", "format": ""}
    )
    assert response.status_code == 302
    assert models.Testset.objects.get(slug="sums").head.row_count == 1


def test_it_shows_a_bad_upload_inline_and_saves_nothing(owner_client, project):
    upload = SimpleUploadedFile("bad.jsonl", b'{"a": 1}\n{"a": 2}\n{"a": 3 "b": 4}\n')
    response = owner_client.post("/p/acme/testsets/new", {"file": upload, "format": ""})
    assert response.status_code == 400
    html = response.content.decode()
    assert "row 3: not valid JSON: Expecting &#x27;,&#x27; delimiter at column 9" in html
    assert 'class="field-error"' in html
    assert not models.Testset.objects.exists()


def test_it_asks_for_a_file_or_pasted_rows(owner_client):
    response = owner_client.post("/p/acme/testsets/new", {"name": "X", "format": ""})
    assert response.status_code == 400
    assert "Choose a file, or paste rows below." in response.content.decode()


def test_it_shows_versions_rows_and_folds_long_nested_values(owner_client, capitals):
    html = owner_client.get("/p/acme/testsets/capitals/").content.decode()
    assert "<html" in html and 'id="testset-rows"' in html and 'id="testset-versions"' in html
    assert "<th>country</th><th>correct_answer</th><th>context</th>" in html
    assert '<details class="fold"><summary><span class="preview mono">{&quot;doc&quot;' in html
    assert "?format=jsonl&amp;version=1" in html


def test_it_pages_rows_as_an_htmx_fragment(owner_client, project):
    ts.testset_create(project=project, name="Many", rows=[{"i": f"n{i}"} for i in range(120)])
    full = owner_client.get("/p/acme/testsets/many/").content.decode()
    assert 'href="/p/acme/testsets/many/?page=2" hx-get="/p/acme/testsets/many/?page=2"' in full
    fragment = owner_client.get("/p/acme/testsets/many/?page=3", **HTMX).content.decode()
    assert fragment.strip().startswith('<section class="card" id="testset-rows">')
    assert "<html" not in fragment and ">n100<" in fragment and ">n99<" not in fragment
    assert "Page 3 of 3" in fragment


def test_it_opens_a_row_for_editing_with_or_without_javascript(owner_client, capitals):
    full = owner_client.get("/p/acme/testsets/capitals/?edit=0").content.decode()
    assert (
        "<html" in full
        and 'name="data"' in full
        and "&quot;country&quot;: &quot;France&quot;" in full
    )
    fragment = owner_client.get("/p/acme/testsets/capitals/?edit=0", **HTMX).content.decode()
    assert "<html" not in fragment and 'id="row-data-0"' in fragment


def test_it_saves_an_edited_row_as_a_new_version_for_htmx(owner_client, capitals, owner):
    response = owner_client.post(
        "/p/acme/testsets/capitals/rows/0/edit",
        {"data": '{"country": "Italy", "correct_answer": "Rome"}', "base_version": "1"},
        **HTMX,
    )
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert "Saved as v2." in html and "Rome" in html
    assert '<section class="card" id="testset-versions" hx-swap-oob="true">' in html
    head = head_of(capitals)
    assert (head.version, head.created_by) == (2, owner)
    assert capitals.versions.get(version=1).testcases.get(index=0).data == ROWS[0]


def test_it_saves_an_edited_row_without_javascript(owner_client, capitals):
    response = owner_client.post(
        "/p/acme/testsets/capitals/rows/1/edit",
        {"data": '{"country": "Japan"}', "message": "trim", "page": "1"},
    )
    assert response.status_code == 302 and response["Location"] == "/p/acme/testsets/capitals/"
    assert head_of(capitals).message == "trim"
    assert "Saved as v2." in owner_client.get(response["Location"]).content.decode()


def test_it_shows_invalid_row_json_inline(owner_client, capitals):
    bad = {"data": '{"country": "Italy",}', "base_version": "1"}
    fragment = owner_client.post("/p/acme/testsets/capitals/rows/0/edit", bad, **HTMX)
    assert fragment.status_code == 200
    assert "Not valid JSON: Expecting property name" in fragment.content.decode()
    assert "{&quot;country&quot;: &quot;Italy&quot;,}" in fragment.content.decode()
    full = owner_client.post("/p/acme/testsets/capitals/rows/0/edit", bad)
    assert full.status_code == 400 and "<html" in full.content.decode()
    assert head_of(capitals).version == 1


def test_it_refuses_an_edit_of_a_stale_version_inline(owner_client, capitals):
    ts.testset_row_delete(testset=capitals, index=1)
    response = owner_client.post(
        "/p/acme/testsets/capitals/rows/0/edit", {"data": "{}", "base_version": "1"}, **HTMX
    )
    assert "the head is now v2" in response.content.decode()
    assert head_of(capitals).version == 2


def test_it_adds_and_deletes_rows(owner_client, capitals):
    added = owner_client.post(
        "/p/acme/testsets/capitals/rows/add", {"data": '{"country": "Peru"}'}, **HTMX
    )
    assert "Row 2 added; saved as v2." in added.content.decode()
    deleted = owner_client.post("/p/acme/testsets/capitals/rows/0/delete", {"base_version": "2"})
    assert deleted.status_code == 302
    head = head_of(capitals)
    assert (head.version, head.row_count) == (3, 2)
    assert [c.data["country"] for c in head.testcases.order_by("index")] == ["Japan", "Peru"]


def test_it_shows_an_old_version_read_only(owner_client, capitals):
    ts.testset_row_delete(testset=capitals, index=0)
    html = owner_client.get("/p/acme/testsets/capitals/?version=1").content.decode()
    assert "France" in html and "an older version" in html
    assert "/rows/0/edit" not in html and "?edit=" not in html


def test_it_streams_exports_of_any_version(owner_client, capitals):
    ts.testset_row_delete(testset=capitals, index=0)
    response = owner_client.get("/p/acme/testsets/capitals/export?format=jsonl&version=1")
    assert response.streaming and response["Content-Type"] == "application/x-ndjson"
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert [json.loads(line) for line in lines] == ROWS
    csv_text = b"".join(owner_client.get("/p/acme/testsets/capitals/export").streaming_content)
    assert csv_text.decode().startswith("country,correct_answer,context\r\nJapan,Tokyo,")
    assert owner_client.get("/p/acme/testsets/capitals/export?format=xls").status_code == 400


def test_it_renames_a_testset(owner_client, capitals):
    response = owner_client.post(
        "/p/acme/testsets/capitals/update", {"name": "World", "description": "d"}
    )
    assert response.status_code == 302
    capitals.refresh_from_db()
    assert (capitals.name, capitals.description) == ("World", "d")


def test_it_confirms_then_deletes_unless_a_run_uses_it(owner_client, capitals, project):
    assert "Delete testset" in owner_client.get("/p/acme/testsets/capitals/delete").content.decode()
    run = models.Run.objects.create(project=project, name="Nightly", testset_version=capitals.head)
    refused = owner_client.post("/p/acme/testsets/capitals/delete")
    assert refused.status_code == 400
    assert "1 run uses this testset (v1); delete those runs first." in refused.content.decode()
    run.delete()
    assert owner_client.post("/p/acme/testsets/capitals/delete").status_code == 302
    assert not models.Testset.objects.exists()


def test_it_lets_a_viewer_read_but_not_edit(viewer_client, capitals):
    html = viewer_client.get("/p/acme/testsets/capitals/").content.decode()
    assert "France" in html and "Add a row" not in html and "/rows/0/edit" not in html
    assert viewer_client.get("/p/acme/testsets/capitals/?edit=0").status_code == 200
    assert viewer_client.get("/p/acme/testsets/capitals/export").status_code == 200
    posts = [
        viewer_client.post("/p/acme/testsets/capitals/rows/0/edit", {"data": "{}"}),
        viewer_client.post("/p/acme/testsets/capitals/rows/add", {"data": "{}"}),
        viewer_client.post("/p/acme/testsets/capitals/rows/0/delete"),
        viewer_client.post("/p/acme/testsets/capitals/delete"),
        viewer_client.post("/p/acme/testsets/new", {"text": "a\n1\n", "name": "X"}),
    ]
    assert [response.status_code for response in posts] == [403] * 5
    assert head_of(capitals).version == 1


def test_it_hides_testsets_of_other_projects(outsider_client, capitals):
    assert outsider_client.get("/p/acme/testsets/capitals/").status_code == 404
    assert outsider_client.get("/p/other/testsets/capitals/").status_code == 404
    assert outsider_client.get("/p/other/testsets/capitals/export").status_code == 404
