"""Testset services: parsing each format, clear errors, versions on edit, streaming export."""

import csv
import io
import json
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from evalsite.errors import InvalidInput
from runs import models
from runs import testsets as ts

ROWS = [
    {"country": "France", "correct_answer": "Paris"},
    {"country": "Japan", "correct_answer": "Tokyo", "meta": {"tags": ["asia"], "level": 2}},
]


def upload(name: str, content: str | bytes, content_type: str = "application/octet-stream"):
    data = content.encode() if isinstance(content, str) else content
    return SimpleUploadedFile(name, data, content_type=content_type)


def file_errors(name: str, content: str | bytes, **kwargs) -> list[str]:
    with pytest.raises(InvalidInput) as caught:
        ts.testset_file_parse(data=upload(name, content).read(), filename=name, **kwargs)
    return caught.value.fields["file"]


def rows_of(version) -> list[dict]:
    return [case.data for case in version.testcases.order_by("index")]


@pytest.fixture
def capitals(project, editor):
    return ts.testset_create(project=project, name="Capitals", rows=ROWS, author=editor)


# --- create and parse -------------------------------------------------------------------------


def test_it_creates_version_one_with_columns_in_first_seen_order(capitals, editor):
    head = capitals.head
    assert (capitals.slug, head.version, head.row_count) == ("capitals", 1, 2)
    assert head.columns == ["country", "correct_answer", "meta"]
    assert head.created_by == editor and head.message == "Created"
    assert rows_of(head)[1]["meta"] == {"tags": ["asia"], "level": 2}
    assert [case.index for case in head.testcases.order_by("index")] == [0, 1]


def test_it_makes_slugs_unique_per_project(project, other_project, capitals):
    again = ts.testset_create(project=project, name="Capitals", rows=ROWS)
    elsewhere = ts.testset_create(project=other_project, name="Capitals", rows=ROWS)
    assert (again.slug, elsewhere.slug) == ("capitals-2", "capitals")


def test_it_refuses_a_taken_or_invalid_slug(project, capitals):
    for slug in ("capitals", "not a slug"):
        with pytest.raises(InvalidInput) as caught:
            ts.testset_create(project=project, name="X", slug=slug, rows=ROWS)
        assert "slug" in caught.value.fields


def test_it_parses_csv_cells_as_strings_and_json_cells_as_json(project):
    content = 'question,answer,context,score\nCapital?,Paris,"{""src"": [1, 2]}",0.5\n'
    testset = ts.testset_create_from_file(project=project, file=upload("geo.csv", content))
    assert testset.name == "geo"
    assert rows_of(testset.head) == [
        {"question": "Capital?", "answer": "Paris", "context": {"src": [1, 2]}, "score": "0.5"}
    ]
    assert testset.head.message == "Uploaded geo.csv"


def test_it_keeps_text_that_only_looks_like_json_in_csv():
    parsed = ts.testset_file_parse(data=b"a,b\n[citation needed],{not json}\n", filename="x.csv")
    assert parsed.rows == [{"a": "[citation needed]", "b": "{not json}"}]


def test_it_reads_quoted_multiline_csv_cells_and_a_bom():
    parsed = ts.testset_file_parse(
        data='\ufeffa,b\n"line 1\nline 2",x\n'.encode(), filename="x.csv"
    )
    assert parsed.columns == ["a", "b"]
    assert parsed.rows == [{"a": "line 1\nline 2", "b": "x"}]


def test_it_reads_tab_and_semicolon_separated_files():
    tsv = ts.testset_file_parse(data=b"a\tb\n1\t2\n", filename="x.tsv")
    semicolons = ts.testset_file_parse(data=b"a;b\n1;2\n", filename="x.csv")
    assert tsv.rows == semicolons.rows == [{"a": "1", "b": "2"}]


def test_it_skips_blank_csv_lines():
    parsed = ts.testset_file_parse(data=b"a,b\n1,2\n\n,\n3,4\n", filename="x.csv")
    assert parsed.rows == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]


def test_it_parses_a_json_array_keeping_nested_values_and_types():
    rows = [{"q": "2+2", "expected": 4, "ok": True, "none": None, "deep": {"a": [{"b": 1.5}]}}]
    parsed = ts.testset_file_parse(data=json.dumps(rows).encode(), filename="x.json")
    assert (parsed.format, parsed.rows) == ("json", rows)


def test_it_parses_jsonl_with_blank_lines_and_differing_keys():
    content = '{"a": 1}\n\n{"b": {"c": [1]}, "a": 2}\r\n'
    parsed = ts.testset_file_parse(data=content.encode(), filename="x.jsonl")
    assert parsed.rows == [{"a": 1}, {"b": {"c": [1]}, "a": 2}]
    assert parsed.columns == ["a", "b"]


def test_it_keeps_unicode_line_separators_inside_jsonl_strings():
    parsed = ts.testset_file_parse(data='{"a": "x\u2028y"}\n'.encode(), filename="x.jsonl")
    assert parsed.rows == [{"a": "x\u2028y"}]


@pytest.mark.parametrize(
    ("filename", "content_type", "content", "format", "expected"),
    [
        ("x.csv", "", b"[1]", "", "csv"),
        ("x.ndjson", "", b"a,b", "", "jsonl"),
        ("upload", "application/json; charset=utf-8", b"a,b", "", "json"),
        ("upload", "application/x-ndjson", b"a,b", "", "jsonl"),
        ("data.txt", "", b'  [{"a": 1}]', "", "json"),
        ("data.txt", "", b'{"a": 1}\n', "", "jsonl"),
        ("data.txt", "", b"a,b\n", "", "csv"),
        ("x.csv", "text/csv", b"[]", "json", "json"),
    ],
)
def test_it_detects_the_format(filename, content_type, content, format, expected):
    detected = ts.testset_format_detect(
        filename=filename, content_type=content_type, head=content, format=format
    )
    assert detected == expected


def test_it_refuses_an_unknown_format():
    with pytest.raises(InvalidInput) as caught:
        ts.testset_file_parse(data=b"a\n1\n", format="xlsx")
    assert "format" in caught.value.fields


def test_it_uploads_10000_rows_quickly(project):
    lines = ["id,question,answer"] + [f"{i},What is {i}+{i}?,{2 * i}" for i in range(10_000)]
    started = time.monotonic()
    testset = ts.testset_create_from_file(project=project, file=upload("big.csv", "\n".join(lines)))
    assert time.monotonic() - started < 3
    assert testset.head.row_count == 10_000 == testset.head.testcases.count()


# --- malformed files --------------------------------------------------------------------------


def test_it_names_the_row_and_column_of_invalid_jsonl():
    content = '{"a": 1}\n{"a": 2}\n{"a": 3 "b": 4}\n'
    assert file_errors("x.jsonl", content) == [
        "row 3: not valid JSON: Expecting ',' delimiter at column 9"
    ]


def test_it_names_the_line_when_jsonl_rows_and_lines_differ():
    errors = file_errors("x.jsonl", '{"a": 1}\n\n{"a": }\n')
    assert errors == ["row 2 (line 3): not valid JSON: Expecting value at column 7"]


def test_it_names_line_and_column_of_invalid_json():
    errors = file_errors("x.json", '[\n  {"a": 1},\n  {"a": 2,}\n]')
    assert errors == [
        "line 3, column 11: not valid JSON: Expecting property name enclosed in double quotes"
    ]


def test_it_hints_at_jsonl_when_a_json_file_has_one_object_per_line():
    (error,) = file_errors("x.json", '{"a": 1}\n{"a": 2}\n')
    assert error.startswith("line 2, column 1: not valid JSON: Extra data") and "JSONL" in error


def test_it_names_a_ragged_csv_row_with_expected_and_found_counts():
    content = "a,b,c\n1,2,3\n4,5\n6,7,8,9\n"
    assert file_errors("x.csv", content) == [
        "row 2 (line 3): expected 3 columns as in the header, found 2",
        "row 3 (line 4): expected 3 columns as in the header, found 4",
    ]


def test_it_names_malformed_csv_quoting():
    (error,) = file_errors("x.csv", 'a,b\n1,"unterminated\n')
    assert (
        error
        == "line 2: malformed CSV: unexpected end of data (a quoted cell that starts here never ends)"
    )


def test_it_refuses_an_empty_file_or_one_without_rows():
    assert file_errors("x.csv", b"") == ["The file is empty."]
    assert file_errors("x.jsonl", "\n  \n") == ["The file is empty."]
    assert file_errors("x.csv", "a,b\n") == ["The file has no rows."]
    assert file_errors("x.json", "[]") == ["The file has no rows."]


def test_it_refuses_rows_that_are_not_objects():
    assert file_errors("x.json", '[{"a": 1}, "b", [1]]') == [
        "row 2: expected a JSON object, got a string",
        "row 3: expected a JSON object, got an array",
    ]
    assert file_errors("x.jsonl", '{"a": 1}\n42\n') == [
        "row 2: expected a JSON object, got a number"
    ]
    assert file_errors("x.json", '{"rows": []}') == [
        "Expected a JSON array of objects, got an object."
    ]


def test_it_refuses_duplicate_and_empty_header_names():
    assert file_errors("x.csv", "a,b,a,\n1,2,3,4\n") == [
        "header: duplicate column name 'a' (columns 1 and 3)",
        "header: column 4 has no name",
    ]


def test_it_refuses_bytes_that_are_not_utf8():
    errors = file_errors("x.csv", "a,b\nok,fine\ncaf\xe9,x\n".encode("latin-1"))
    assert errors == ["line 3, column 4: not valid UTF-8 (byte 0xE9); save the file as UTF-8."]
    assert file_errors("x.csv", "a,b\n".encode("utf-16")) == [
        "The file is UTF-16; save it as UTF-8."
    ]


def test_it_refuses_a_file_over_the_size_limit(project, settings):
    settings.EVALSITE_TESTSET_MAX_BYTES = 100
    with pytest.raises(InvalidInput) as caught:
        ts.testset_create_from_file(project=project, file=upload("x.csv", "a\n" + "1\n" * 100))
    assert caught.value.fields["file"][0].startswith("The file is 0.0 MB; the limit is")
    assert not models.Testset.objects.exists()


def test_it_refuses_more_rows_than_the_limit(settings):
    settings.EVALSITE_TESTSET_MAX_ROWS = 2
    expected = ["More than 2 rows; the limit is 2 rows per testset version."]
    assert file_errors("x.csv", "a\n1\n2\n3\n") == expected
    assert file_errors("x.jsonl", '{"a":1}\n{"a":2}\n{"a":3}\n') == expected
    assert file_errors("x.json", '[{"a":1},{"a":2},{"a":3}]') == expected


def test_it_refuses_nan_and_nul_characters_which_postgres_cannot_store():
    (error,) = file_errors("x.jsonl", '{"a": NaN}\n')
    assert error == "row 1: not valid JSON: NaN is not a JSON value (use null or a string)"
    (error,) = file_errors("x.json", '[{"a": "x\\u0000y"}]')
    assert error.startswith("row 1, column 'a': contains a NUL character")


def test_it_stops_after_ten_errors():
    errors = file_errors("x.csv", "a,b\n" + "1\n" * 50)
    assert len(errors) == 11 and errors[-1] == "(stopped after 10 errors)"


def test_it_saves_nothing_when_a_row_is_bad(project):
    with pytest.raises(InvalidInput) as caught:
        ts.testset_create(project=project, name="Bad", rows=[{"a": 1}, "oops"])
    assert caught.value.fields == {"rows": ["row 2: expected a JSON object, got a string"]}
    assert not models.Testset.objects.exists()
    assert not models.TestsetVersion.objects.exists()


# --- versions ---------------------------------------------------------------------------------


def test_it_edits_a_row_into_a_new_version_and_keeps_the_old_one(capitals, owner):
    old = capitals.head
    new = ts.testset_row_update(
        testset=capitals, index=0, data={"country": "Italy", "correct_answer": "Rome"}, author=owner
    )
    capitals.refresh_from_db()
    assert (new.version, capitals.head, new.message, new.created_by) == (
        2,
        new,
        "Edited row 0",
        owner,
    )
    assert rows_of(new)[0] == {"country": "Italy", "correct_answer": "Rome"}
    assert rows_of(new)[1] == ROWS[1]
    assert rows_of(old) == ROWS
    assert (old.version, old.row_count) == (1, 2)


def test_it_merges_a_row_and_makes_no_version_when_nothing_changes(capitals):
    merged = ts.testset_row_update(testset=capitals, index=1, data={"level": 3}, merge=True)
    assert rows_of(merged)[1] == {**ROWS[1], "level": 3}
    assert merged.columns == ["country", "correct_answer", "meta", "level"]
    same = ts.testset_row_update(testset=capitals, index=1, data={"level": 3}, merge=True)
    assert same == merged


def test_it_drops_a_column_no_row_has_any_more(capitals):
    version = ts.testset_row_update(testset=capitals, index=1, data={"country": "Japan"})
    assert version.columns == ["country", "correct_answer"]


def test_it_adds_rows_after_the_last_and_appends_new_columns(capitals):
    version = ts.testset_rows_add(
        testset=capitals, rows=[{"country": "Peru", "notes": "new"}], message="one more"
    )
    assert (version.row_count, version.message) == (3, "one more")
    assert version.columns == ["country", "correct_answer", "meta", "notes"]
    assert [c.index for c in version.testcases.order_by("index")] == [0, 1, 2]
    assert rows_of(version)[2] == {"country": "Peru", "notes": "new"}


def test_it_deletes_a_row_and_moves_later_rows_up(capitals):
    ts.testset_rows_add(testset=capitals, rows=[{"country": "Peru"}])
    version = ts.testset_row_delete(testset=capitals, index=1)
    assert version.row_count == 2
    assert [(c.index, c.data["country"]) for c in version.testcases.order_by("index")] == [
        (0, "France"),
        (1, "Peru"),
    ]
    assert version.columns == ["country", "correct_answer"]


def test_it_replaces_all_rows(capitals):
    version = ts.testset_revise(testset=capitals, rows=[{"x": 1}], message="start over")
    assert (version.version, version.columns, rows_of(version)) == (2, ["x"], [{"x": 1}])
    assert capitals.versions.get(version=1).row_count == 2


def test_it_refuses_an_edit_based_on_a_stale_version(capitals):
    ts.testset_row_delete(testset=capitals, index=0)
    with pytest.raises(InvalidInput) as caught:
        ts.testset_row_update(testset=capitals, index=0, data={"a": 1}, base_version=1)
    assert "the head is now v2" in caught.value.fields["base_version"][0]
    assert capitals.versions.count() == 2


def test_it_refuses_a_row_index_out_of_range(capitals):
    with pytest.raises(InvalidInput) as caught:
        ts.testset_row_delete(testset=capitals, index=5)
    assert caught.value.fields == {"index": ["No row 5; v1 has 2 rows (indexes 0 to 1)."]}


def test_it_refuses_a_row_that_is_not_an_object(capitals):
    with pytest.raises(InvalidInput) as caught:
        ts.testset_row_update(testset=capitals, index=0, data=["x"])
    assert "data" in caught.value.fields


# --- export -----------------------------------------------------------------------------------


def export(version, fmt, **kwargs) -> str:
    return "".join(ts.testset_export(version=version, format=fmt, **kwargs))


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_it_round_trips_json_and_jsonl_exactly(capitals, project, fmt):
    text = export(capitals.head, fmt)
    again = ts.testset_create_from_file(project=project, file=upload(f"x.{fmt}", text))
    assert rows_of(again.head) == ROWS
    assert again.head.columns == capitals.head.columns


def test_it_round_trips_csv_with_nested_values(capitals, project):
    text = export(capitals.head, "csv")
    assert text.splitlines()[0] == "country,correct_answer,meta"
    again = ts.testset_create_from_file(project=project, file=upload("x.csv", text))
    assert rows_of(again.head) == [
        {"country": "France", "correct_answer": "Paris", "meta": ""},
        {"country": "Japan", "correct_answer": "Tokyo", "meta": {"tags": ["asia"], "level": 2}},
    ]


def test_it_writes_json_keys_in_column_order(project):
    testset = ts.testset_create(project=project, name="Order", rows=[{"zeta": 1, "a": 2}])
    assert export(testset.head, "jsonl") == '{"zeta": 1, "a": 2}\n'
    assert json.loads(export(testset.head, "json")) == [{"zeta": 1, "a": 2}]


def test_it_exports_an_empty_version(project):
    testset = ts.testset_create(project=project, name="Empty", rows=[])
    assert json.loads(export(testset.head, "json")) == []
    assert export(testset.head, "jsonl") == ""


def test_it_exports_lazily_in_chunks(project, django_assert_num_queries):
    rows = [{"i": i, "text": f"row {i}"} for i in range(2500)]
    testset = ts.testset_create(project=project, name="Many", rows=rows)
    with django_assert_num_queries(0):
        chunks = ts.testset_export(version=testset.head, format="csv", chunk_size=1000)
    chunks = list(chunks)
    assert len(chunks) == 3
    reader = list(csv.DictReader(io.StringIO("".join(chunks))))
    assert len(reader) == 2500 and reader[2499] == {"i": "2499", "text": "row 2499"}


def test_it_exports_an_old_version(capitals):
    old = capitals.head
    ts.testset_row_delete(testset=capitals, index=0)
    assert len(json.loads(export(old, "json"))) == 2


# --- update and delete ------------------------------------------------------------------------


def test_it_renames_without_a_new_version(capitals):
    ts.testset_update(testset=capitals, name="World capitals", description="Geography")
    capitals.refresh_from_db()
    assert (capitals.name, capitals.description, capitals.versions.count()) == (
        "World capitals",
        "Geography",
        1,
    )


def test_it_deletes_a_testset_with_its_versions_and_rows(capitals):
    ts.testset_rows_add(testset=capitals, rows=[{"country": "Peru"}])
    ts.testset_delete(testset=capitals)
    assert not models.Testset.objects.exists()
    assert not models.TestsetVersion.objects.exists()
    assert not models.Testcase.objects.exists()


def test_it_refuses_to_delete_a_testset_a_run_uses(capitals, project):
    models.Run.objects.create(project=project, name="Nightly", testset_version=capitals.head)
    with pytest.raises(InvalidInput) as caught:
        ts.testset_delete(testset=capitals)
    assert caught.value.fields == {
        "non_field_errors": ["1 run uses this testset (v1); delete those runs first."]
    }
    assert models.Testcase.objects.count() == 2


def test_it_finds_a_testset_by_slug_or_id(project, other_project, capitals):
    assert ts.testset_get(project=project, ref="capitals") == capitals
    assert ts.testset_get(project=project, ref=str(capitals.pk)) == capitals
    assert ts.testset_get(project=other_project, ref=str(capitals.pk)) is None


def test_it_names_the_line_of_text_after_a_closing_quote():
    assert file_errors("x.csv", 'a,b\n1,2\n"3"x,4\n') == [
        "line 3: malformed CSV: ',' expected after '\"'"
    ]
