"""Reads of runs for pages and APIs: lists, the scenario table through the run's mappings."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import Q, QuerySet

from evalsite.jsonpaths import dig
from evalsite.models import Project
from runs.models import Annotation, Result, Run, RunMetrics, Scenario, Trace
from runs.traces import OUTPUTS_PATH, scenario_invocation_trace, trace_dict, trace_spans

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


def run_get(*, project: Project, run_id: int | str) -> Run | None:
    if not str(run_id).isdecimal():
        return None
    return run_list(project=project).filter(pk=int(run_id)).first()


def scenario_rows(run: Run, scenarios: list[Scenario], repeat_idx: int = 0) -> list[dict]:
    """The scenario table: each row's values read through the run's mappings.

    Three queries for any number of rows: results, the invocation traces' root spans, and the
    annotations. A cell whose evaluation failed carries its error, never a value.
    """
    ids = [s.pk for s in scenarios]
    results = Result.objects.filter(
        run=run, scenario_id__in=ids, repeat_idx__in=(0, repeat_idx)
    ).only(
        "scenario_id",
        "step_key",
        "repeat_idx",
        "status",
        "trace_id",
        "annotation_id",
        "error",
        "duration_ms",
    )
    cells: dict[tuple, Result] = {}
    for result in results:  # the asked repeat wins; input cells exist for repeat 0 only
        key = (result.scenario_id, result.step_key)
        if result.repeat_idx == repeat_idx or key not in cells:
            cells[key] = result
    trace_ids = [r.trace_id for r in cells.values() if r.trace_id]
    traces = Trace.objects.filter(pk__in=trace_ids).only("created_at")  # their spans' days
    roots = {
        s.trace_id: s.attributes
        for s in trace_spans(traces).filter(parent_id="").only("trace_id", "attributes")
    }
    annotation_ids = [r.annotation_id for r in cells.values() if r.annotation_id]
    outputs = dict(Annotation.objects.filter(pk__in=annotation_ids).values_list("pk", "outputs"))
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
            result = cells.get((scenario.pk, step_key))
            if result is None:
                continue
            if result.error:
                errors[name] = result.error
            elif result.annotation_id:
                values[name] = dig(outputs.get(result.annotation_id), path[4:])
            elif result.trace_id:
                values[name] = dig({"attributes": roots.get(result.trace_id, {})}, path)
        rows.append({"scenario": scenario, "values": values, "errors": errors})
    return rows


# --- the scenario table: sort, filter, page ------------------------------------------------------


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


def _value_expr(run: Run, name: str, alias: str) -> tuple[str, list, str, list]:
    """SQL for a column's value of scenario ``s``: (expression, its params, join, join params)."""
    mapping = next((m for m in run.mappings if m["column"]["name"] == name), None)
    if mapping is None:
        return "s.index", [], "", []
    path = mapping["step"]["path"].split(".")
    if mapping["column"]["kind"] == "input":
        inner = path[1:] if path[0] == "data" else path[4:]
        return "(s.inputs #>> %s)", [inner], "", []
    if mapping["column"]["kind"] == "annotation":
        # Sort and filter on the per-scenario statistics (one row per scenario, kept fresh as
        # results land), each value extracted once: a fraction of the cost of joining results
        # to annotations on 100,000 rows.
        key = [mapping["step"]["key"], *path[4:]]
        join = (
            f"LEFT JOIN (SELECT scenario_id, data #> %s AS v FROM runs_runmetrics "
            f"WHERE run_id = %s AND scenario_id IS NOT NULL) {alias} ON {alias}.scenario_id = s.id"
        )
        expr = (
            f"(CASE jsonb_typeof({alias}.v) WHEN 'number' THEN {alias}.v::float8 "
            f"WHEN 'boolean' THEN {alias}.v::boolean::int END)"
        )
        return expr, [], join, [key, run.pk]
    return "s.index", [], "", []


@dataclass
class ScenarioFilter:
    """The scenarios a table query keeps, as SQL over ``runs_scenario s``: joins and conditions
    with their parameters. The page, its count and the exports select from it."""

    joins: str
    join_params: list
    where: str
    params: list

    def sql(self, extra_joins: str = "") -> str:
        return f"FROM runs_scenario s {self.joins} {extra_joins} WHERE {self.where}"


def scenario_filter(run: Run, query: TableQuery) -> ScenarioFilter:
    """What ``query`` keeps of ``run``'s scenarios (see ``ScenarioFilter``)."""
    where, params, joins, join_params = ["s.run_id = %s"], [run.pk], [], []
    if query.errors:
        where.append("s.status = 'errors'")
    if query.failed:
        where.append(
            "EXISTS (SELECT 1 FROM runs_result fr JOIN runs_annotation fa ON fa.id = fr.annotation_id "
            "WHERE fr.scenario_id = s.id AND fa.outputs @> '{\"success\": false}')"
        )
    if query.q:
        invocation = next((st.key for st in run.steps.all() if st.type == "invocation"), "")
        # The trace's created_at is its spans' day: each probe reads one partition.
        where.append(
            "(s.inputs::text ILIKE %s OR EXISTS (SELECT 1 FROM runs_result qr "
            "JOIN runs_trace qt ON qt.id = qr.trace_id JOIN runs_span qs "
            "ON qs.trace_id = qt.id AND qs.trace_time = qt.created_at AND qs.parent_id = '' "
            "WHERE qr.scenario_id = s.id AND qr.step_key = %s "
            "AND (qs.attributes #>> '{ag,data,outputs}') ILIKE %s))"
        )
        escaped = query.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = f"%{escaped}%"
        params += [like, invocation, like]
    if query.column and (query.low is not None or query.high is not None):
        expr, expr_params, join, jparams = _value_expr(run, query.column, "flt_")
        if join:
            joins.append(join)
            join_params += jparams
        if query.low is not None:
            where.append(f"{expr} >= %s")
            params += [*expr_params, query.low]
        if query.high is not None:
            where.append(f"{expr} <= %s")
            params += [*expr_params, query.high]
    return ScenarioFilter(" ".join(joins), join_params, " AND ".join(where), params)


def scenario_page(
    run: Run, query: TableQuery, *, offset: int = 0, limit: int = 50
) -> tuple[list[Scenario], int]:
    """One page of scenarios, sorted and filtered in SQL (100,000 rows stay in the database)."""
    found = scenario_filter(run, query)
    order, order_params, sort_join, sort_params = "s.index", [], "", []
    if query.sort and query.sort != "index":
        expr, order_params, sort_join, sort_params = _value_expr(run, query.sort, "srt_")
        order = f"{expr} {'DESC' if query.desc else 'ASC'} NULLS LAST, s.index"
    elif query.desc:
        order = "s.index DESC"
    with connection.cursor() as cursor:
        # Counting needs no sort join; the page query joins once for the sort key.
        cursor.execute(f"SELECT count(*) {found.sql()}", [*found.join_params, *found.params])
        total = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT s.id {found.sql(sort_join)} ORDER BY {order} LIMIT %s OFFSET %s",
            [*found.join_params, *sort_params, *found.params, *order_params, limit, offset],
        )
        ids = [row[0] for row in cursor.fetchall()]
    by_id = Scenario.objects.in_bulk(ids)
    return [by_id[i] for i in ids], total


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
