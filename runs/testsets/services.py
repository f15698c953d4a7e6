"""Testsets: reads, create / update / delete, and revisions (each change makes a new version)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connection, transaction
from django.db.models import Max, ProtectedError, Q, QuerySet
from django.utils import timezone
from django.utils.text import slugify

from evalsite.errors import InvalidInput
from evalsite.models import Project
from runs.models import Result, Run, Scenario, Testcase, Testset, TestsetVersion
from runs.testsets.parse import (
    BATCH_SIZE,
    max_rows,
    rows_check,
    testset_file_read,
    too_many_rows,
    value_kind,
)


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
    if found is None and str(ref).isdecimal():
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
    columns = rows_check(rows, field="rows")
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
    columns = rows_check(rows, field="rows")
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
    added = rows_check(rows, field="rows")
    if not rows:
        raise InvalidInput({"rows": ["Give at least one row to add."]})
    count = head.row_count + len(rows)
    if count > max_rows():
        raise InvalidInput({"rows": [too_many_rows(max_rows())]})
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
        raise InvalidInput({"data": [f"Expected a JSON object, got {value_kind(data)}."]})
    old = head.testcases.get(index=index).data
    new = {**old, **data} if merge else data
    rows_check([new], field="data")
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
