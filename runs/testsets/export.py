"""Testset export as CSV, JSON or JSONL, streamed in chunks."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from evalsite.errors import InvalidInput
from runs.models import TestsetVersion
from runs.testsets.parse import EXPORT_CHUNK_ROWS, FORMATS


def testset_export(
    *, version: TestsetVersion, format: str, chunk_size: int = EXPORT_CHUNK_ROWS
) -> Iterator[str]:
    """The rows of ``version`` as CSV, a JSON array, or JSONL, in chunks of text.

    Lazy: nothing is read until iterated, then rows stream from a server-side cursor
    (``.iterator(chunk_size=...)``), so a 100k-row export never sits in memory. Object keys
    follow the version's column order. CSV writes strings as they are, null as an empty cell,
    and numbers, booleans, objects and arrays as JSON text.
    """
    if format not in FORMATS:
        raise InvalidInput({"format": [f"Unknown format {format!r}; use csv, json or jsonl."]})
    rows = (
        version.testcases.order_by("index")
        .values_list("data", flat=True)
        .iterator(chunk_size=chunk_size)
    )
    columns = list(version.columns)
    writer = {"csv": _export_csv, "json": _export_json, "jsonl": _export_jsonl}[format]
    return writer(rows, columns, chunk_size)


def row_ordered(row: dict, columns: list[str]) -> dict:
    """``row`` with its keys in column order (``jsonb`` stores them in its own order)."""
    ordered = {column: row[column] for column in columns if column in row}
    if len(ordered) != len(row):
        ordered.update(row)
    return ordered


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _export_csv(rows: Iterator[dict], columns: list[str], chunk_size: int) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for number, row in enumerate(rows, 1):
        writer.writerow([_csv_text(row[c]) if c in row else "" for c in columns])
        if number % chunk_size == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _csv_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _dumps(value)


def _export_json(rows: Iterator[dict], columns: list[str], chunk_size: int) -> Iterator[str]:
    parts, separator = ["["], "\n"
    for row in rows:
        parts.append(separator + _dumps(row_ordered(row, columns)))
        separator = ",\n"
        if len(parts) >= chunk_size:
            yield "".join(parts)
            parts = []
    parts.append("\n]\n" if separator == ",\n" else "]\n")
    yield "".join(parts)


def _export_jsonl(rows: Iterator[dict], columns: list[str], chunk_size: int) -> Iterator[str]:
    parts: list[str] = []
    for row in rows:
        parts.append(_dumps(row_ordered(row, columns)) + "\n")
        if len(parts) >= chunk_size:
            yield "".join(parts)
            parts = []
    yield "".join(parts)
