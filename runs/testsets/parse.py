"""Reading testset files (CSV, JSON, JSONL) into rows, with limits and readable problems."""

from __future__ import annotations

import codecs
import csv
import io
import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from runs import conf

FORMATS = ("csv", "json", "jsonl")


EXPORT_CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "jsonl": "application/x-ndjson",
}


# Overridable in settings (EVALSITE_TESTSET_MAX_BYTES / EVALSITE_TESTSET_MAX_ROWS).


MAX_ERRORS = 10  # per upload: enough to fix several rows at once, not a wall of text


BATCH_SIZE = 1000


EXPORT_CHUNK_ROWS = 1000


_EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}


_CONTENT_TYPES = {
    "text/csv": "csv",
    "application/csv": "csv",
    "text/tab-separated-values": "csv",
    "application/json": "json",
    "text/json": "json",
    "application/x-ndjson": "jsonl",
    "application/ndjson": "jsonl",
    "application/jsonl": "jsonl",
    "application/x-jsonlines": "jsonl",
    "application/jsonlines": "jsonl",
}


def max_bytes() -> int:
    return conf.testset_max_bytes()


def max_rows() -> int:
    return conf.testset_max_rows()


@dataclass
class ParsedRows:
    rows: list[dict[str, Any]]
    columns: list[str]
    format: str


def testset_format_detect(
    *, filename: str = "", content_type: str = "", head: bytes = b"", format: str = ""
) -> str:
    """``format`` when given, else the extension, else the content type, else the content:
    ``[`` starts JSON, ``{`` starts JSONL, anything else is CSV."""
    if format:
        if format not in FORMATS:
            raise InvalidInput({"format": [f"Unknown format {format!r}; use csv, json or jsonl."]})
        return format
    suffix = PurePosixPath(filename.lower()).suffix
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    media_type = content_type.split(";")[0].strip().lower()
    if media_type in _CONTENT_TYPES:
        return _CONTENT_TYPES[media_type]
    start = head.removeprefix(codecs.BOM_UTF8).lstrip()[:1]
    return {b"[": "json", b"{": "jsonl"}.get(start, "csv")


def testset_file_read(*, file, format: str = "") -> ParsedRows:
    """Read and parse an uploaded file (a Django ``UploadedFile`` or any binary file object)."""
    limit = max_bytes()
    size = getattr(file, "size", None)
    if size is not None and size > limit:
        raise InvalidInput({"file": [_too_big(size, limit)]})
    data = file.read(limit + 1)
    return testset_file_parse(
        data=data,
        filename=getattr(file, "name", "") or "",
        content_type=getattr(file, "content_type", "") or "",
        format=format,
    )


def testset_file_parse(
    *, data: bytes, filename: str = "", content_type: str = "", format: str = ""
) -> ParsedRows:
    """Parse CSV, a JSON array of objects, or JSONL into rows and their columns.

    JSON and JSONL values are kept as they are (nested objects and lists included). CSV cells stay
    strings, except a cell holding a JSON object or array (``{...}`` / ``[...]`` that parses),
    which becomes that object or array, so nested values survive a CSV export and re-import.
    """
    limit = max_bytes()
    if len(data) > limit:
        raise InvalidInput({"file": [_too_big(len(data), limit)]})
    fmt = testset_format_detect(
        filename=filename, content_type=content_type, head=data[:64], format=format
    )
    text = _decode(data)
    if not text.strip():
        raise InvalidInput({"file": ["The file is empty."]})
    problems = _Problems("file")
    if fmt == "csv":
        tab = filename.lower().endswith(".tsv")
        rows: list[Any] = _parse_csv(text, problems, delimiter="\t" if tab else None)
    elif fmt == "json":
        rows = _parse_json(text)
    else:
        rows = _parse_jsonl(text, problems)
    problems.raise_if_any()
    if not rows:
        raise InvalidInput({"file": ["The file has no rows."]})
    columns = rows_check(rows, field="file")
    return ParsedRows(rows=rows, columns=columns, format=fmt)


class _Problems:
    """Collects error messages for one field; parsing stops after MAX_ERRORS of them."""

    def __init__(self, field: str):
        self.field = field
        self.messages: list[str] = []

    def add(self, message: str) -> None:
        self.messages.append(message)
        if len(self.messages) >= MAX_ERRORS:
            self.messages.append(f"(stopped after {MAX_ERRORS} errors)")
            self.raise_if_any()

    def raise_if_any(self) -> None:
        if self.messages:
            raise InvalidInput({self.field: self.messages})


def _too_big(size: int, limit: int) -> str:
    return f"The file is {size / 1_048_576:.1f} MB; the limit is {limit / 1_048_576:.1f} MB."


def too_many_rows(limit: int) -> str:
    return f"More than {limit:,} rows; the limit is {limit:,} rows per testset version."


def _decode(data: bytes) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InvalidInput({"file": ["The file is UTF-16; save it as UTF-8."]})
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = data[exc.start]
        raise InvalidInput(
            {
                "file": [
                    f"line {line}, column {column}: not valid UTF-8 (byte 0x{byte:02X}); "
                    "save the file as UTF-8."
                ]
            }
        )


_TOO_DEEP = object()


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON value (use null or a string)")


def _parse_json(text: str) -> list[Any]:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        hint = ""
        if exc.msg == "Extra data":
            hint = " (one object per line is JSONL: name the file .jsonl or choose JSONL)"
        raise InvalidInput(
            {"file": [f"line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}{hint}"]}
        )
    except ValueError as exc:
        raise InvalidInput({"file": [f"not valid JSON: {exc}"]})
    except RecursionError:
        value = _TOO_DEEP
    if value is _TOO_DEEP or jsonsafe.depth_exceeds(value):
        raise InvalidInput({"file": [f"the JSON is {jsonsafe.too_deep_message()}"]})
    if not isinstance(value, list):
        raise InvalidInput(
            {"file": [f"Expected a JSON array of objects, got {value_kind(value)}."]}
        )
    return value


def _parse_jsonl(text: str, problems: _Problems) -> list[Any]:
    if text.lstrip().startswith("["):
        raise InvalidInput(
            {"file": ["This looks like a JSON array (it starts with '['); upload it as JSON."]}
        )
    rows: list[Any] = []
    limit = max_rows()
    # Split on "\n" only: str.splitlines() would also split on U+2028 inside JSON strings.
    for line_number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        number = len(rows) + 1
        if number > limit:
            raise InvalidInput({"file": [too_many_rows(limit)]})
        try:
            row = json.loads(line, parse_constant=_reject_constant)
            if jsonsafe.depth_exceeds(row):
                raise RecursionError
            rows.append(row)
        except RecursionError:
            problems.add(f"row {number}: the JSON is {jsonsafe.too_deep_message()}")
            rows.append(None)
        except json.JSONDecodeError as exc:
            where = f"row {number}" + (f" (line {line_number})" if line_number != number else "")
            problems.add(f"{where}: not valid JSON: {exc.msg} at column {exc.colno}")
            rows.append(None)  # a placeholder, so later rows keep their numbers
        except ValueError as exc:
            problems.add(f"row {number}: not valid JSON: {exc}")
            rows.append(None)
    return rows


def _parse_csv(text: str, problems: _Problems, delimiter: str | None = None) -> list[dict]:
    delimiter = delimiter or _sniff_delimiter(text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except csv.Error as exc:
        raise InvalidInput({"file": [f"line {reader.line_num}: malformed CSV: {exc}"]})
    names = _csv_header(header, problems)
    rows: list[dict] = []
    number, limit = 0, max_rows()
    start = reader.line_num + 1
    try:
        for cells in reader:
            line, start = start, reader.line_num + 1
            if not any(cell.strip() for cell in cells):
                continue  # blank lines, and the ",,," rows spreadsheets leave at the end
            number += 1
            if number > limit:
                raise InvalidInput({"file": [too_many_rows(limit)]})
            if len(cells) != len(names):
                problems.add(
                    f"row {number} (line {line}): expected {len(names)} columns as in the "
                    f"header, found {len(cells)}"
                )
                continue
            rows.append({name: _csv_cell(cell) for name, cell in zip(names, cells, strict=True)})
    except csv.Error as exc:
        hint = " (a quoted cell that starts here never ends)" if "end of data" in str(exc) else ""
        problems.add(f"line {start}: malformed CSV: {exc}{hint}")
        problems.raise_if_any()
    return rows


def _sniff_delimiter(text: str) -> str:
    # A header with tabs (or semicolons, as some spreadsheets export) and no comma.
    first = text.split("\n", 1)[0]
    if "," in first:
        return ","
    if "\t" in first:
        return "\t"
    return ";" if ";" in first else ","


def _csv_header(header: list[str], problems: _Problems) -> list[str]:
    names = [name.strip() for name in header]
    seen: dict[str, int] = {}
    for position, name in enumerate(names, 1):
        if not name:
            problems.add(f"header: column {position} has no name")
        elif name in seen:
            problems.add(
                f"header: duplicate column name {name!r} (columns {seen[name]} and {position})"
            )
        else:
            seen[name] = position
    problems.raise_if_any()
    return names


def _csv_cell(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            value = json.loads(stripped, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            return text
        if jsonsafe.depth_exceeds(value):
            return text
        if isinstance(value, dict | list):
            return value
    return text


def value_kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "an object"})
    return names.get(type(value), type(value).__name__)


def rows_check(rows: Any, *, field: str) -> list[str]:
    """Check that ``rows`` is a list of storable JSON objects; return the columns, first-seen."""
    if not isinstance(rows, list):
        raise InvalidInput({field: [f"Expected a list of JSON objects, got {value_kind(rows)}."]})
    limit = max_rows()
    if len(rows) > limit:
        raise InvalidInput({field: [too_many_rows(limit)]})
    problems = _Problems(field)
    columns: dict[str, None] = {}
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            problems.add(f"row {number}: expected a JSON object, got {value_kind(row)}")
            continue
        for key, value in row.items():
            if key not in columns:
                if not key.strip():
                    problems.add(f"row {number}: a column name is empty")
                    continue
                columns[key] = None
            if _has_nul(key) or _has_nul(value):
                problems.add(
                    f"row {number}, column {key!r}: contains a NUL character (\\u0000), "
                    "which cannot be stored"
                )
    problems.raise_if_any()
    return list(columns)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False
