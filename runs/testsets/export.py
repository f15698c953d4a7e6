"""Testset export as CSV, JSON or JSONL: each row written by PostgreSQL, streamed with COPY."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Generator, Iterator

from evalsite.errors import InvalidInput
from runs.bulk import COPY_LINES, copy_out
from runs.models import TestsetVersion
from runs.testsets.parse import EXPORT_CHUNK_ROWS, FORMATS


def testset_export(
    *, version: TestsetVersion, format: str, chunk_size: int = EXPORT_CHUNK_ROWS
) -> Iterator[str]:
    """The rows of ``version`` as CSV, a JSON array, or JSONL, in chunks of text (``chunk_size``
    rows at most).

    Lazy: nothing is read until iterated, then one ``COPY (SELECT ...) TO STDOUT`` writes each
    row, in index order, and its chunks pass through as they come, so a 100k-row export never
    sits in memory and stops on the server when the download does. Object keys follow the
    version's column order (then any other key, as stored). CSV writes strings as they are (no
    formula guard: the file must come back in unchanged), null as an empty cell, and numbers,
    booleans, objects and arrays as JSON text.
    """
    if format not in FORMATS:
        raise InvalidInput({"format": [f"Unknown format {format!r}; use csv, json or jsonl."]})
    columns = list(version.columns)
    if format == "json" and not version.row_count:
        return iter(["[]\n"])
    if format == "csv":
        sql, params = _csv_sql(version, columns)
        head = _csv_header(columns)
    else:
        sql, params = _json_sql(version, columns, array=format == "json")
        head = b"[\n" if format == "json" else b""
    chunks = copy_out(sql, params, head=head, crlf=format == "csv", chunk_rows=chunk_size)
    return _text(chunks, tail="]\n" if format == "json" else "")


def _text(chunks: Generator[bytes, None, None], tail: str) -> Iterator[str]:
    """The chunks as text; closed early (a client that left), it closes them, which cancels
    the ``COPY`` at once rather than whenever the generator is collected."""
    try:
        for chunk in chunks:  # whole rows: never a character cut in two
            yield chunk.decode()
    finally:
        chunks.close()
    if tail:
        yield tail


def row_ordered(row: dict, columns: list[str]) -> dict:
    """``row`` with its keys in column order (``jsonb`` stores them in its own order)."""
    ordered = {column: row[column] for column in columns if column in row}
    if len(ordered) != len(row):
        ordered.update(row)
    return ordered


def _csv_header(columns: list[str]) -> bytes:
    line = io.StringIO()
    csv.writer(line).writerow(columns)
    return line.getvalue().encode()


def _csv_sql(version: TestsetVersion, columns: list[str]) -> tuple[str, list]:
    cells = [
        "CASE jsonb_typeof(t.data -> %s) WHEN 'string' THEN nullif(t.data ->> %s, '')"
        " WHEN 'null' THEN NULL ELSE (t.data -> %s)::text END"
        for _ in columns
    ]
    if len(cells) == 1:  # a row of one empty cell is "", as Python writes it, not a blank line
        cells = [f"coalesce({cells[0]}, '')"]
    sql = (
        f"COPY (SELECT {', '.join(cells) or 'NULL'} FROM runs_testcase t"  # noqa: S608
        " WHERE t.version_id = %s ORDER BY t.index) TO STDOUT (FORMAT csv)"
    )
    return sql, [*(c for column in columns for c in (column, column, column)), version.pk]


def _json_sql(version: TestsetVersion, columns: list[str], *, array: bool) -> tuple[str, list]:
    """Each row as JSON text: its columns in order, then keys that are not columns (rare: a
    cheap test skips looking for them); in an array, a comma after each but the last row."""
    entries = ["CASE WHEN t.data ? %s THEN %s || (t.data -> %s)::text END" for _ in columns]
    params: list = [p for c in columns for p in (c, json.dumps(c, ensure_ascii=False) + ": ", c)]
    entries.append(
        "CASE WHEN t.data - %s::text[] <> '{}' THEN (SELECT string_agg(to_json(e.key)::text"
        " || ': ' || e.value::text, ', ') FROM jsonb_each(t.data) e"
        " WHERE e.key <> ALL(%s::text[])) END"
    )
    params += [columns, columns]
    line = f"'{{' || array_to_string(ARRAY[{', '.join(entries)}]::text[], ', ') || '}}'"
    if array:
        line += " || CASE WHEN lead(t.index) OVER (ORDER BY t.index) IS NULL THEN '' ELSE ',' END"
    sql = (
        f"COPY (SELECT {line} FROM runs_testcase t WHERE t.version_id = %s ORDER BY t.index)"  # noqa: S608
        f" TO STDOUT {COPY_LINES}"
    )
    return sql, [*params, version.pk]
