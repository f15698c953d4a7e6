"""Comparing runs (cards with paired tests, scenario rows aligned by testcase) and the CSV /
JSONL exports of a run's scenario table and of a comparison."""

from __future__ import annotations

import json

from django.core.exceptions import BadRequest
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render
from django.urls import path

from evalsite.errors import InvalidInput
from evalsite.views import project_view
from runs import compare, exports, review, selectors
from runs.views.reliability import corrected_for

PAGE_SIZE = 50
INPUTS_SHOWN = 2
MINUS = "\u2212"


def _page_number(params) -> int:
    value = params.get("page", "1")
    return max(int(value), 1) if value.isdecimal() else 1


@project_view()
def run_compare(request, project):
    params = request.GET
    selected = compare.run_ids_parse(params.getlist("runs"))
    context = {
        "project": project,
        "selected": selected,
        "baseline_id": params.get("baseline") or (selected[0] if selected else ""),
        "errors": [],
    }
    if not selected:
        return _page(request, context)
    try:
        comparison = compare.comparison_get(
            project=project, run_ids=selected, baseline=params.get("baseline")
        )
    except InvalidInput as exc:  # shown above the picker; an unknown run is still a 404
        context["errors"] = [reason for reasons in exc.fields.values() for reason in reasons]
        return _page(request, context, status=exc.status)
    metric, show = params.get("metric", ""), params.get("filter", "")
    fragment = request.htmx and request.htmx.target == "compare-rows"
    number = _page_number(params)
    report = compare.comparison_report(
        comparison,
        metric=metric,
        show=show,
        offset=(number - 1) * PAGE_SIZE,
        limit=PAGE_SIZE,
        stats=not fragment,
    )
    page = Paginator(range(report["total"]), PAGE_SIZE).get_page(report["offset"] // PAGE_SIZE + 1)
    binary = any(stats["type"] == "binary" for stats in report["stats"])
    rates = {run.pk: review.corrected_rates(run) for run in comparison.runs} if binary else {}
    context |= {
        "comparison": comparison,
        "baseline_id": str(comparison.baseline.pk),
        "metric": metric if comparison.metric(metric) else "",
        "show": show if show in compare.FILTERS else "",
        "filters": compare.FILTERS,
        "cards": [_card(comparison, stats, rates) for stats in report["stats"]],
        "header": _header(comparison, report["metrics"]),
        "rows": [_display_row(comparison, row, report["metrics"]) for row in report["rows"]],
        "total": report["total"],
        "page": page,
        "query": params.urlencode(),
        "page_links": _page_links(params, page),
    }
    if fragment:
        return render(request, "runs/compare.html#compare-rows", context)
    return _page(request, context)


def _page(request, context: dict, status: int = 200):
    """The whole page: with the picker, whose runs the rows fragment does not need."""
    context["choices"] = compare.comparable_runs(
        project=context["project"], include=context["selected"]
    )
    return render(request, "runs/compare.html", context, status=status)


@project_view()
def run_compare_export(request, project):
    comparison = _comparison_to_export(project, request.GET)
    return exports.comparison_export(
        comparison,
        fmt=_format(request.GET),
        metric=request.GET.get("metric", ""),
        show=request.GET.get("filter", ""),
    )


@project_view()
def run_export(request, project, run_id):
    run = selectors.run_get(project=project, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    query = selectors.TableQuery.from_params(request.GET)
    try:
        return exports.run_export(run, query, fmt=_format(request.GET))
    except InvalidInput as exc:  # a sort or a range the run page refuses too
        raise BadRequest(str(exc))


def _comparison_to_export(project, params) -> compare.Comparison:
    try:
        return compare.comparison_get(
            project=project,
            run_ids=compare.run_ids_parse(params.getlist("runs")),
            baseline=params.get("baseline"),
        )
    except InvalidInput as exc:
        raise (Http404 if exc.status == 404 else BadRequest)(str(exc))


def _format(params) -> str:
    fmt = params.get("format", "csv")
    if fmt not in exports.FORMATS:
        raise BadRequest("Export formats: csv, jsonl.")
    return fmt


# --- display ----------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _signed(value: float, *, percent: bool = False) -> str:
    text = f"{abs(value) * 100:.1f} pp" if percent else _number(abs(value))
    return ("+" if value > 0 else MINUS if value < 0 else "±") + text


def _delta_class(value: float | None, higher_is_better: bool) -> str:
    if value is None or abs(value) <= compare.TOLERANCE:
        return "delta-flat"
    return "delta-up" if (value > 0) == higher_is_better else "delta-down"


def _run_label(run) -> str:
    return f"#{run.pk} {run.name}"


def _card(comparison: compare.Comparison, stats: dict, rates: dict) -> dict:
    binary = stats["type"] == "binary"
    metric = comparison.metric(stats["metric"])
    base_value = stats["runs"][0]["value"]
    tests = {t["run"]: t for t in stats["tests"]}
    lines = []
    for run, summary in zip(comparison.runs, stats["runs"], strict=True):
        value = summary["value"]
        delta = (
            None
            if run.pk == comparison.baseline.pk or None in (value, base_value)
            else value - base_value
        )
        test = tests.get(run.pk)
        lines.append(
            {
                "run": run,
                "label": _run_label(run),
                "value": (
                    f"{value * 100:.1f}%" if binary and value is not None else _number(value)
                ),
                "count": summary["count"],
                "errors": summary["errors"],
                "delta": _signed(delta, percent=binary) if delta is not None else "",
                "delta_class": _delta_class(delta, stats["higher_is_better"]),
                "test": test and _test_display(test, binary),
                "corrected": corrected_for(rates.get(run.pk, {}), metric.steps[run.pk], metric.key)
                if binary
                else [],
            }
        )
    chart = {
        "type": "bar",
        "labels": [f"#{r.pk}" for r in comparison.runs],
        "data": [s["value"] for s in stats["runs"]],
        "format": "percent" if binary else "number",
    }
    return {
        "stats": stats,
        "lines": lines,
        "chart": json.dumps(chart),
        "corrected": any(line["corrected"] for line in lines),
    }


def _p_text(p: float | None) -> str:
    """ "= 0.0123"; a p-value too small for a double (a large run's clear difference underflows
    to 0.0) reads "< 1e-300", never "= 0"."""
    if p is None:
        return "= —"
    return "< 1e-300" if p < 1e-300 else f"= {p:.3g}"


def _test_display(test: dict, binary: bool) -> dict:
    ci = test["ci"]
    percent = binary and test["test"] == "mcnemar"
    return {
        "verdict": test["verdict"],
        "badge": {"better": "success", "worse": "failure"}.get(test["verdict"], "neutral"),
        "difference": _signed(test["difference"], percent=percent)
        if test["difference"] is not None
        else "—",
        "ci": f"[{_signed(ci[0], percent=percent)}, {_signed(ci[1], percent=percent)}]"
        if ci
        else "",
        "p_value": _p_text(test["p_value"]),
        "n": test["n"],
        "excluded": test["excluded"],
        "name": test["test"],
        "method": test["method"],
    }


def _header(comparison: compare.Comparison, metrics: list) -> dict:
    return {
        "inputs": comparison.input_columns[:INPUTS_SHOWN],
        "metrics": metrics,
        "runs": [{"run": r, "label": _run_label(r)} for r in comparison.runs],
    }


def _display_row(comparison: compare.Comparison, row: dict, metrics: list) -> dict:
    cells = row["runs"]
    inputs = [row["inputs"].get(c) for c in comparison.input_columns[:INPUTS_SHOWN]]
    display = {
        "index": row["index"],
        "inputs": [_text(v) for v in inputs],
        "outputs": [
            {"text": _text(c.get("outputs")), "present": c["present"], "status": c.get("status")}
            for c in cells
        ],
        "metrics": [],
    }
    for metric in metrics:
        line = []
        for cell in cells:
            value = cell["values"].get(metric.name)
            delta = cell.get("deltas", {}).get(metric.name)
            kind = _delta_class(delta, metric.higher_is_better)
            line.append(
                {
                    "present": cell["present"],
                    "error": cell["errors"].get(metric.name),
                    "value": value,
                    "text": _number(value) if isinstance(value, float) else "",
                    "delta": _signed(delta) if delta is not None and kind != "delta-flat" else "",
                    "delta_class": kind,
                    "cell_class": {"delta-up": "cell-up", "delta-down": "cell-down"}.get(kind, ""),
                }
            )
        display["metrics"].append({"metric": metric, "cells": line})
    return display


def _text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _page_links(params, page) -> dict:
    def link(n):
        query = params.copy()
        query["page"] = n
        return query.urlencode()

    return {
        "previous": link(page.previous_page_number()) if page.has_previous() else "",
        "next": link(page.next_page_number()) if page.has_next() else "",
    }


urlpatterns = [
    path("runs/compare", run_compare, name="run-compare"),
    path("runs/compare/export", run_compare_export, name="run-compare-export"),
    path("runs/<int:run_id>/export", run_export, name="run-export"),
]
