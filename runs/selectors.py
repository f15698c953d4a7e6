"""Reads of runs for pages and APIs: lists, the scenario table through the run's mappings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.db import connection
from django.db.models import JSONField, OuterRef, Q, QuerySet, Subquery

from evalsite.errors import InvalidInput
from evalsite.jsonpaths import dig
from evalsite.models import Project
from runs.models import Result, Run, RunMetrics, Scenario, Trace
from runs.traces import OUTPUTS_PATH, scenario_invocation_trace, trace_dict, trace_roots

OUTPUTS_PREFIX = "attributes.ag.data.outputs"


def run_list(
    *,
    project: Project,
    status: str = "",
    search: str = "",
    tags: dict[str, str] | None = None,
    testset: str = "",
) -> QuerySet[Run]:
    """A project's runs, newest first: by status, text in the name or description, tags (every
    one given must match: ``{"branch": "main"}``) and testset (id or slug)."""
    runs = Run.objects.for_project(project).select_related(
        "testset_version__testset", "application"
    )
    if status:
        runs = runs.filter(status=status)
    if search:
        runs = runs.filter(Q(name__icontains=search) | Q(description__icontains=search))
    if tags:
        runs = runs.filter(tags__contains=tags)
    if testset:
        key = "pk" if str(testset).isdecimal() else "slug"
        runs = runs.filter(**{f"testset_version__testset__{key}": testset})
    return runs


def run_list_recent(*, project: Project, limit: int = 8) -> list[Run]:
    runs = list(run_list(project=project).filter(is_online=False)[:limit])
    headline = {
        m.run_id: m.data
        for m in RunMetrics.objects.filter(run__in=runs, scenario=None, bucket_start=None)
    }
    for run in runs:
        run.headline = headline_metrics(run, headline.get(run.pk, {}))
    return runs


def headline_metrics(run: Run, data: dict) -> list[dict]:
    """One number per evaluator for lists: its success rate, else its mean score, else the
    first number it reports. Errors are counted beside it, never averaged in."""
    by_step: dict[str, list[tuple[str, str, dict]]] = {}
    for mapping in run.mappings:
        if mapping["column"]["kind"] != "annotation":
            continue
        key = mapping["step"]["path"].removeprefix(OUTPUTS_PREFIX + ".")
        stats = data.get(mapping["step"]["key"], {}).get(key)
        if stats:
            evaluator = mapping["column"]["name"].split(".", 1)[0]
            by_step.setdefault(mapping["step"]["key"], []).append((evaluator, key, stats))
    lines = []
    for candidates in by_step.values():
        ranked = sorted(candidates, key=lambda c: {"success": 0, "score": 1}.get(c[1], 2))
        for evaluator, key, stats in ranked:
            if stats["type"] == "binary" and stats.get("rate") is not None:
                lines.append(
                    {
                        "name": evaluator,
                        "key": key,
                        "value": stats["rate"],
                        "format": "percent",
                        "errors": stats["errors"],
                    }
                )
                break
            if stats["type"] in ("continuous", "discrete") and stats.get("mean") is not None:
                lines.append(
                    {
                        "name": evaluator,
                        "key": key,
                        "value": stats["mean"],
                        "format": "number",
                        "errors": stats["errors"],
                    }
                )
                break
    return lines


def run_get(*, project: Project, run_id: int | str, with_metrics: bool = False) -> Run | None:
    """A run of the project; ``with_metrics``: with its run-wide statistics as
    ``run.metrics_data`` (None before the first refresh), read in the same query."""
    if not str(run_id).isdecimal():
        return None
    runs = run_list(project=project).filter(pk=int(run_id))
    if with_metrics:
        run_wide = RunMetrics.objects.filter(run=OuterRef("pk"), scenario=None, bucket_start=None)
        runs = runs.annotate(
            metrics_data=Subquery(run_wide.values("data")[:1], output_field=JSONField())
        )
    return runs.first()


def scenario_rows(run: Run, scenarios: list[Scenario], repeat_idx: int = 0) -> list[dict]:
    """The scenario table: each row's values read through the run's mappings.

    Two queries for any number of rows: the cells with their annotations' outputs and their
    traces' days, then the invocation traces' root outputs. A cell whose evaluation failed
    carries its error, never a value.
    """
    ids = [s.pk for s in scenarios]
    # Tuples, not model instances: a page of 50 rows x 4 steps is 200 cells.
    found = Result.objects.filter(
        run=run, scenario_id__in=ids, repeat_idx__in=(0, repeat_idx)
    ).values_list(
        "scenario_id",
        "step_key",
        "repeat_idx",
        "error",
        "annotation_id",
        "annotation__outputs",
        "trace_id",
        "trace__created_at",
        "trace__root_span_id",
    )
    cells: dict[tuple, tuple] = {}
    for cell in found:  # the asked repeat wins; input cells exist for repeat 0 only
        key = cell[:2]
        if cell[2] == repeat_idx or key not in cells:
            cells[key] = cell
    traces = [
        Trace(pk=trace_id, created_at=created_at, root_span_id=root)
        for *_, trace_id, created_at, root in cells.values()
        if trace_id
    ]
    # Only the roots' outputs leave the database: the mappings' paths point inside them.
    outputs = {pk: root["outputs"] for pk, root in trace_roots(traces, "outputs").items()}
    rows = []
    for scenario in scenarios:
        values, errors = {}, {}
        for mapping in run.mappings:
            name, step_key = mapping["column"]["name"], mapping["step"]["key"]
            path = mapping["step"]["path"].split(".")
            if mapping["column"]["kind"] == "input":
                values[name] = (
                    dig(scenario.inputs, path[1:])
                    if path[0] == "data"
                    else dig({"attributes": {"ag": {"data": {"inputs": scenario.inputs}}}}, path)
                )
                continue
            cell = cells.get((scenario.pk, step_key))
            if cell is None:
                continue
            _, _, _, error, annotation_id, annotation_outputs, trace_id, _, _ = cell
            if error:
                errors[name] = error
            elif annotation_id:
                values[name] = dig(annotation_outputs, path[4:])
            elif trace_id:
                values[name] = dig(outputs.get(trace_id), path[4:])
        rows.append({"scenario": scenario, "values": values, "errors": errors})
    return rows


def scenario_neighbours(run: Run, index: int) -> tuple[int | None, int | None]:
    """The indexes before and after ``index`` in its run: two index probes, one round trip."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT index FROM runs_scenario WHERE run_id = %s AND index < %s "
            "ORDER BY index DESC LIMIT 1), (SELECT index FROM runs_scenario "
            "WHERE run_id = %s AND index > %s ORDER BY index LIMIT 1)",
            [run.pk, index, run.pk, index],
        )
        return cursor.fetchone()


# --- the scenario table: sort, filter, page ------------------------------------------------------

# The metric types the read model (``runs_scenariovalue``) holds: the table sorts and ranges on them.
SORTABLE_TYPES = ("binary", "continuous", "discrete")


@dataclass
class TableQuery:
    """What the scenario table shows: the same object drives the page, its export and the API."""

    sort: str = ""  # a column name from the run's mappings; empty: by index
    desc: bool = False
    errors: bool = False  # only scenarios with an errored cell
    failed: bool = False  # only scenarios an evaluator judged success=false
    column: str = ""  # a metric range on this column ...
    low: float | None = None  # ... from
    high: float | None = None  # ... to
    q: str = ""  # text in the inputs or the outputs
    repeat: int = 0

    @classmethod
    def from_params(cls, params) -> TableQuery:
        def number(name):
            try:
                return float(params.get(name)) if params.get(name) not in (None, "") else None
            except ValueError:
                return None

        sort = params.get("sort", "")
        return cls(
            sort=sort.lstrip("-"),
            desc=sort.startswith("-"),
            errors=params.get("errors") in ("1", "true", "on"),
            failed=params.get("failed") in ("1", "true", "on"),
            column=params.get("column", ""),
            low=number("low"),
            high=number("high"),
            q=params.get("q", "").strip(),
        )

    @property
    def ranged(self) -> bool:
        return bool(self.column) and (self.low is not None or self.high is not None)


def metric_column(run: Run, name: str) -> tuple[str, str] | None:
    """``(step_key, key)`` of a numeric or boolean metric column, where the read model keeps its
    values: ``key`` is the dotted path inside the outputs (``runs.metrics.MetricSpec.key``)."""
    for mapping in run.mappings:
        column = mapping["column"]
        if column["name"] == name and column["kind"] == "annotation":
            if column.get("type") not in SORTABLE_TYPES:
                return None
            return mapping["step"]["key"], mapping["step"]["path"].removeprefix(
                OUTPUTS_PREFIX + "."
            )
    return None


def _input_path(run: Run, name: str) -> list[str] | None:
    for mapping in run.mappings:
        if mapping["column"]["name"] == name and mapping["column"]["kind"] == "input":
            path = mapping["step"]["path"].split(".")
            return path[1:] if path[0] == "data" else path[4:]
    return None


def table_query_check(run: Run, query: TableQuery) -> None:
    """Refuse a sort or a range on a column the run's table cannot sort or range by, and a
    search PostgreSQL cannot hold (a NUL character)."""
    if "\x00" in query.q:
        raise InvalidInput({"q": ["must not contain a NUL character"]})
    if query.sort not in ("", "index") and not (
        metric_column(run, query.sort) or _input_path(run, query.sort) is not None
    ):
        raise InvalidInput({"sort": [f"The run has no sortable column {query.sort!r}."]})
    if query.ranged and not metric_column(run, query.column):
        raise InvalidInput({"column": [f"The run has no numeric metric column {query.column!r}."]})


@dataclass
class ScenarioFilter:
    """The scenarios a table query keeps, as SQL over ``runs_scenario s``: joins and conditions
    with their parameters. The page, its count and the exports select from it."""

    joins: str
    join_params: list
    where: str
    params: list
    narrowed: bool = True  # False: every scenario of the run

    def sql(self, extra_joins: str = "") -> str:
        return f"FROM runs_scenario s {self.joins} {extra_joins} WHERE {self.where}"


def scenario_filter(run: Run, query: TableQuery, *, ranged: bool = True) -> ScenarioFilter:
    """What ``query`` keeps of ``run``'s scenarios (see ``ScenarioFilter``). Metric conditions
    read the read model through its indexes; ``ranged=False`` leaves the metric range to the
    caller (a page sorted by that metric bounds its index scan with it)."""
    where, params, joins, join_params = ["s.run_id = %s"], [run.pk], [], []
    if query.errors:
        where.append("s.status = 'errors'")
    if query.failed:
        # Judged false at least once: a success rate below 1 (errored cells are not in it).
        judged = [m["step"]["key"] for m in run.mappings if _is_success(m)]
        where.append(
            "s.index IN (SELECT fv.index FROM runs_scenariovalue fv WHERE fv.run_id = %s "
            "AND fv.step_key = ANY(%s) AND fv.key = 'success' AND fv.value < 1)"
        )
        params += [run.pk, judged]
    if query.q:
        # The trace's created_at is its spans' day: each probe reads one partition.
        where.append(
            "(s.inputs::text ILIKE %s OR EXISTS (SELECT 1 FROM runs_result qr "
            "JOIN runs_trace qt ON qt.id = qr.trace_id JOIN runs_span qs "
            "ON qs.trace_id = qt.id AND qs.trace_time = qt.created_at AND qs.parent_id = '' "
            "WHERE qr.scenario_id = s.id AND qr.step_key = (SELECT key FROM runs_runstep "
            "WHERE run_id = %s AND type = 'invocation' LIMIT 1) "
            "AND (qs.attributes #>> '{ag,data,outputs}') ILIKE %s))"
        )
        escaped = query.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = f"%{escaped}%"
        params += [like, run.pk, like]
    metric = metric_column(run, query.column) if ranged and query.ranged else None
    if metric:
        joins.append(
            "JOIN runs_scenariovalue flt_ ON flt_.run_id = %s AND flt_.step_key = %s "
            "AND flt_.key = %s AND flt_.index = s.index"
        )
        join_params += [run.pk, *metric]
        condition, condition_params = _range("flt_.value", query)
        where.append(condition)
        params += condition_params
    narrowed = len(where) > 1 or bool(joins)
    return ScenarioFilter(" ".join(joins), join_params, " AND ".join(where), params, narrowed)


def _is_success(mapping: dict) -> bool:
    return (
        mapping["column"]["kind"] == "annotation"
        and mapping["step"]["path"] == f"{OUTPUTS_PREFIX}.success"
    )


def _range(column: str, query: TableQuery) -> tuple[str, list]:
    bounds = [(">=", query.low), ("<=", query.high)]
    kept = [(op, bound) for op, bound in bounds if bound is not None]
    return " AND ".join(f"{column} {op} %s" for op, _ in kept), [bound for _, bound in kept]


@dataclass(frozen=True)
class Cursor:
    """A place in a sorted, filtered table: the row at ``rank`` (0-based) whose sort key is
    ``(segment, value, index)``; ``before`` reads the page before that row, else the one after.

    Sorted by a metric, the table runs in three segments: 0 the scenarios with a value, 1 those
    whose cells give none (errored, or not a number), 2 those the read model has no row for
    (not evaluated yet). ``tail`` is the rank where segment 2 starts, once a page has met it."""

    rank: int
    index: int
    segment: int = 0
    value: float | None = None
    before: bool = False
    tail: int | None = None

    def encode(self) -> str:
        value = "" if self.value is None else repr(self.value)
        tail = "" if self.tail is None else str(self.tail)
        return (
            f"{'b' if self.before else 'a'}{self.segment}~{self.rank}~{self.index}~{value}~{tail}"
        )

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            head, rank, index, value, tail = text.split("~")
            cursor = cls(
                rank=int(rank),
                index=int(index),
                segment=int(head[1:]),
                value=float(value) if value else None,
                before=head[:1] == "b",
                tail=int(tail) if tail else None,
            )
        except ValueError:
            cursor = None
        if (
            cursor is None
            or head[:1] not in ("a", "b")
            or not all(0 <= n < 2**31 for n in (cursor.rank, cursor.index, cursor.tail or 0))
            or not math.isfinite(cursor.value or 0.0)
        ):
            raise InvalidInput({"cursor": ["Not a cursor of this table: follow its links."]})
        return cursor

    @property
    def key(self) -> tuple:
        return (self.index,) if self.value is None else (self.value, self.index)


# (segment, value, scenario): a row of the table, and its place in the table's order.
_Row = tuple[int, float | None, Scenario]


@dataclass
class _Segment:
    """A stretch of the table's order, read through one index: by keyset from a row's key,
    or by offset (``order``: a sort no index serves)."""

    number: int
    run_id: int
    source: str  # FROM ... WHERE ...
    params: list
    key: tuple[str, ...]  # the columns it is ordered by, ending with the scenario's index
    ascending: bool  # in the table's order
    value: str = "NULL"  # the sorted metric's value
    leading: str = ""  # a column the index orders by first, constant over the segment
    bounded: bool = False  # no index stops its scan: read no more rows than the total leaves
    order: str = ""  # an order no index serves (read by offset only), with its parameters
    order_params: list = field(default_factory=list)

    @property
    def keyset(self) -> bool:
        return not self.order

    def read(self, key: tuple | None, *, backward: bool, limit: int, offset: int = 0) -> list[_Row]:
        """The rows after (``backward``: before) ``key``, nearest first, with their scenarios:
        one query, which reads the keys from the index first (so an offset skips index
        entries only), then the page's scenarios by index."""
        if not self.keyset:
            found = Scenario.objects.raw(
                f"SELECT NULL AS sort_value, s.* {self.source} ORDER BY {self.order} "
                "LIMIT %s OFFSET %s",
                [*self.params, *self.order_params, limit, offset],
            )
            return [(self.number, None, scenario) for scenario in found]
        up = self.ascending != backward
        after, params = "", list(self.params)
        if key is not None:
            columns, marks = ", ".join(self.key), ", ".join(["%s"] * len(key))
            after = f" AND ({columns}) {'>' if up else '<'} ({marks})"
            params += key
        order = ", ".join(f"{c}{'' if up else ' DESC'}" for c in (self.leading, *self.key) if c)
        keys = (
            f"SELECT {self.value} AS sort_value, {self.key[-1]} AS sort_index {self.source}"
            f"{after} ORDER BY {order} LIMIT %s OFFSET %s"
        )
        found = Scenario.objects.raw(
            f"SELECT k.sort_value, s.* FROM ({keys}) k "
            "JOIN runs_scenario s ON s.run_id = %s AND s.index = k.sort_index",
            [*params, limit, offset, self.run_id],
        )
        # Back in the keys' order (the join keeps no order): 51 rows, by the same key.
        rows = sorted(found, key=lambda row: (row.sort_value, row.index)[-len(self.key) :])
        return [(self.number, row.sort_value, row) for row in (rows if up else rows[::-1])]

    def count(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) {self.source}", self.params)
            return cursor.fetchone()[0]


class _Table:
    """The table of one query over one run: its order as segments, its total, its rows."""

    def __init__(self, run: Run, query: TableQuery):
        self.run, self.query = run, query
        self.segments = self._segments()
        self._total: int | None = None

    @property
    def total(self) -> int:
        """The run's own count when the query keeps every scenario, else an exact count (the
        filters read indexes: errors by status, metrics in the read model)."""
        if self._total is None:
            found = scenario_filter(self.run, self.query)
            if found.narrowed:
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"SELECT count(*) {found.sql()}", [*found.join_params, *found.params]
                    )
                    self._total = cursor.fetchone()[0]
            else:
                self._total = self.run.scenario_count
        return self._total

    def _segments(self) -> list[_Segment]:
        run, query = self.run, self.query
        metric = metric_column(run, query.sort) if query.sort else None
        if metric is None:
            found = scenario_filter(run, query)
            params = [*found.join_params, *found.params]
            path = _input_path(run, query.sort) if query.sort else None
            if path is None:
                return [_Segment(0, run.pk, found.sql(), params, ("s.index",), not query.desc)]
            # No index orders inputs: a full sort, paged by offset.
            order = f"(s.inputs #>> %s) {'DESC' if query.desc else 'ASC'} NULLS LAST, s.index"
            return [
                _Segment(
                    0,
                    run.pk,
                    found.sql(),
                    params,
                    ("s.index",),
                    True,
                    order=order,
                    order_params=[path],
                )
            ]
        # A range on the sorted metric bounds the index scan itself.
        on_sorted = query.ranged and query.column == query.sort
        found = scenario_filter(run, query, ranged=not on_sorted)
        source, params = "FROM runs_scenariovalue v", []
        if found.narrowed:  # the filters read the scenario
            source += (
                f" JOIN runs_scenario s ON s.run_id = v.run_id AND s.index = v.index {found.joins}"
            )
            params += found.join_params
        source += " WHERE v.run_id = %s AND v.step_key = %s AND v.key = %s"
        params += [run.pk, *metric]
        if found.narrowed:
            source += f" AND {found.where}"
            params += found.params
        valued, valued_params = f"{source} AND v.value IS NOT NULL", list(params)
        if on_sorted:
            condition, condition_params = _range("v.value", query)
            valued, valued_params = f"{valued} AND {condition}", valued_params + condition_params
        segments = [
            _Segment(
                0, run.pk, valued, valued_params, ("v.value", "v.index"), not query.desc, "v.value"
            )
        ]
        if on_sorted:
            return segments  # a scenario without a value is in no range
        unvalued = f"{source} AND v.value IS NULL"
        unread = (
            f"{found.sql()} AND NOT EXISTS (SELECT 1 FROM runs_scenariovalue m "
            "WHERE m.run_id = %s AND m.step_key = %s AND m.key = %s AND m.index = s.index)"
        )
        unread_params = [*found.join_params, *found.params, run.pk, *metric]
        return [
            *segments,
            _Segment(1, run.pk, unvalued, params, ("v.index",), True, leading="v.value"),
            _Segment(2, run.pk, unread, unread_params, ("s.index",), True, bounded=True),
        ]

    def segment(self, cursor: Cursor) -> int:
        """Where ``cursor`` sits among the segments (a 400 when it is not of this table)."""
        for position, segment in enumerate(self.segments):
            if segment.number == cursor.segment and len(segment.key) == len(cursor.key):
                return position
        raise InvalidInput({"cursor": ["Not a cursor of this table: follow its links."]})

    def at(self, offset: int, limit: int) -> list[_Row]:
        """``limit`` rows from ``offset``: what old ``?page=N`` links and offset sorts read."""
        rows: list[_Row] = []
        skip = offset
        for segment in self.segments:
            want = self._want(segment, limit - len(rows), offset + len(rows))
            if want <= 0:
                break
            found = segment.read(None, backward=False, limit=want, offset=skip)
            if not found and skip:
                skip = max(skip - segment.count(), 0)  # the offset reaches past this segment
            elif found:
                skip = 0
            rows += found
            if len(rows) >= limit:
                break
        return rows

    def after(self, cursor: Cursor, limit: int) -> list[_Row]:
        if not self.segments[0].keyset:
            return self.at(cursor.rank + 1, limit)
        rows: list[_Row] = []
        start = self.segment(cursor)
        for segment in self.segments[start:]:
            key = cursor.key if segment.number == cursor.segment else None
            want = self._want(segment, limit - len(rows), cursor.rank + 1 + len(rows))
            if want > 0:
                rows += segment.read(key, backward=False, limit=want)
            if len(rows) >= limit:
                break
        return rows

    def before(self, cursor: Cursor, limit: int) -> list[_Row]:
        """Up to ``limit`` rows before the cursor's, in table order."""
        if not self.segments[0].keyset:
            first = max(cursor.rank - limit, 0)
            return self.at(first, cursor.rank - first)
        rows: list[_Row] = []
        start = self.segment(cursor)
        for segment in reversed(self.segments[: start + 1]):
            key = cursor.key if segment.number == cursor.segment else None
            want = limit - len(rows)
            if segment.bounded and cursor.tail is not None:
                want = min(want, cursor.rank - cursor.tail)  # its rows before the cursor
            if want > 0:
                rows += segment.read(key, backward=True, limit=want)
            if len(rows) >= limit:
                break
        return rows[::-1]

    def _want(self, segment: _Segment, want: int, rank: int) -> int:
        """How many rows to ask ``segment`` for, the next one being at ``rank``."""
        return min(want, self.total - rank) if segment.bounded else want


@dataclass
class TablePage:
    """One page of the scenario table: its scenarios in table order, where it sits (``rank``
    of its first row among ``total``) and the cursors of the pages either side."""

    scenarios: list[Scenario]
    total: int
    rank: int
    limit: int
    next: Cursor | None
    previous: Cursor | None

    @property
    def number(self) -> int:
        return self.rank // self.limit + 1

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.limit))


def table_page(
    run: Run, query: TableQuery, *, cursor: Cursor | None = None, offset: int = 0, limit: int = 50
) -> TablePage:
    """The page after (or before) ``cursor``, else the one from row ``offset`` (what page
    numbers of older links give; its cost grows with the offset), of the sorted and filtered
    table. Sorted by index or by a metric, a page reads its own rows only, by keyset
    through an index (the read model's ``scenariovalue_sort`` for a metric), whatever the run's
    size; a sort by an input column has no index (a full sort, paged by offset)."""
    table_query_check(run, query)
    table = _Table(run, query)
    if cursor is None:
        first = offset
        rows = table.at(first, limit + 1)
        more_before, more_after = first > 0, len(rows) > limit
        rows = rows[:limit]
    elif cursor.before:
        rows = table.before(cursor, limit + 1)
        more_before, more_after = len(rows) > limit, True
        rows = rows[-limit:]
        first = max(cursor.rank - len(rows), 1) if more_before else 0
    else:
        rows = table.after(cursor, limit + 1)
        first, more_before, more_after = cursor.rank + 1, True, len(rows) > limit
        rows = rows[:limit]
    tail = _tail(rows, first, cursor)
    next_cursor = previous = None
    if rows and more_after:
        segment, value, scenario = rows[-1]
        next_cursor = Cursor(first + len(rows) - 1, scenario.index, segment, value, False, tail)
    if rows and more_before:
        segment, value, scenario = rows[0]
        previous = Cursor(first, scenario.index, segment, value, True, tail)
    scenarios = [scenario for _, _, scenario in rows]
    return TablePage(scenarios, table.total, first, limit, next_cursor, previous)


def _tail(rows: list[_Row], first: int, cursor: Cursor | None) -> int | None:
    """The rank where segment 2 starts, when the cursor knows it or these rows show it."""
    if cursor is not None and cursor.tail is not None:
        return cursor.tail
    # The segment of the row before the first one, when known (-1: the table's start).
    previous = -1 if first == 0 else cursor.segment if cursor and not cursor.before else None
    for position, (segment, _, _) in enumerate(rows):
        if segment == 2 and previous is not None and previous < 2:
            return first + position
        previous = segment
    return None


def scenario_case(request, project) -> dict | None:
    """``?run=<id>&scenario=<index>``: that scenario's inputs, outputs and trace, for the
    evaluator playground (within the request's project only)."""
    run_id, index = request.GET.get("run", ""), request.GET.get("scenario", "")
    if not (run_id.isdecimal() and index.isdecimal()):
        return None
    run = run_get(project=project, run_id=run_id)
    scenario = run.scenarios.filter(index=int(index)).first() if run else None
    if scenario is None:
        return None
    invocation = scenario_invocation_trace(scenario)
    trace = trace_dict(invocation) if invocation else None
    outputs = dig(next(iter(trace["spans"].values()), {}) if trace else {}, OUTPUTS_PATH)
    return {"inputs": scenario.inputs, "outputs": outputs, "trace": trace}
