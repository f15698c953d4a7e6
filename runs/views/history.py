"""The test-case history page of a testset: a grid of test cases x runs, one coloured cell per
verdict, filtered by class (docs/history.md).

The grid's cells are built here as one HTML string per row (a few thousand cells would cost
far more as template nodes); everything in them is either a fixed word or escaped.
"""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render
from django.urls import path, reverse
from django.utils.html import escape
from django.utils.safestring import mark_safe

from evalsite.errors import InvalidInput
from evalsite.views import project_view
from runs import history, testsets

PAGE_SIZE = 200
CLASS_LABELS = {
    "regressed": "regressed",
    "flaky": "flaky",
    "fixed": "fixed",
    "stable_fail": "stable fail",
    "stable_pass": "stable pass",
    "unknown": "unknown",
}
CLASS_BADGES = {
    "regressed": "badge-failure",
    "flaky": "badge-warning",
    "fixed": "badge-success",
    "stable_fail": "badge-neutral",
    "stable_pass": "badge-neutral",
    "unknown": "badge-pending",
}
_INDEX = "987654321"  # stands for the testcase index in a reversed drill-in URL


@project_view()
def testset_history(request, project, ref):
    testset = testsets.testset_get(project=project, ref=ref)
    if testset is None:
        raise Http404("No such testset.")
    params = request.GET
    page = _page_number(params)
    context = {
        "project": project,
        "testset": testset,
        "form": _form_values(params),
        "classes": [(c, CLASS_LABELS[c]) for c in history.CLASSES],
        "errors": [],
    }
    try:
        query = history.HistoryQuery.from_params(_query_params(params), testset=testset)
        found = history.testcase_history(
            testset=testset, **query.arguments(offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
        )
    except InvalidInput as exc:  # shown above the form, which keeps what was typed
        context["errors"] = [
            f"{name}: {reason}" for name, reasons in exc.fields.items() for reason in reasons
        ]
        return render(request, "runs/testsets/history.html", context, status=400)
    context |= _grid(project, found, params, page, query.classes)
    if request.htmx and request.htmx.target == "history-grid":
        return render(request, "runs/testsets/history.html#history-grid", context)
    return render(request, "runs/testsets/history.html", context)


def _page_number(params) -> int:
    value = params.get("page", "1")
    return max(int(value), 1) if value.isdecimal() else 1


def _query_params(params):
    """The page's form writes tags in one box (``branch:main, pr:12``); the service takes a
    list of ``name:value``. Paging is the page's own (``page``), never offset/limit."""
    query = params.copy()
    query.setlist(
        "tag", [t.strip() for text in params.getlist("tag") for t in text.split(",") if t.strip()]
    )
    for name in ("offset", "limit"):
        query.pop(name, None)
    return query


def _form_values(params) -> dict:
    return {
        "runs": params.get("runs", ""),
        "tag": ", ".join(t for t in params.getlist("tag") if t),
        "evaluator": params.get("evaluator", ""),
        "baseline": params.get("baseline", ""),
        "candidate": params.get("candidate", ""),
    }


def _link(params, **changes) -> str:
    query = params.copy()
    for name, value in changes.items():
        query.pop(name, None)
        if value:
            query.setlist(name, value if isinstance(value, list) else [value])
    return f"?{query.urlencode()}" if query else "?"


def _grid(project, found: history.History, params, page: int, classes: list[str]) -> dict:
    runs = [_run_header(run, found) for run in found.runs]
    prefixes = [_drill_prefix(project, run) for run in found.runs]
    labels = [f"run #{r['run'].pk} ({r['date']})" for r in runs]
    rows = [
        {
            "case": case,
            "label": CLASS_LABELS[case.klass],
            "badge": CLASS_BADGES[case.klass],
            "rate": f"{case.flip_rate:.0%}" if case.flip_rate is not None else "—",
            "cells": _cells(case, prefixes, labels),
        }
        for case in found.cases
    ]
    pages = max(1, -(-found.count // PAGE_SIZE))
    return {
        "history": found,
        "runs": runs,
        "rows": rows,
        "class_links": _class_links(found, params, classes),
        "page": page,
        "pages": pages,
        "previous": _link(params, page=str(page - 1)) if page > 1 else "",
        "next": _link(params, page=str(page + 1)) if page < pages else "",
        "first_row": (page - 1) * PAGE_SIZE + 1,
        "last_row": (page - 1) * PAGE_SIZE + len(rows),
        "evaluator_choices": found.available,
        "api_url": _api_url(project, found.testset, params),
    }


def _run_header(run, found: history.History) -> dict:
    tags = "".join(f" · {k}: {v}" for k, v in run.tags.items())
    return {
        "run": run,
        "date": f"{run.created_at:%m-%d}",
        "branch": run.tags.get("branch", ""),
        "title": f"#{run.pk} {run.name} · {run.created_at:%Y-%m-%d %H:%M}{tags}"
        f" · testset v{run.testset_version.version}",
        "baseline": found.baseline is not None and run.pk == found.baseline.pk,
        "candidate": found.candidate is not None and run.pk == found.candidate.pk,
    }


def _drill_prefix(project, run) -> str:
    """The run's drill-in URL up to the testcase index, reversed once per run, not per cell."""
    url = reverse("scenario-detail", args=[project.slug, run.pk, int(_INDEX)])
    return escape(url.removesuffix(f"{_INDEX}/"))


def _class_links(found: history.History, params, classes: list[str]) -> list[dict]:
    links = [
        {
            "label": "All",
            "count": sum(found.counts.values()),
            "url": _link(params, **{"class": None, "page": None}),
            "active": not classes,
        }
    ]
    for name in history.CLASSES:
        links.append(
            {
                "label": CLASS_LABELS[name],
                "count": found.counts[name],
                "url": _link(params, **{"class": name, "page": None}),
                "active": classes == [name],
            }
        )
    return links


def _api_url(project, testset, params) -> str:
    """The same history from the API (what a CI gate reads), for the browser's session."""
    query = _query_params(params)
    query.pop("page", None)
    query["project"] = project.slug
    return f"{reverse('api-testset-history', args=[testset.slug])}?{query.urlencode()}"


def _cells(case: history.CaseHistory, prefixes: list[str], labels: list[str]) -> str:
    """The row's cells: a link to the drill-in of that run's scenario, none when missing."""
    parts = []
    index = case.index
    for verdict, prefix, label in zip(case.verdicts, prefixes, labels, strict=True):
        if verdict == "missing":
            parts.append(f'<td class="hv hv-missing" title="{label}: missing"></td>')
        else:
            parts.append(
                f'<td class="hv hv-{verdict}"><a href="{prefix}{index}/" '
                f'title="{label}: {verdict}"></a></td>'
            )
    return mark_safe("".join(parts))  # noqa: S308 (fixed words, numbers and escaped URLs)


urlpatterns = [path("testsets/<str:ref>/history", testset_history, name="testset-history")]
