"""Reliability records on pages: recomputing an evaluator's records from its page, and the
corrected pass rate as the run and comparison pages print it."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import path
from django.views.decorators.http import require_POST

from evalsite.views import project_view
from evaluators import selectors as evaluator_selectors
from runs import queue as work
from runs import review


@require_POST
@project_view()
def reliability_refresh(request, project, ref):
    """Recompute the head revision's records now, or in the background when it has judged
    more gold-labelled traces than a request should wait for."""
    evaluator = evaluator_selectors.evaluator_get(project=project, ref=ref)
    if evaluator is None or evaluator.head is None:
        raise Http404("No such evaluator.")
    head = evaluator.head
    verdicts = review.gold_verdicts(head)
    if verdicts.count() > review.INLINE_VERDICTS:
        traces = sorted(set(verdicts.values_list("trace_id", flat=True)))
        work.reliability_refresh(project.pk, traces)
        messages.info(
            request,
            f"{head.slug} has judged {len(traces)} gold-labelled traces: its records are being "
            "recomputed in the background. Reload this page in a minute.",
        )
    else:
        records = review.reliability_refresh(revision=head)
        if records:
            messages.success(
                request, f"Recomputed {len(records)} reliability record(s) of {head.slug}."
            )
        else:
            messages.info(
                request, f"{head.slug} has not judged any trace that carries a gold label yet."
            )
    return redirect("evaluator-detail", project.slug, evaluator.slug)


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


def corrected_display(entry: dict[str, Any]) -> dict[str, Any]:
    """One entry of ``review.corrected_rates`` as the pages print it ("corrected: 62% [48-75%],
    on 40 gold items"), with the explanation for a tooltip, or the reason it cannot be."""
    gold = f"{entry['gold_evaluator']}.{entry['gold_field']}"
    se, sp = entry["sensitivity"]["value"], entry["specificity"]["value"]
    measured = (
        f"sensitivity {_percent(se) if se is not None else '—'} and specificity "
        f"{_percent(sp) if sp is not None else '—'}, measured against {gold} on "
        f"{entry['gold_items']} gold items"
    )
    observed = (
        f"observed {_percent(entry['passed'] / entry['n'])} ({entry['passed']} of {entry['n']})"
    )
    shown = entry["identifiable"] and entry["value"] is not None
    ci = entry["ci"]
    return {
        "shown": shown,
        "value": _percent(entry["value"]) if shown else "",
        "ci": f"{ci[0] * 100:.0f}–{ci[1] * 100:.0f}%" if shown and ci else "",
        "items": entry["gold_items"],
        "gold": gold,
        "reason": entry["reason"] or "",
        "explanation": (
            f"Rogan–Gladen correction of the pass rate ({observed}) for the evaluator's "
            f"{measured}: (observed + specificity − 1) / (sensitivity + specificity − 1). "
            "The interval also carries the uncertainty of sensitivity and specificity."
        ),
    }


def corrected_for(rates: dict[str, list[dict]], step_key: str, metric: str) -> list[dict]:
    """The displays of one step's metric, one per gold field it is measured against (each
    names its gold field when there are several)."""
    shown = [corrected_display(e) for e in rates.get(step_key, []) if e["metric"] == metric]
    return [display | {"named": len(shown) > 1} for display in shown]


urlpatterns = [
    path(
        "evaluators/<str:ref>/reliability/refresh",
        reliability_refresh,
        name="reliability-refresh",
    ),
]
