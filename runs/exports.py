"""CSV and JSONL exports of a run's scenario table and of a comparison, built in PostgreSQL and
streamed with ``COPY (SELECT ...) TO STDOUT``.

Each export is one statement: every row is assembled by the database, cell by cell, the CSV
cells as text (PostgreSQL's CSV writer quotes them) and each JSONL line as JSON text, so Python
only passes bytes along, a chunk at a time (``bulk.copy_out``): the rate is the database's and
the memory is one chunk, whatever the number of rows. A client that disconnects cancels it.

A run's export has the run page's rows: ``selectors.scenario_filter`` with the same
``TableQuery`` (filters), ordered as the page orders them, each cell the asked repeat's cell as
the table shows it (inputs from the scenario, outputs from the invocation trace's root span,
evaluator outputs from the cell's annotation). A comparison's export has the comparison page's
rows: per-scenario values from the read model (``ScenarioValue``) while it is current, else
averaged from the results as the page does, the page's filters, deltas rounded to 12 places.

Errors are never numbers: a CSV cell says ``error: <code>``; a JSONL row carries an ``errors``
object (column -> the stored error) beside its ``values``. CSV text that a spreadsheet would
run as a formula (starting with = + - @, tab or CR) is prefixed with ``'``; JSONL is exact.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from django.http import StreamingHttpResponse

from runs import compare, selectors
from runs.bulk import COPY_LINES, copy_out
from runs.models import Run

FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NONE = "NULL::jsonb"
_INPUTS_PREFIX = ["attributes", "ag", "data", "inputs"]


def csv_cell(value: Any) -> str:
    """A value as a CSV cell; the SQL twin of this is ``_csv_text``."""
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


def stream_response(chunks, *, fmt: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(chunks, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


def _header(names: list[str]) -> bytes:
    line = io.StringIO()
    csv.writer(line).writerow(names)
    return line.getvalue().encode()


def _key(name: str) -> str:
    """``"name": `` as JSON text, for a line assembled in SQL."""
    return json.dumps(name, ensure_ascii=False) + ": "


# --- cells as SQL ---------------------------------------------------------------------------------
# Each takes SQL expressions (column references of an inner query, so each value is extracted
# once per row) and gives a SQL expression. Values are always parameters: the only text spliced
# into a statement is this module's own SQL and aliases (hence the noqa: S608 below).


def _csv_text(value: str) -> str:
    """A ``jsonb`` value as ``csv_cell`` writes it: NULL (an empty cell) for none or JSON null,
    a string as itself behind the formula guard, anything else as its JSON text."""
    text = f"({value} #>> '{{}}')"
    guarded = (
        f"CASE WHEN left({text}, 1) IN ('=', '+', '-', '@', E'\\t', E'\\r') "
        f"THEN '''' || {text} ELSE nullif({text}, '') END"
    )
    return (
        f"CASE jsonb_typeof({value}) WHEN 'string' THEN {guarded} "
        f"WHEN 'null' THEN NULL ELSE {value}::text END"
    )


def _csv_error(error: str) -> str:
    return f"'error: ' || coalesce(nullif({error} ->> 'code', ''), 'error')"


def _errored(result: str) -> str:
    """The cell holds an error (a stored error that is not empty)."""
    return f"({result}.error IS NOT NULL AND {result}.error NOT IN ('null', '{{}}'))"


def _number(value: str) -> str:
    """A float8 as Python writes a float (``json.dumps``): ``1.0``, not PostgreSQL's ``1``."""
    return (
        f"CASE WHEN {value} = trunc({value}) AND abs({value}) < 1e16 "
        f"THEN {value}::bigint::text || '.0' ELSE {value}::text END"
    )


def _object(entries: list[str]) -> str:
    """A JSON object from ``"key": value`` entries, each NULL to leave it out."""
    if not entries:
        return "'{}'"
    return f"'{{' || array_to_string(ARRAY[{', '.join(entries)}]::text[], ', ') || '}}'"


def _root_joins(result: str) -> str:
    """Joins the root span of the trace of the cell ``result`` by its ``root_span_id``; the
    trace's created_at is its spans' day, the partition key, so a lookup reads one partition."""
    t, p = f"{result}t", f"{result}p"
    # LATERAL ... OFFSET 0: a lookup by index per row, never a hash of the whole table, so an
    # export costs its own run's rows however many traces other runs and projects hold.
    return (
        f" LEFT JOIN LATERAL (SELECT id, created_at, root_span_id FROM runs_trace"  # noqa: S608
        f" WHERE id = {result}.trace_id OFFSET 0) {t} ON true"
        f" LEFT JOIN LATERAL (SELECT span_id, attributes FROM runs_span"
        f" WHERE trace_id = {t}.id AND trace_time = {t}.created_at"
        f" AND span_id = {t}.root_span_id AND parent_id = '' OFFSET 0) {p} ON true"
    )


def _root(result: str) -> str:
    """The root span's attributes, as ``trace_roots`` finds the root: the trace's
    ``root_span_id`` among its spans without a parent, else the earliest of those (looked for
    only then: a subquery in a CASE runs only for the rows that reach it)."""
    t, p = f"{result}t", f"{result}p"
    return (
        f"CASE WHEN {p}.span_id IS NOT NULL THEN {p}.attributes WHEN {t}.id IS NOT NULL THEN"  # noqa: S608
        f" (SELECT z.attributes FROM runs_span z WHERE z.trace_id = {t}.id"
        f" AND z.trace_time = {t}.created_at AND z.parent_id = '' ORDER BY z.start_time, z.id"
        " LIMIT 1) END"
    )


def _inputs_path(path: list[str]) -> list[str] | None:
    """Where a run's input column sits in ``Scenario.inputs`` (as ``scenario_rows`` reads it)."""
    if path[0] == "data":
        return path[1:]
    if path[:4] == _INPUTS_PREFIX:
        return path[4:]
    return None


@dataclass
class _Cell:
    """One column of an export row, as columns of the inner query (``x.cN``)."""

    name: str
    value: str  # the jsonb value; NULL without one
    present: str = "true"  # JSONL: the row's ``values`` has it (a value, maybe JSON null)
    error: str = ""  # the stored error when the cell errored, else NULL; "": it never errs


class _Select:
    """The inner query's columns and joins, each part's parameters kept in its place."""

    def __init__(self) -> None:
        self.columns: list[str] = []
        self.column_params: list = []
        self.joins: list[str] = []
        self.join_params: list = []

    def column(self, sql: str, *params) -> str:
        name = f"c{len(self.columns)}"
        self.columns.append(f"{sql} AS {name}")
        self.column_params += params
        return f"x.{name}"

    def join(self, sql: str, *params) -> None:
        self.joins.append(sql)
        self.join_params += params


# --- a run's scenario table ----------------------------------------------------------------------


def _run_cells(run: Run, repeat: int, q: _Select) -> list[_Cell]:
    """The run's mapped columns, as ``scenario_rows`` reads them: the asked repeat's cell wins,
    input cells exist for repeat 0 only; a cell without a value (none yet) has none."""
    cells, results, joined = [], {}, set()
    for mapping in run.mappings:
        kind, name = mapping["column"]["kind"], mapping["column"]["name"]
        step, path = mapping["step"]["key"], mapping["step"]["path"].split(".")
        if kind == "input":
            inner = _inputs_path(path)
            value = q.column("s.inputs #> %s::text[]", inner) if inner is not None else _NONE
            cells.append(_Cell(name, value))
            continue
        if step not in results:
            results[step] = _run_result(run, step, repeat, q)
        r = results[step]
        ok = f"NOT {_errored(r)}"
        if kind == "outputs":
            if r not in joined:
                q.join(_root_joins(r))
            value = (
                q.column(f"CASE WHEN {ok} THEN {_root(r)} #> %s::text[] END", path[1:])
                if path[0] == "attributes"
                else _NONE
            )
            present = q.column(f"{ok} AND {r}.trace_id IS NOT NULL")
        else:
            if r not in joined:
                q.join(
                    f" LEFT JOIN LATERAL (SELECT outputs FROM runs_annotation"  # noqa: S608
                    f" WHERE id = {r}.annotation_id OFFSET 0) {r}a ON true"
                )
            value = q.column(f"CASE WHEN {ok} THEN {r}a.outputs #> %s::text[] END", path[4:])
            present = q.column(f"{ok} AND {r}.annotation_id IS NOT NULL")
        joined.add(r)
        error = q.column(f"CASE WHEN {_errored(r)} THEN {r}.error END")
        cells.append(_Cell(name, value, present, error))
    return cells


def _run_result(run: Run, step: str, repeat: int, q: _Select) -> str:
    """Joins each scenario's cell of ``step``; its alias."""
    r = f"xr{len(q.joins)}"
    if repeat:
        q.join(
            " LEFT JOIN (SELECT DISTINCT ON (scenario_id) scenario_id, error, trace_id, annotation_id"  # noqa: S608
            " FROM runs_result WHERE run_id = %s AND step_key = %s AND repeat_idx IN (0, %s)"
            f" ORDER BY scenario_id, repeat_idx DESC) {r} ON {r}.scenario_id = s.id",
            run.pk,
            step,
            repeat,
        )
    else:
        q.join(
            " LEFT JOIN LATERAL (SELECT error, trace_id, annotation_id FROM runs_result"  # noqa: S608
            " WHERE run_id = %s AND scenario_id = s.id AND step_key = %s AND repeat_idx = 0"
            f" OFFSET 0) {r} ON true",
            run.pk,
            step,
        )
    return r


def _run_order(run: Run, query: selectors.TableQuery, q: _Select) -> str:
    """The run page's order (``selectors.table_page``): by a metric, the scenarios with a value
    (value and index both descending for ``-metric``), then those whose cells give none, then
    those not evaluated yet, each by index; by an input, its text, missing last, then index."""
    metric = selectors.metric_column(run, query.sort) if query.sort else None
    mapping = next((m for m in run.mappings if m["column"]["name"] == query.sort), None)
    path = _inputs_path(mapping["step"]["path"].split(".")) if mapping else None
    direction = "DESC" if query.desc else "ASC"
    if metric:
        q.join(
            " LEFT JOIN runs_scenariovalue xsort ON xsort.run_id = %s AND xsort.step_key = %s"
            " AND xsort.key = %s AND xsort.index = s.index",
            run.pk,
            *metric,
        )
        value, unread = q.column("xsort.value"), q.column("xsort.id IS NULL")
        if query.desc:
            return (
                f"{value} IS NULL, {value} DESC, {unread},"
                f" CASE WHEN {value} IS NULL THEN x.index END, x.index DESC"
            )
        return f"{value} IS NULL, {value}, {unread}, x.index"
    if mapping and mapping["column"]["kind"] == "input" and path is not None:
        return f"{q.column('s.inputs #>> %s::text[]', path)} {direction} NULLS LAST, x.index"
    return f"x.index {direction}"


def run_export_sql(run: Run, query: selectors.TableQuery, *, fmt: str) -> tuple[str, list]:
    """The ``COPY`` statement of a run's export (rows only) and its parameters."""
    found = selectors.scenario_filter(run, query)
    q = _Select()
    cells = _run_cells(run, query.repeat, q)
    order = _run_order(run, query, q)
    # In index order the rows come so from the scenarios' (run, index) index through the
    # lookups, and stream as they come: no sort of the whole run before the first byte.
    by_index = f" ORDER BY s.{order[2:]}" if order in ("x.index ASC", "x.index DESC") else ""
    if fmt == "csv":
        outer = ", ".join(
            [
                "x.index",
                "x.status",
                *(
                    f"CASE WHEN {c.error} IS NOT NULL THEN {_csv_error(c.error)} "
                    f"ELSE {_csv_text(c.value)} END"
                    if c.error
                    else _csv_text(c.value)
                    for c in cells
                ),
            ]
        )
        outer_params, options = [], "(FORMAT csv)"
    else:
        errored = [c for c in cells if c.error]
        values = [
            f"CASE WHEN {c.present} THEN %s || coalesce({c.value}::text, 'null') END" for c in cells
        ]
        errors = [
            f"CASE WHEN {c.error} IS NOT NULL THEN %s || {c.error}::text END" for c in errored
        ]
        outer = (
            """'{"index": ' || x.index || ', "status": ' || to_json(x.status)::text"""
            f""" || ', "values": ' || {_object(values)} || ', "errors": ' || {_object(errors)}"""
            " || '}'"
        )
        outer_params = [_key(c.name) for c in cells] + [_key(c.name) for c in errored]
        options = COPY_LINES
    inner = (
        f"SELECT s.index, s.status{''.join(', ' + c for c in q.columns)} "
        f"{found.sql(''.join(q.joins))}{by_index} OFFSET 0"
    )
    sql = f"COPY (SELECT {outer} FROM ({inner}) x ORDER BY {order}) TO STDOUT {options}"  # noqa: S608
    params = [
        *outer_params,
        *q.column_params,
        *found.join_params,
        *q.join_params,
        *found.params,
    ]
    return sql, params


def run_export(run: Run, query: selectors.TableQuery, *, fmt: str) -> StreamingHttpResponse:
    """Refuses (``InvalidInput``) a sort or a range the run page refuses."""
    selectors.table_query_check(run, query)
    sql, params = run_export_sql(run, query, fmt=fmt)
    names = [m["column"]["name"] for m in run.mappings]
    head = _header(["index", "status", *names]) if fmt == "csv" else b""
    chunks = copy_out(sql, params, head=head, crlf=fmt == "csv")
    return stream_response(chunks, fmt=fmt, filename=f"run-{run.pk}-scenarios")


# --- a comparison --------------------------------------------------------------------------------

_NO_ERROR = '{"code": "error", "message": ""}'  # errored, but not in its repeat-0 cell
_METRIC_VALUE = (
    "CASE jsonb_typeof(a.outputs #> %s::text[]) WHEN 'number' THEN (a.outputs #>> %s::text[])::float8"
    " WHEN 'boolean' THEN (a.outputs #>> %s::text[])::boolean::int END"
)


@dataclass
class _Measure:
    """One metric of one run in a comparison row, as inner query columns."""

    raw: str  # the value as SQL over the inner query's joins
    value: str  # float8; NULL without one
    errored: str  # errored and no value
    error: str  # the error to show when errored
    boolean: bool  # shown as true/false (a binary metric without repeats)


def _comparison_measures(
    run: Run, k: int, chosen: list[compare.SharedMetric], q: _Select
) -> list[_Measure]:
    """Each chosen metric's per-scenario value of run ``k`` (joined as ``s{k}``): the mean over
    its repeats of the successful cells, from the read model while it is current, else from
    the results (as the page reads them); errored when a cell errored and there is no value."""
    s, current = f"s{k}", run.read_model_current
    raw: list[tuple[str, str]] = []  # (value, errored) as SQL over the joins
    groups: dict[str, tuple[str, list]] = {}  # step -> (alias, metrics on it)
    for i, metric in enumerate(chosen):
        step, path = metric.steps[run.pk], metric.paths[run.pk]
        if current:
            v = f"v{k}_{i}"
            q.join(
                f" LEFT JOIN runs_scenariovalue {v} ON {v}.run_id = %s AND {v}.step_key = %s"
                f" AND {v}.key = %s AND {v}.index = {s}.index",
                run.pk,
                step,
                ".".join(path),
            )
            raw.append((f"{v}.value", f"({v}.value IS NULL AND {v}.errors > 0)"))
        else:
            g, on_step = groups.setdefault(step, (f"g{k}_{len(groups)}", []))
            on_step.append(path)
            m = f"{g}.m{len(on_step) - 1}"
            raw.append((m, f"({g}.errored AND {m} IS NULL)"))
    for step, (g, paths) in groups.items():
        averages = "".join(f", avg({_METRIC_VALUE}) AS m{j}" for j in range(len(paths)))
        q.join(
            " LEFT JOIN (SELECT r.scenario_id, bool_or(r.status = 'error') AS errored"  # noqa: S608
            f"{averages} FROM runs_result r LEFT JOIN runs_annotation a ON a.id = r.annotation_id"
            f" WHERE r.run_id = %s AND r.step_key = %s GROUP BY r.scenario_id) {g}"
            f" ON {g}.scenario_id = {s}.id",
            *(p for path in paths for p in (path, path, path)),
            run.pk,
            step,
        )
    errors = {}  # step -> its repeat-0 cell's error, looked up only for the rows that errored
    for step in dict.fromkeys(metric.steps[run.pk] for metric in chosen):
        gate = " OR ".join(
            errored for (_, errored), m in zip(raw, chosen, strict=True) if m.steps[run.pk] == step
        )
        errors[step] = q.column(
            f"CASE WHEN {gate} THEN coalesce((SELECT z.error FROM runs_result z"  # noqa: S608
            f" WHERE z.scenario_id = {s}.id AND z.step_key = %s AND z.repeat_idx = 0"
            f" AND {_errored('z')}), %s::jsonb) END",
            step,
            _NO_ERROR,
        )
    return [
        _Measure(
            raw=value,
            value=q.column(value),
            errored=q.column(errored),
            error=errors[metric.steps[run.pk]],
            boolean=not metric.numeric and run.repeats == 1,
        )
        for (value, errored), metric in zip(raw, chosen, strict=True)
    ]


def _comparison_rows(comparison: compare.Comparison, chosen, q: _Select) -> dict:
    """The inner query's columns of a comparison row: inputs, per run its presence, status,
    outputs and measures, per candidate the deltas from the baseline."""
    runs = comparison.runs
    for k, run in enumerate(runs):  # each run's scenarios (with a testcase), side by side
        on = f" ON s{k}.index = {_index(k)}" if k else ""
        q.join(
            f"{' FULL JOIN' if k else ''} (SELECT id, index, status, inputs FROM runs_scenario"  # noqa: S608
            f" WHERE run_id = %s AND testcase_id IS NOT NULL) s{k}{on}",
            run.pk,
        )
    first = f"coalesce({', '.join(f's{k}.inputs' for k in range(len(runs)))})"
    paths = {
        m["column"]["name"]: _inputs_path(m["step"]["path"].split("."))
        for m in comparison.baseline.mappings
        if m["column"]["kind"] == "input"
    }
    inputs = [
        (name, q.column(f"{first} #> %s::text[]", paths[name]) if paths.get(name) else _NONE)
        for name in comparison.input_columns
    ]
    per_run = []
    for k, run in enumerate(runs):
        step = next(
            (m["step"]["key"] for m in run.mappings if m["column"]["kind"] == "outputs"), ""
        )
        outputs = _NONE
        if step:
            o = f"o{k}"
            q.join(
                f" LEFT JOIN runs_result {o} ON {o}.run_id = %s AND {o}.scenario_id = s{k}.id"
                f" AND {o}.step_key = %s AND {o}.repeat_idx = 0",
                run.pk,
                step,
            )
            q.join(_root_joins(o))
            outputs = q.column(
                f"CASE WHEN NOT {_errored(o)} THEN {_root(o)} #> '{{ag,data,outputs}}' END"
            )
        per_run.append(
            {
                "run": run,
                "present": q.column(f"s{k}.id IS NOT NULL"),
                "status": q.column(f"s{k}.status"),
                "outputs": outputs,
                "measures": _comparison_measures(run, k, chosen, q),
            }
        )
    for cell in per_run[1:]:
        cell["deltas"] = [
            q.column(f"round(({c.raw} - {b.raw})::text::numeric, 12)::float8")
            for b, c in zip(per_run[0]["measures"], cell["measures"], strict=True)
        ]
    return {"inputs": inputs, "runs": per_run}


def _shown(m: _Measure) -> str:
    """A value as the page has it: true/false for a binary metric without repeats."""
    return (
        f"CASE WHEN {m.value} <> 0 THEN 'true' ELSE 'false' END" if m.boolean else _number(m.value)
    )


def _comparison_filter(chosen, rows: dict, show: str) -> tuple[str, list]:
    """``show`` as the page applies it (``compare.aligned_indexes``): a candidate's value moved
    against (regressions) or along (improvements) the metric's direction from the baseline's,
    or changed, or one side errored where the other has a value."""
    if show not in compare.FILTERS:
        return "", []
    terms, params = [], []
    for i, metric in enumerate(chosen):
        b = rows["runs"][0]["measures"][i]
        for cell in rows["runs"][1:]:
            c = cell["measures"][i]
            diff = f"(({c.value} - {b.value}) * {1 if metric.higher_is_better else -1})"
            if show == "regressions":
                terms.append(f"{diff} < %s")
                params.append(-compare.TOLERANCE)
            elif show == "improvements":
                terms.append(f"{diff} > %s")
                params.append(compare.TOLERANCE)
            else:
                terms.append(
                    f"(abs({diff}) > %s OR ({b.errored} AND {c.value} IS NOT NULL)"
                    f" OR ({c.errored} AND {b.value} IS NOT NULL))"
                )
                params.append(compare.TOLERANCE)
    return f" WHERE {' OR '.join(terms) or 'false'}", params


def _comparison_csv(rows: dict, chosen) -> str:
    cells = ["x.index", *(_csv_text(value) for _, value in rows["inputs"])]
    cells += [_csv_text(cell["outputs"]) for cell in rows["runs"]]
    for i in range(len(chosen)):
        for cell in rows["runs"]:
            m = cell["measures"][i]
            cells.append(
                f"CASE WHEN {m.value} IS NOT NULL THEN {_shown(m)}"
                f" WHEN {m.errored} THEN {_csv_error(m.error)} END"
            )
        cells += [
            f"CASE WHEN {d} IS NOT NULL THEN {_number(d)} END"
            for d in (cell["deltas"][i] for cell in rows["runs"][1:])
        ]
    return ", ".join(cells)


def _comparison_json(rows: dict, chosen) -> tuple[str, list]:
    """A row as ``compare.aligned_rows`` has it, as JSON text."""
    params = [_key(name) for name, _ in rows["inputs"]]
    inputs = _object([f"%s || coalesce({value}::text, 'null')" for _, value in rows["inputs"]])
    runs = []
    for cell in rows["runs"]:
        names = [_key(metric.name) for metric in chosen]
        values = [
            f"CASE WHEN {m.value} IS NOT NULL THEN %s || {_shown(m)} END" for m in cell["measures"]
        ]
        errors = [f"CASE WHEN {m.errored} THEN %s || {m.error}::text END" for m in cell["measures"]]
        params += names + names
        text = (
            f"""'{{"run": {int(cell["run"].pk)}, "present": ' || {cell["present"]}::text"""
            f""" || ', "values": ' || {_object(values)} || ', "errors": ' || {_object(errors)}"""
            f""" || CASE WHEN {cell["present"]} THEN ', "status": ' || to_json({cell["status"]})::text"""
            f""" || ', "outputs": ' || coalesce({cell["outputs"]}::text, 'null') ELSE '' END"""
        )
        if "deltas" in cell:
            deltas = [
                f"CASE WHEN {d} IS NOT NULL THEN %s || {_number(d)} END" for d in cell["deltas"]
            ]
            params += names
            text += f""" || ', "deltas": ' || {_object(deltas)}"""
        runs.append(text + " || '}'")
    row = (
        f"""'{{"index": ' || x.index || ', "inputs": ' || {inputs} || ', "runs": [' || """
        + " || ', ' || ".join(runs)
        + " || ']}'"
    )
    return row, params


def comparison_export_sql(
    comparison: compare.Comparison, *, fmt: str, metric: str = "", show: str = ""
) -> tuple[str, list]:
    """The ``COPY`` statement of a comparison's export (rows only) and its parameters: one row
    per testcase index any of the runs has (their scenarios joined side by side on it), in
    index order, filtered by ``show``."""
    chosen = comparison.chosen(metric)
    q = _Select()
    rows = _comparison_rows(comparison, chosen, q)
    where, where_params = _comparison_filter(chosen, rows, show)
    if fmt == "csv":
        outer, outer_params, options = _comparison_csv(rows, chosen), [], "(FORMAT csv)"
    else:
        (outer, outer_params), options = _comparison_json(rows, chosen), COPY_LINES
    index = _index(len(comparison.runs))
    inner = (
        f"SELECT {index} AS index{''.join(', ' + c for c in q.columns)}"
        f" FROM{''.join(q.joins)} OFFSET 0"
    )
    sql = f"COPY (SELECT {outer} FROM ({inner}) x{where} ORDER BY x.index) TO STDOUT {options}"  # noqa: S608
    return sql, [*outer_params, *q.column_params, *q.join_params, *where_params]


def _index(runs: int) -> str:
    """The testcase index of a row: of the first of ``runs`` runs that has it."""
    return f"coalesce({', '.join(f's{k}.index' for k in range(runs))})"


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


def comparison_export(
    comparison: compare.Comparison, *, fmt: str, metric: str = "", show: str = ""
) -> StreamingHttpResponse:
    sql, params = comparison_export_sql(comparison, fmt=fmt, metric=metric, show=show)
    chosen = comparison.chosen(metric)
    head = _header(comparison_header(comparison, chosen)) if fmt == "csv" else b""
    ids = "-".join(str(r.pk) for r in comparison.runs)
    return stream_response(
        copy_out(sql, params, head=head, crlf=fmt == "csv"), fmt=fmt, filename=f"compare-runs-{ids}"
    )
