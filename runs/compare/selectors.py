"""Reads of a comparison: runs' per-scenario values from the read model (``ScenarioValue``) in
one binary COPY (from results and annotations for what it does not hold), and what the aligned
rows show beside the values."""

from __future__ import annotations

import struct
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import orjson
from django.db import connection

from runs.metrics import indexes_decode, pack_decode
from runs.traces import trace_roots

Cell = tuple[int, str, str]  # (run id, step key, metric key): one metric of one run

# Binary COPY framing (PostgreSQL docs, "COPY ... binary format"): a 19-byte header, per row an
# int16 field count and (int32 length + data) per field, an int16 -1 as trailer.
_HEADER = 19
_FIELD = struct.Struct(">i")
# Every part is one row: kind, i (int2), count (int4), dtype (text), scale (int2), then indexes
# and values as bytea of big-endian numbers: as packed in ScenarioValuePack (no indexes when
# they are 0 to count - 1; values of the pack's dtype and scale), or int4 and float8 as the rows
# give them when a run has no current pack.
_ROW = struct.Struct(">hihih")  # field count, then length and value of kind, i (int2 each)
_PRESENT, _VALUES, _ERRORED = 0, 1, 2
# A run's pack of a cell, read while its stamp is the run's last refresh; the rows are read
# instead when there is none (HAVING: then the aggregate gives no row and scans nothing).
_PACK_SQL = (
    "SELECT %s::int2, %s::int2, {fields} FROM runs_scenariovaluepack "
    "WHERE run_id = %s AND step_key = %s AND key = %s AND refreshed_at = %s"
)
_UNPACKED = (
    " HAVING NOT EXISTS (SELECT FROM runs_scenariovaluepack WHERE run_id = %s AND step_key = %s"
    " AND key = %s AND refreshed_at = %s)"
)
_AS_ROWS = "0, 'f8'::text, 0::int2"  # count, dtype, scale of what the rows give
_PACKED = "count, dtype::text, scale::int2, {}"
_PACKED_ERRORED = "0, 'f8'::text, 0::int2, errored, NULL::bytea"
_PRESENT_SQL = (
    f"SELECT %s::int2, %s::int2, {_AS_ROWS}, string_agg(int4send(index), ''), NULL::bytea "  # noqa: S608
    "FROM runs_scenario WHERE run_id = %s AND testcase_id IS NOT NULL" + _UNPACKED
)
# ORDER BY the index's own order: an index-only scan of scenariovalue_sort; both aggregates
# take the rows in that one order.
_VALUES_SQL = (
    f"SELECT %s::int2, %s::int2, {_AS_ROWS}, string_agg(int4send(index), ''), "  # noqa: S608
    "string_agg(float8send(coalesce(value, 'NaN'::float8)), '') "
    "FROM (SELECT index, value FROM runs_scenariovalue "
    "WHERE run_id = %s AND step_key = %s AND key = %s ORDER BY value, index) v" + _UNPACKED
)
_ERRORED_SQL = (
    f"SELECT %s::int2, %s::int2, {_AS_ROWS}, string_agg(int4send(index), ''), NULL::bytea "  # noqa: S608
    "FROM runs_scenariovalue WHERE run_id = %s AND step_key = %s AND key = %s "
    "AND value IS NULL AND errors > 0" + _UNPACKED
)


@dataclass
class ReadModelValues:
    """What the read model holds for some runs: scenario indexes and values, not yet aligned."""

    # Indexes as read: a pack's ascend, the rows' come in value order; a dense pack's are
    # range(n), 0 to n - 1, each there.
    present: dict[int, np.ndarray | range] = field(default_factory=dict)  # run -> indexes
    values: dict[Cell, tuple[np.ndarray | range, np.ndarray]] = field(default_factory=dict)
    errored: dict[Cell, np.ndarray] = field(default_factory=dict)  # errored, without a value


def read_model_values(
    run_ids: list[int], cells: list[Cell], refreshed: dict[int, datetime | None] | None = None
) -> ReadModelValues:
    """The scenarios (with a testcase) of these runs and each cell's per-scenario values (NaN
    without one) and errored scenarios, in ONE statement. A run whose packs are of its last
    refresh (``refreshed``: run id -> its ``metrics_refreshed_at``) is read from them: one
    value per part. Otherwise from the rows: an index-only scan of ``scenariovalue_sort`` per
    cell (the ORDER BY picks it), the few NULL values' errors from the same index, the runs'
    scenario indexes. Either way each part comes back as one row of byte strings in binary,
    parsed by numpy, never 100,000 Python objects. A cell the read model has no row for is left
    out of ``values`` (the caller reads it elsewhere)."""
    refreshed = refreshed or {}
    parts, params = [], []

    def part(kind: int, i: int, cell: Cell, fields: str, rows_sql: str, rows_params) -> None:
        """The pack's ``fields`` when current, else ``rows_sql`` (its parameters after kind
        and i: ``rows_params``, then the pack's cell and stamp for ``_UNPACKED``)."""
        stamp = refreshed.get(cell[0])
        parts.extend([_PACK_SQL.format(fields=fields), rows_sql])
        params.extend([kind, i, *cell, stamp, kind, i, *rows_params, *cell, stamp])

    for i, run_id in enumerate(run_ids):  # the run's pack of its scenarios: step and key empty
        fields = _PACKED.format("indexes, NULL::bytea")
        part(_PRESENT, i, (run_id, "", ""), fields, _PRESENT_SQL, [run_id])
    for i, cell in enumerate(cells):
        part(_VALUES, i, cell, _PACKED.format("indexes, numbers"), _VALUES_SQL, cell)
        part(_ERRORED, i, cell, _PACKED_ERRORED, _ERRORED_SQL, cell)
    # Values are parameters; the text joined is this module's own SQL.
    sql = f"COPY ({' UNION ALL '.join(parts)}) TO STDOUT (FORMAT binary)"
    found = ReadModelValues()
    for kind, i, indexes, values in _copy_rows(sql, params):
        if kind == _PRESENT:
            found.present[run_ids[i]] = indexes
        elif kind == _VALUES and len(indexes) and len(indexes) == len(values):
            found.values[cells[i]] = (indexes, values)  # (a torn pack: read elsewhere)
        elif kind == _ERRORED:
            found.errored[cells[i]] = indexes
    return found


def _copy_rows(sql: str, params: list):
    """The rows of a binary COPY, parsed message by message: the server sends each row as one
    message (the header comes with the first, the trailer alone), so no row spans two and only
    one row's bytes are held at a time. Yields kind, i, indexes and values (float64)."""
    with connection.cursor() as cursor:
        # Logged like any other statement (query counts, the debug toolbar see it).
        log = getattr(cursor, "debug_sql", None)
        with log(sql, params) if log else nullcontext(), cursor.cursor.copy(sql, params) as copy:
            for number, message in enumerate(copy):
                pos = _HEADER if number == 0 else 0
                if len(message) > pos and struct.unpack_from(">h", message, pos)[0] != -1:
                    _, _, kind, _, i = _ROW.unpack_from(message, pos)
                    count, pos = _field(message, pos + _ROW.size)
                    dtype, pos = _field(message, pos)
                    scale, pos = _field(message, pos)
                    length, at = _FIELD.unpack_from(message, pos)[0], pos + 4
                    indexes = indexes_decode(int.from_bytes(count, "big"), message, at, length)
                    pos = at + max(length, 0)  # -1: NULL (string_agg of no rows)
                    length, at = _FIELD.unpack_from(message, pos)[0], pos + 4
                    values = pack_decode(
                        dtype.decode(), int.from_bytes(scale, "big"), message, at, max(length, 0)
                    )
                    yield kind, i, indexes, values


def _field(data, pos: int) -> tuple[bytes, int]:
    """One field's bytes and where the next field starts."""
    (length,) = _FIELD.unpack_from(data, pos)
    return bytes(data[pos + 4 : pos + 4 + length]), pos + 4 + length


_VALUE = (
    "CASE jsonb_typeof(a.outputs #> %s) WHEN 'number' THEN (a.outputs #>> %s)::float8 "
    "WHEN 'boolean' THEN (a.outputs #>> %s)::boolean::int END"
)


def results_values(
    run_id: int, columns: list[tuple[str, list[str]]]
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """For what the read model does not hold (cells that landed since its last refresh, a key
    it has no row for): the run's (scenario id, index) pairs (with a testcase), and one row per
    result of the columns' steps: scenario id, its step's position in ``steps`` + 1, whether it
    errored, then each column's value dug out of its annotation (NaN without one).
    ``columns``: (step key, path inside the outputs) each."""
    steps = sorted({step for step, _ in columns})
    selects, params = [], []
    for step, path in columns:
        selects.append(f"CASE WHEN r.step_key = %s THEN {_VALUE} END")
        params += [step, path, path, path]
    # Values are parameters; the only text spliced in is this module's own SQL.
    sql = (
        "SELECT r.scenario_id, array_position(%s::text[], r.step_key::text), "  # noqa: S608
        f"(r.status = 'error')::int{''.join(', ' + c for c in selects)} "
        "FROM runs_result r LEFT JOIN runs_annotation a ON a.id = r.annotation_id "
        "WHERE r.run_id = %s AND r.step_key = ANY(%s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, index FROM runs_scenario WHERE run_id = %s AND testcase_id IS NOT NULL",
            [run_id],
        )
        scenarios = np.array(cursor.fetchall(), dtype=np.int64).reshape(-1, 2)
        cursor.execute(sql, [steps, *params, run_id, steps])
        rows = np.array(cursor.fetchall(), dtype=float).reshape(-1, 3 + len(columns))
    return scenarios, rows, steps


@dataclass
class AlignedCells:
    """What aligned rows show beside the values, for some runs' scenarios at some indexes."""

    scenarios: dict[tuple[int, int], tuple[int, str, dict]]  # (run, index) -> id, status, inputs
    errors: dict[tuple[int, str], dict]  # (scenario, step key) -> its repeat-0 cell's error
    outputs: dict[tuple[int, str], Any]  # (scenario, step key) -> its trace's root outputs


def aligned_cells(
    run_ids: list[int], indexes: list[int], *, steps: list[str], outputs_steps: list[str]
) -> AlignedCells:
    """The scenarios (with a testcase) of these runs at these indexes with their status and
    inputs, the errors of their repeat-0 cells of ``steps``, and the root outputs of the traces
    of their ``outputs_steps`` cells: three queries for any number of runs and rows."""
    with connection.cursor() as cursor:
        cursor.execute(_SCENARIOS_SQL, [run_ids, indexes])
        scenarios = {
            (run_id, index): (pk, status, orjson.loads(inputs))
            for pk, run_id, index, status, inputs in cursor.fetchall()
        }
        ids = [s[0] for s in scenarios.values()]
        cursor.execute(_CELLS_SQL, [outputs_steps, run_ids, ids, [*steps, *outputs_steps]])
        cells = cursor.fetchall()
    errors, traces = {}, {}
    for scenario_id, step_key, error, trace_id, created_at, root in cells:
        error = orjson.loads(error) if error is not None else None
        if error:  # as the scenario table: an empty error is none
            errors[(scenario_id, step_key)] = error
        elif created_at is not None:
            traces[(scenario_id, step_key)] = _TraceRef(trace_id, created_at, root)
    roots = trace_roots(traces.values(), "outputs") if traces else {}
    outputs = {key: roots.get(t.pk, {}).get("outputs") for key, t in traces.items()}
    return AlignedCells(scenarios, errors, outputs)


_SCENARIOS_SQL = (
    "SELECT id, run_id, index, status, inputs FROM runs_scenario "
    "WHERE run_id = ANY(%s) AND index = ANY(%s) AND testcase_id IS NOT NULL"
)
_CELLS_SQL = (
    "SELECT r.scenario_id, r.step_key, r.error, r.trace_id, t.created_at, t.root_span_id "
    "FROM runs_result r LEFT JOIN runs_trace t ON t.id = r.trace_id AND r.step_key = ANY(%s) "
    "WHERE r.run_id = ANY(%s) AND r.scenario_id = ANY(%s) AND r.repeat_idx = 0 "
    "AND r.step_key = ANY(%s)"
)


class _TraceRef(NamedTuple):
    """What ``trace_roots`` reads of a trace (its spans' partition, its root), without building
    a model instance per row."""

    pk: int
    created_at: datetime
    root_span_id: str
