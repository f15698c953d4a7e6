"""CSV and JSONL exports of a run's scenario table and of a comparison, streamed.

A run's export walks ``selectors.scenario_page`` in batches with the same ``TableQuery`` as the
run page (filters and sort respected), so a 100,000-scenario run never sits in memory: each
batch is read, written out and dropped. A comparison's export holds only the per-scenario
metric values (numbers, in numpy arrays) and reads the rest a batch of rows at a time.

Errors are never numbers: a CSV cell says ``error: <code>``; a JSONL row carries an ``errors``
object (column -> the stored error) beside its ``values``. CSV text that a spreadsheet would
run as a formula (starting with = + - @, tab or CR) is prefixed with ``'``; JSONL is exact.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from typing import Any

from django.http import StreamingHttpResponse

from runs import compare, selectors
from runs.models import Run

BATCH = 2000
FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class _Line:
    """A file-like object whose write() returns what it was given (csv.writer -> strings)."""

    def write(self, value: str) -> str:
        return value


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def csv_error(error: dict | None) -> str:
    return f"error: {(error or {}).get('code') or 'error'}"


def _json_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str) + "\n"


def stream_response(chunks: Iterable[str], *, fmt: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(chunks, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


# --- a run's scenario table ----------------------------------------------------------------------


def run_export_batches(run: Run, query: selectors.TableQuery) -> Iterator[list[dict]]:
    """The filtered, sorted scenario rows, a batch at a time."""
    offset = 0
    while True:
        scenarios, total = selectors.scenario_page(run, query, offset=offset, limit=BATCH)
        if not scenarios:
            return
        yield selectors.scenario_rows(run, scenarios, query.repeat)
        offset += len(scenarios)
        if offset >= total:
            return


def run_csv(run: Run, query: selectors.TableQuery) -> Iterator[str]:
    names = [m["column"]["name"] for m in run.mappings]
    writer = csv.writer(_Line())
    yield writer.writerow(["index", "status", *names])
    for rows in run_export_batches(run, query):
        yield "".join(
            writer.writerow(
                [
                    row["scenario"].index,
                    row["scenario"].status,
                    *(
                        csv_error(row["errors"][name])
                        if name in row["errors"]
                        else csv_cell(row["values"].get(name))
                        for name in names
                    ),
                ]
            )
            for row in rows
        )


def run_jsonl(run: Run, query: selectors.TableQuery) -> Iterator[str]:
    for rows in run_export_batches(run, query):
        yield "".join(
            _json_line(
                {
                    "index": row["scenario"].index,
                    "status": row["scenario"].status,
                    "values": row["values"],
                    "errors": row["errors"],
                }
            )
            for row in rows
        )


def run_export(run: Run, query: selectors.TableQuery, *, fmt: str) -> StreamingHttpResponse:
    chunks = run_csv(run, query) if fmt == "csv" else run_jsonl(run, query)
    return stream_response(chunks, fmt=fmt, filename=f"run-{run.pk}-scenarios")


# --- a comparison --------------------------------------------------------------------------------


def comparison_batches(
    comparison: compare.Comparison, *, metric: str = "", show: str = ""
) -> Iterator[tuple[list[compare.SharedMetric], list[dict]]]:
    chosen = comparison.chosen(metric)
    values = compare.comparison_values(comparison)
    indexes = compare.aligned_indexes(comparison, values, metrics=chosen, show=show)
    for start in range(0, len(indexes), BATCH):
        batch = indexes[start : start + BATCH]
        yield chosen, compare.aligned_rows(comparison, values, batch, metrics=chosen)


def comparison_header(comparison: compare.Comparison, chosen) -> list[str]:
    base = comparison.baseline.pk
    header = ["index", *comparison.input_columns]
    header += [f"outputs [run {run.pk}]" for run in comparison.runs]
    for metric in chosen:
        header += [f"{metric.name} [run {run.pk}]" for run in comparison.runs]
        header += [
            f"{metric.name} delta [run {run.pk} - run {base}]" for run in comparison.candidates
        ]
    return header


def comparison_csv_row(row: dict, chosen) -> list[str]:
    cells = row["runs"]
    line = [str(row["index"]), *(csv_cell(v) for v in row["inputs"].values())]
    line += [csv_cell(cell.get("outputs")) for cell in cells]
    for metric in chosen:
        for cell in cells:
            if metric.name in cell["errors"]:
                line.append(csv_error(cell["errors"][metric.name]))
            else:
                line.append(csv_cell(cell["values"].get(metric.name)))
        line += [csv_cell(cell["deltas"].get(metric.name)) for cell in cells[1:]]
    return line


def comparison_csv(comparison: compare.Comparison, *, metric: str = "", show: str = ""):
    writer = csv.writer(_Line())
    chosen = comparison.chosen(metric)
    yield writer.writerow(comparison_header(comparison, chosen))
    for batch_metrics, rows in comparison_batches(comparison, metric=metric, show=show):
        yield "".join(writer.writerow(comparison_csv_row(row, batch_metrics)) for row in rows)


def comparison_jsonl(comparison: compare.Comparison, *, metric: str = "", show: str = ""):
    for _, rows in comparison_batches(comparison, metric=metric, show=show):
        yield "".join(_json_line(row) for row in rows)


def comparison_export(
    comparison: compare.Comparison, *, fmt: str, metric: str = "", show: str = ""
) -> StreamingHttpResponse:
    make = comparison_csv if fmt == "csv" else comparison_jsonl
    ids = "-".join(str(r.pk) for r in comparison.runs)
    return stream_response(
        make(comparison, metric=metric, show=show), fmt=fmt, filename=f"compare-runs-{ids}"
    )
