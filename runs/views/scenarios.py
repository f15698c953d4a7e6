"""The scenario drill-in: inputs and ground truth, outputs, the trace, every evaluator's
judgement, the human annotation form, and the reviews its trace got in annotation queues."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.contrib import messages
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from evalsite.errors import InvalidInput
from evalsite.jsonpaths import dig
from evalsite.views import project_view
from evaluators.models import Evaluator
from runs import metrics, review, selectors
from runs.engine import PEOPLE_KINDS, scenario_annotate
from runs.forms import AnnotationForm
from runs.models import (
    AnnotationQueue,
    ItemSource,
    ItemStatus,
    QueueItem,
    Result,
    Review,
    ReviewStatus,
    Run,
    RunStep,
    Scenario,
)
from runs.traces import OUTPUTS_PATH, scenario_invocation_trace, trace_dict


def _run_and_scenario(project, run_id, index) -> tuple[Run, Scenario]:
    run = selectors.run_get(project=project, run_id=run_id)
    scenario = (
        run.scenarios.filter(index=index).select_related("testcase", "trace").first()
        if run
        else None
    )
    if scenario is None:
        raise Http404("No such scenario.")
    return run, scenario


def _ground_truth_keys(steps: list[RunStep]) -> set[str]:
    keys = {"correct_answer", "ground_truth", "reference", "expected"}
    for step in steps:
        key = (step.revision.parameters or {}).get("correct_answer_key")
        if key:
            keys.add(key)
    return keys


def _panel(steps: list[RunStep], scenario: Scenario, *, forms: bool) -> list[dict]:
    """Every evaluator of the run with its cell: outputs, status, error, duration, revision,
    and (``forms``: for those who may annotate) the annotation form from its outputs schema."""
    results = {
        (r.step_key, r.repeat_idx): r
        for r in Result.objects.filter(scenario=scenario).select_related(
            "annotation__judge_trace", "annotation__updated_by"
        )
    }
    panel = []
    for step in steps:
        revision = step.revision
        schema, source = metrics.revision_outputs_schema(revision) if forms else (None, "")
        result = results.get((step.key, 0))
        annotation = result.annotation if result else None
        panel.append(
            {
                "step": step,
                "revision": revision,
                "evaluator": revision.evaluator,
                "result": result,
                "annotation": annotation,
                "schema_source": source,
                "form": AnnotationForm(
                    schema,
                    initial_outputs=annotation.outputs if annotation else None,
                    prefix=f"s{step.pk}",
                )
                if schema
                else None,
                "people": revision.kind in PEOPLE_KINDS,
            }
        )
    return panel


def _reviews(request, run: Run, scenario: Scenario) -> list[dict]:
    """The queue items holding the scenario's trace (its output trace at repeat 0), with their
    reviews and gold label. A reviewer of a blind queue sees them once they have reviewed the
    item themselves (or once it has left review)."""
    traces = review.scenario_traces(run, Scenario.objects.filter(pk=scenario.pk))
    if scenario.index not in traces:
        return []
    submitted = Review.objects.filter(status=ReviewStatus.SUBMITTED).select_related("reviewer")
    items = (
        QueueItem.objects.filter(trace_id=traces[scenario.index][0], project_id=run.project_id)
        .select_related("queue", "gold", "adjudicated_by")
        .prefetch_related(Prefetch("reviews", queryset=submitted, to_attr="submitted"))
        .order_by("queue__name", "pk")
    )
    return [{"item": item, "hidden": _blind_to(request, item)} for item in items]


def _blind_to(request, item: QueueItem) -> bool:
    queue = item.queue
    if (
        not queue.blind
        or item.status != ItemStatus.OPEN
        or not review.may_review(queue, request.user)
    ):
        return False
    adjudicator = review.may_adjudicate(queue, request.user, request.role)
    return not review.sees_others(item, request.user, adjudicator=adjudicator)


@project_view()
def scenario_detail(request, project, run_id, index):
    run, scenario = _run_and_scenario(project, run_id, index)
    invocation = scenario_invocation_trace(scenario)
    trace = trace_dict(invocation) if invocation else None
    outputs = dig(next(iter(trace["spans"].values()), {}) if trace else {}, OUTPUTS_PATH)
    previous, following = selectors.scenario_neighbours(run, index)
    # The run's evaluator steps, read once for the panel, the ground truth and the playground.
    steps = list(
        run.steps.filter(type="annotation")
        .select_related("revision__evaluator")
        .order_by("position", "id")
    )
    truth_keys = _ground_truth_keys(steps)
    can_edit = request.role in ("editor", "owner") and not run.closed
    context = {
        "project": project,
        "run": run,
        "scenario": scenario,
        "inputs": [(k, v, k in truth_keys) for k, v in scenario.inputs.items()],
        "outputs": outputs,
        "outputs_text": isinstance(outputs, str),
        "trace": trace,
        "panel": _panel(steps, scenario, forms=can_edit),
        "previous": previous,
        "following": following,
        "extra_human": _extra_human(project, steps) if can_edit else [],
        "can_edit": can_edit,
        "playground": _playground_url(project, run, scenario, steps),
        "reviews": _reviews(request, run, scenario),
        "can_queue": request.role in ("editor", "owner"),
        "queues": AnnotationQueue.objects.for_project(project).filter(archived=False),
    }
    return render(request, "runs/scenario.html", context)


def _extra_human(project, steps: list[RunStep]) -> list[tuple]:
    """The project's human evaluators not in the run yet, each with its annotation form."""
    in_run = {step.revision_id for step in steps}
    human = (
        Evaluator.objects.for_project(project).active().filter(kind="human").select_related("head")
    )
    return [
        (e, AnnotationForm(metrics.revision_outputs_schema(e.head)[0] or {}, prefix="new"))
        for e in human
        if e.head_id not in in_run
    ]


def _playground_url(project, run, scenario, steps: list[RunStep]) -> str:
    """The code evaluator playground, prefilled with this scenario (first code evaluator of the run)."""
    step = next((s for s in steps if s.revision.kind == "code"), None)
    if step is None:
        return ""
    url = reverse("evaluator-detail", args=[project.slug, step.revision.evaluator.slug])
    return f"{url}?{urlencode({'run': run.pk, 'scenario': scenario.index})}#try-panel"


@require_POST
@project_view()
def scenario_annotate_view(request, project, run_id, index):
    run, scenario = _run_and_scenario(project, run_id, index)
    evaluator = (
        Evaluator.objects.for_project(project)
        .filter(pk=request.POST.get("evaluator") or 0)
        .select_related("head")
        .first()
    )
    if evaluator is None:
        raise Http404("No such evaluator.")
    revision = evaluator.head
    step = run.steps.filter(revision__evaluator=evaluator).select_related("revision").first()
    if step is not None:
        revision = step.revision
    schema, _ = metrics.revision_outputs_schema(revision)
    prefix = f"s{step.pk}" if step else request.POST.get("prefix", "new")
    form = AnnotationForm(schema or {}, request.POST, prefix=prefix)
    url = reverse("scenario-detail", args=[project.slug, run.pk, scenario.index])
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {v[0]}" for k, v in form.errors.items()))
        return redirect(url)
    outputs = form.outputs()
    try:
        scenario_annotate(
            run=run, scenario=scenario, revision=revision, outputs=outputs, author=request.user
        )
    except InvalidInput as exc:
        messages.error(request, "; ".join(f"{k}: {v[0]}" for k, v in exc.fields.items()))
    else:
        messages.success(request, f"Saved {evaluator.name}: {json.dumps(outputs)}")
    return redirect(url)


@require_POST
@project_view()
def scenario_queue_add(request, project, run_id, index):
    """The drill-in's "Send to a queue": the scenario's output trace joins a queue."""
    run, scenario = _run_and_scenario(project, run_id, index)
    url = reverse("scenario-detail", args=[project.slug, run.pk, scenario.index])
    ref = request.POST.get("queue", "")
    queue = (
        AnnotationQueue.objects.for_project(project).filter(pk=int(ref), archived=False).first()
        if ref.isdecimal()
        else None
    )
    if queue is None:
        messages.error(request, "Choose an annotation queue of this project.")
        return redirect(url)
    try:
        added = review.items_add_scenarios(
            queue=queue, run=run, indexes=[scenario.index], source=ItemSource.MANUAL
        )
    except InvalidInput as exc:
        messages.error(request, "; ".join(reasons[0] for reasons in exc.fields.values()))
    else:
        if added:
            messages.success(request, f"Scenario {scenario.index} sent to {queue.name}.")
        else:
            messages.info(request, f"Scenario {scenario.index} is in {queue.name} already.")
    return redirect(url)


urlpatterns = [
    path("runs/<int:run_id>/scenarios/<int:index>/", scenario_detail, name="scenario-detail"),
    path(
        "runs/<int:run_id>/scenarios/<int:index>/annotate",
        scenario_annotate_view,
        name="scenario-annotate",
    ),
    path(
        "runs/<int:run_id>/scenarios/<int:index>/queue",
        scenario_queue_add,
        name="scenario-queue-add",
    ),
]
