"""Bulk inserts through PostgreSQL's COPY: the engine writes thousands of rows per unit, and
COPY costs a fraction of an INSERT built by the ORM. Rows that others point at get their ids
from the table's sequence first, so the caller can link to them before they are written.
Exports read the other way, ``COPY (SELECT ...) TO STDOUT``, streamed (``copy_out``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext, suppress

from django.db import DatabaseError, connection
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


COPY_CHUNK_BYTES = 256 * 1024
# COPY's CSV format with a quote and a delimiter no JSON text holds raw (PostgreSQL's JSON
# output escapes every control character): each one-column row comes out exactly as it is.
COPY_LINES = "(FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01')"


# An export's plan costs enough to be compiled (JIT), which takes seconds for its hundreds of
# cell expressions and saves less than that. Its lookups are by unique key, one per row and never
# repeated, so a cache in front of each (Memoize) only adds its own work: a fifth of a run
# export's time, measured (benchmarks/export_bench.py). A comparison's hash joins (one per
# run's results and read model) and its sort by index fit in 16 MB at 100,000 rows, where the
# default 4 MB splits them into batches on disk: an eighth of its time. Larger exports still
# batch, so an export holds at most 16 MB per sort (32 MB per hash) whatever its size.
_EXPORT_PLANNER = {"jit": "off", "enable_memoize": "off", "work_mem": "16MB"}


def _planner_set(cursor, settings: dict[str, str], *, local: bool) -> dict[str, str]:
    """Sets ``settings`` for this connection and gives the values they replace. ``local`` (in a
    transaction): for it alone, as a caller's own ``SET LOCAL`` would be, so they end with it
    whatever happens; else for the session, until set back the same way."""
    cursor.execute(
        "SELECT p.name, p.old, set_config(p.name, p.new, %s) FROM (SELECT name, new,"
        " current_setting(name) AS old FROM unnest(%s::text[], %s::text[]) AS u(name, new)"
        " OFFSET 0) p",  # OFFSET 0: each old value is read before it is set
        [local, list(settings), list(settings.values())],
    )
    return {name: old for name, old, _ in cursor.fetchall()}


def copy_out(
    sql: str,
    params: Sequence = (),
    *,
    head: bytes = b"",
    crlf: bool = False,
    chunk_rows: int | None = None,
) -> Iterator[bytes]:
    """What ``COPY (...) TO STDOUT`` sends, after ``head``, as PostgreSQL produces it, in chunks
    of about ``COPY_CHUNK_BYTES`` (or ``chunk_rows`` rows, when that comes first), each ending
    with a whole row. ``crlf``: rows end with CR LF, as Python's CSV writer ends them, not LF
    (line breaks inside quoted cells stay as they are).

    Nothing is read before the first chunk is asked for, and no more than a chunk is held.
    Closing the generator early (a client that went away: the server closes the response)
    cancels the statement and drains what was already sent, so the server stops working and
    the connection is clean for its next use."""
    with connection.cursor() as cursor:
        # Set back as they were set, even if the transaction ends while the stream is open.
        local = not connection.get_autocommit()
        previous = _planner_set(cursor, _EXPORT_PLANNER, local=local)
        log = getattr(cursor, "debug_sql", None)  # query logs and counts see it, under DEBUG
        try:
            with (
                log(sql, params) if log else nullcontext(),
                cursor.cursor.copy(sql, params) as copy,
            ):
                buffer, rows = bytearray(head), 0
                for data in copy:  # one row each, its last byte the row's LF
                    buffer += data
                    if crlf:
                        buffer[-1:] = b"\r\n"
                    rows += 1
                    if len(buffer) >= COPY_CHUNK_BYTES or rows == chunk_rows:
                        yield bytes(buffer)
                        buffer.clear()
                        rows = 0
                if buffer:
                    yield bytes(buffer)
        finally:
            # In a transaction that failed (a cancelled COPY aborts it) this fails too, and the
            # rollback that must follow undoes the settings with the rest.
            with suppress(DatabaseError):
                _planner_set(cursor, previous, local=local)
