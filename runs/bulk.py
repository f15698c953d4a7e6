"""Bulk inserts through PostgreSQL's COPY: the engine writes thousands of rows per unit, and
COPY costs a fraction of an INSERT built by the ORM. Rows that others point at get their ids
from the table's sequence first, so the caller can link to them before they are written."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connection
from django.db.models import JSONField, Model
from psycopg.types.json import Jsonb


def ids_reserve(model: type[Model], count: int) -> list[int]:
    """``count`` fresh primary keys from the table's own sequence."""
    if not count:
        return []
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [table, count],
        )
        return [row[0] for row in cursor.fetchall()]


def copy_insert(objs: Sequence[Model], *, with_ids: bool = False) -> None:
    """Insert model instances with one COPY. ``with_ids``: give each a reserved primary key
    first (set on the instance), for rows that later rows reference."""
    if not objs:
        return
    model = type(objs[0])
    if with_ids:
        for obj, pk in zip(objs, ids_reserve(model, len(objs)), strict=True):
            obj.pk = pk
    fields = [f for f in model._meta.concrete_fields if with_ids or not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    sql = f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for obj in objs:
            copy.write_row(
                [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields]
            )


def copy_rows(model: type[Model], attnames: Sequence[str], rows: Iterable[Sequence]) -> None:
    """Insert plain tuples (values in ``attnames`` order, as the database takes them; JSON
    fields as Python values) with one COPY, without building model instances."""
    fields = [model._meta.get_field(name) for name in attnames]  # attnames work too
    json_at = [i for i, f in enumerate(fields) if isinstance(f, JSONField)]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    sql = f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for row in rows:
            if json_at:
                row = list(row)
                for i in json_at:
                    row[i] = None if row[i] is None else Jsonb(row[i])
            copy.write_row(row)
