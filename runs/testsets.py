"""Testsets: create from rows or a file (CSV, JSON, JSONL), revise into new versions, export.

Every write is one transaction. Changing rows never edits a version: it makes a new immutable
``TestsetVersion`` and moves ``head`` to it, so runs keep exactly the rows they used.

Errors are ``InvalidInput`` naming the field (``file`` for an upload, ``rows`` for rows sent as
JSON) with messages that say where: ``row 3 (line 4): expected 4 columns as in the header,
found 5``. Rows are counted from 1, like a spreadsheet; ``Testcase.index`` (and the API's
``/rows/{index}``) counts from 0. See docs/testsets.md.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connection, transaction
from django.db.models import Max, ProtectedError, Q, QuerySet
from django.utils import timezone
from django.utils.text import slugify

from evalsite.errors import InvalidInput
from evalsite.models import Project
from runs.models import Result, Run, Scenario, Testcase, Testset, TestsetVersion

FORMATS = ("csv", "json", "jsonl")
EXPORT_CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "jsonl": "application/x-ndjson",
}
# Overridable in settings (EVALSITE_TESTSET_MAX_BYTES / EVALSITE_TESTSET_MAX_ROWS).
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_MAX_ROWS = 100_000
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
    return getattr(settings, "EVALSITE_TESTSET_MAX_BYTES", DEFAULT_MAX_BYTES)


def max_rows() -> int:
    return getattr(settings, "EVALSITE_TESTSET_MAX_ROWS", DEFAULT_MAX_ROWS)


@dataclass
class ParsedRows:
    rows: list[dict[str, Any]]
    columns: list[str]
    format: str


# --- reads ------------------------------------------------------------------------------------


def testset_list(*, project: Project, search: str = "") -> QuerySet[Testset]:
    testsets = Testset.objects.for_project(project).select_related("head")
    if search:
        testsets = testsets.filter(
            Q(name__icontains=search) | Q(slug__icontains=search) | Q(description__icontains=search)
        )
    return testsets


def testset_get(*, project: Project, ref: str | int) -> Testset | None:
    """A testset by slug or id, within the project (a slug wins over an id that looks the same)."""
    testsets = Testset.objects.for_project(project).select_related("head")
    found = testsets.filter(slug=str(ref)).first()
    if found is None and str(ref).isdigit():
        found = testsets.filter(pk=int(ref)).first()
    return found


def testset_version_get(*, testset: Testset, version: int | None = None) -> TestsetVersion | None:
    """The version numbered ``version``, or the head when it is None."""
    if version is None:
        head = testset.head
        if head is not None:
            head.testset = testset
        return head
    found = testset.versions.filter(version=version).select_related("created_by").first()
    if found is not None:
        found.testset = testset
    return found


def testset_rows(*, version: TestsetVersion, offset: int = 0, limit: int = 50) -> list[Testcase]:
    # Indexes are contiguous from 0 in every version, so a page is an index range on the
    # (version, index) unique index: no OFFSET scan, no COUNT (row_count is stored).
    rows = version.testcases.filter(index__gte=offset, index__lt=offset + limit)
    return list(rows.order_by("index"))


# --- parsing ----------------------------------------------------------------------------------


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
    columns = _check_rows(rows, field="file")
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


def _too_many(limit: int) -> str:
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
    if not isinstance(value, list):
        raise InvalidInput({"file": [f"Expected a JSON array of objects, got {_kind_of(value)}."]})
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
            raise InvalidInput({"file": [_too_many(limit)]})
        try:
            rows.append(json.loads(line, parse_constant=_reject_constant))
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
                raise InvalidInput({"file": [_too_many(limit)]})
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
        except ValueError:
            return text
        if isinstance(value, dict | list):
            return value
    return text


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "an object"})
    return names.get(type(value), type(value).__name__)


def _check_rows(rows: Any, *, field: str) -> list[str]:
    """Check that ``rows`` is a list of storable JSON objects; return the columns, first-seen."""
    if not isinstance(rows, list):
        raise InvalidInput({field: [f"Expected a list of JSON objects, got {_kind_of(rows)}."]})
    limit = max_rows()
    if len(rows) > limit:
        raise InvalidInput({field: [_too_many(limit)]})
    problems = _Problems(field)
    columns: dict[str, None] = {}
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            problems.add(f"row {number}: expected a JSON object, got {_kind_of(row)}")
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


# --- create, update, delete -------------------------------------------------------------------


@transaction.atomic
def testset_create(
    *,
    project: Project,
    name: str,
    rows: list[dict[str, Any]],
    slug: str = "",
    description: str = "",
    message: str = "",
    author=None,
) -> Testset:
    """Create a testset whose version 1 holds ``rows`` (JSON objects; any keys; may be empty)."""
    columns = _check_rows(rows, field="rows")
    return _create(project, name, slug, description, rows, columns, message or "Created", author)


@transaction.atomic
def testset_create_from_file(
    *,
    project: Project,
    file,
    name: str = "",
    slug: str = "",
    description: str = "",
    format: str = "",
    message: str = "",
    author=None,
) -> Testset:
    """Create a testset from an uploaded CSV, JSON or JSONL file (see ``testset_file_parse``).

    The name defaults to the file's name without its extension.
    """
    parsed = testset_file_read(file=file, format=format)
    filename = PurePosixPath(getattr(file, "name", "") or "").name
    name = name.strip() or PurePosixPath(filename).stem or "Uploaded testset"
    message = message or (f"Uploaded {filename}" if filename else "Uploaded")
    return _create(project, name, slug, description, parsed.rows, parsed.columns, message, author)


def _create(project, name, slug, description, rows, columns, message, author) -> Testset:
    name = name.strip()
    if not name:
        raise InvalidInput({"name": ["This field is required."]})
    if slug:
        try:
            validate_slug(slug)
        except ValidationError as exc:
            raise InvalidInput({"slug": list(exc.messages)})
        if Testset.objects.filter(project=project, slug=slug).exists():
            raise InvalidInput({"slug": [f"A testset with slug {slug!r} already exists."]})
    testset = Testset.objects.create(
        project=project,
        slug=slug or _unique_slug(project, name),
        name=name[:200],
        description=description,
        created_by=_person(author),
    )
    version = _version_create(testset, columns, len(rows), message, author)
    _rows_insert(version, rows)
    return testset


@transaction.atomic
def testset_update(
    *, testset: Testset, name: str | None = None, description: str | None = None
) -> Testset:
    """Change the name or description; rows and versions are untouched."""
    if name is not None:
        if not name.strip():
            raise InvalidInput({"name": ["This field is required."]})
        testset.name = name.strip()[:200]
    if description is not None:
        testset.description = description
    testset.updated_at = timezone.now()
    testset.save(update_fields=["name", "description", "updated_at"])
    return testset


@transaction.atomic
def testset_delete(*, testset: Testset) -> None:
    """Delete a testset with its versions and rows; refused while a run uses any version."""
    runs = Run.objects.filter(testset_version__testset=testset)
    used = sorted(set(runs.values_list("testset_version__version", flat=True)))
    if used:
        count = runs.count()
        versions = ", ".join(f"v{v}" for v in used)
        raise InvalidInput(
            f"{count} run{'s use' if count > 1 else ' uses'} this testset ({versions}); "
            "delete those runs first."
        )
    # Bulk-delete the rows in SQL: the ORM would load every row to follow the SET_NULL links.
    Scenario.objects.filter(testcase__version__testset=testset).update(testcase=None)
    Result.objects.filter(testcase__version__testset=testset).update(testcase=None)
    table, versions_table = Testcase._meta.db_table, TestsetVersion._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE version_id IN "  # noqa: S608 (table names, not input)
            f"(SELECT id FROM {versions_table} WHERE testset_id = %s)",
            [testset.pk],
        )
    try:
        testset.delete()
    except ProtectedError:
        raise InvalidInput("Something still uses this testset's versions; it was not deleted.")


def _unique_slug(project: Project, base: str) -> str:
    base = slugify(base)[:90] or "testset"
    slug, n = base, 2
    while Testset.objects.filter(project=project, slug=slug).exists():
        slug, n = f"{base}-{n}", n + 1
    return slug


def _person(user):
    return user if getattr(user, "pk", None) else None


# --- revisions: each makes a new version ------------------------------------------------------


@transaction.atomic
def testset_revise(
    *,
    testset: Testset,
    rows: list[dict[str, Any]],
    message: str = "",
    author=None,
    base_version: int | None = None,
) -> TestsetVersion:
    """Replace every row: the new version holds exactly ``rows``."""
    testset, _head = _lock(testset, base_version)
    columns = _check_rows(rows, field="rows")
    version = _version_create(testset, columns, len(rows), message or "Replaced the rows", author)
    _rows_insert(version, rows)
    return version


@transaction.atomic
def testset_revise_from_file(
    *,
    testset: Testset,
    file,
    format: str = "",
    message: str = "",
    author=None,
    base_version: int | None = None,
) -> TestsetVersion:
    """Replace every row with an uploaded file's."""
    testset, _head = _lock(testset, base_version)
    parsed = testset_file_read(file=file, format=format)
    filename = PurePosixPath(getattr(file, "name", "") or "").name
    message = message or (f"Uploaded {filename}" if filename else "Uploaded")
    version = _version_create(testset, parsed.columns, len(parsed.rows), message, author)
    _rows_insert(version, parsed.rows)
    return version


@transaction.atomic
def testset_rows_add(
    *,
    testset: Testset,
    rows: list[dict[str, Any]],
    message: str = "",
    author=None,
    base_version: int | None = None,
) -> TestsetVersion:
    """Append ``rows`` after the head's rows; new columns are appended to the column list."""
    testset, head = _lock(testset, base_version)
    added = _check_rows(rows, field="rows")
    if not rows:
        raise InvalidInput({"rows": ["Give at least one row to add."]})
    count = head.row_count + len(rows)
    if count > max_rows():
        raise InvalidInput({"rows": [_too_many(max_rows())]})
    columns = _merge_columns(head.columns, added)
    default = f"Added {len(rows)} row{'s' if len(rows) > 1 else ''}"
    version = _version_create(testset, columns, count, message or default, author)
    _rows_copy(head, version)
    _rows_insert(version, rows, start=head.row_count)
    return version


@transaction.atomic
def testset_row_update(
    *,
    testset: Testset,
    index: int,
    data: dict[str, Any],
    merge: bool = False,
    message: str = "",
    author=None,
    base_version: int | None = None,
) -> TestsetVersion:
    """Replace row ``index`` (0-based) with ``data``, or with ``data`` merged over it.

    Returns the new version, or the head unchanged when the row would not change.
    """
    testset, head = _lock(testset, base_version)
    _check_index(head, index)
    if not isinstance(data, dict):
        raise InvalidInput({"data": [f"Expected a JSON object, got {_kind_of(data)}."]})
    old = head.testcases.get(index=index).data
    new = {**old, **data} if merge else data
    _check_rows([new], field="data")
    if new == old:
        return head
    version = _version_create(testset, [], head.row_count, message or f"Edited row {index}", author)
    _rows_copy(head, version, drop=index)
    _rows_insert(version, [new], start=index)
    version.columns = _merge_columns(_present(head.columns, version), list(new))
    version.save(update_fields=["columns"])
    return version


@transaction.atomic
def testset_row_delete(
    *, testset: Testset, index: int, message: str = "", author=None, base_version: int | None = None
) -> TestsetVersion:
    """Remove row ``index`` (0-based); later rows move up one index in the new version."""
    testset, head = _lock(testset, base_version)
    _check_index(head, index)
    count = head.row_count - 1
    version = _version_create(testset, [], count, message or f"Deleted row {index}", author)
    _rows_copy(head, version, drop=index, close_gap=True)
    version.columns = _present(head.columns, version)
    version.save(update_fields=["columns"])
    return version


def _lock(testset: Testset, base_version: int | None) -> tuple[Testset, TestsetVersion]:
    # One writer at a time per testset, so two edits cannot both become version N+1.
    testset = Testset.objects.select_for_update().get(pk=testset.pk)
    head = testset.head
    if head is None:
        raise InvalidInput("This testset has no version to edit.")
    if base_version is not None and base_version != head.version:
        raise InvalidInput(
            {
                "base_version": [
                    f"The testset changed while you were editing: you started from "
                    f"v{base_version}, the head is now v{head.version}. Reload and try again."
                ]
            }
        )
    return testset, head


def _check_index(head: TestsetVersion, index: int) -> None:
    if not 0 <= index < head.row_count:
        span = f" (indexes 0 to {head.row_count - 1})" if head.row_count else ""
        raise InvalidInput(
            {"index": [f"No row {index}; v{head.version} has {head.row_count} rows{span}."]}
        )


def _version_create(testset, columns, row_count, message, author) -> TestsetVersion:
    number = (testset.versions.aggregate(n=Max("version"))["n"] or 0) + 1
    version = TestsetVersion.objects.create(
        project_id=testset.project_id,
        testset=testset,
        version=number,
        columns=columns,
        row_count=row_count,
        message=message[:500],
        created_by=_person(author),
    )
    testset.head = version
    testset.updated_at = timezone.now()
    testset.save(update_fields=["head", "updated_at"])
    return version


def _rows_insert(version: TestsetVersion, rows: Iterable[dict], start: int = 0) -> None:
    Testcase.objects.bulk_create(
        (
            Testcase(project_id=version.project_id, version=version, index=start + i, data=row)
            for i, row in enumerate(rows)
        ),
        batch_size=BATCH_SIZE,
    )


def _rows_copy(
    source: TestsetVersion, target: TestsetVersion, drop: int | None = None, close_gap=False
) -> None:
    """Copy rows between versions inside PostgreSQL (one edit of 100k rows moves no data
    through Python), leaving out row ``drop`` and, with ``close_gap``, moving later rows up."""
    table = Testcase._meta.db_table
    shift = 'CASE WHEN "index" > %s THEN 1 ELSE 0 END' if close_gap else "0"
    params: list[Any] = [target.pk, *([drop] if close_gap else []), source.pk]
    where = "version_id = %s"
    if drop is not None:
        where += ' AND "index" <> %s'
        params.append(drop)
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} (project_id, version_id, "index", data) '  # noqa: S608 (table name, not input)
            f'SELECT project_id, %s, "index" - {shift}, data FROM {table} WHERE {where}',
            params,
        )


def _present(columns: list[str], version: TestsetVersion) -> list[str]:
    """``columns`` without those no row of ``version`` has any more."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT jsonb_object_keys(data) FROM {Testcase._meta.db_table} "  # noqa: S608
            "WHERE version_id = %s",
            [version.pk],
        )
        keys = {key for (key,) in cursor.fetchall()}
    return [column for column in columns if column in keys]


def _merge_columns(columns: list[str], more: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*columns, *more]))


# --- export -----------------------------------------------------------------------------------


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
