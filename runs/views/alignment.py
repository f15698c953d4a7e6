"""Judge alignment pages: the form (with an estimate that creates nothing), an alignment's page
(the examples chosen, the run's progress, both held-out records side by side), accept and
discard. Errors come back inline: with status 400 on a full page, 200 for HTMX."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from evalsite.errors import InvalidInput
from evalsite.views import project_view
from evaluators.models import EvaluatorRevision
from runs import review
from runs.models import AlignmentStatus, AnnotationQueue, JudgeAlignment

FIGURE_LABELS = {
    "accuracy": "Accuracy",
    "precision": "Precision",
    "recall": "Recall (sensitivity)",
    "specificity": "Specificity",
    "f1": "F1",
    "kappa": "Cohen's kappa",
    "mae": "Mean absolute error",
    "pearson": "Pearson's r",
    "spearman": "Spearman's rho",
}
LOWER_IS_BETTER = {"mae"}


class AlignmentForm(forms.Form):
    revision = forms.ModelChoiceField(
        queryset=EvaluatorRevision.objects.none(),
        empty_label="Choose an LLM judge revision",
        label="Base revision",
    )
    queue = forms.ModelChoiceField(
        queryset=AnnotationQueue.objects.none(),
        empty_label="Choose a queue",
        help_text="Its gold items that the base judged: some teach, the others measure.",
    )
    gold_field = forms.CharField(
        required=False,
        max_length=64,
        help_text="The queue's field to align on; empty: the first one the judge answers.",
    )
    shots = forms.IntegerField(
        min_value=1, max_value=20, initial=4, help_text="Examples added to the prompt."
    )
    heldout_fraction = forms.FloatField(
        min_value=0.1,
        max_value=0.9,
        initial=0.5,
        label="Held-out share",
        help_text="Of the gold items, this share is never an example: both revisions judge them.",
    )
    seed = forms.IntegerField(min_value=0, initial=0, help_text="The same seed, the same split.")
    max_cost_usd = forms.FloatField(
        required=False, min_value=0, label="Max cost (USD)", help_text="Refused above it."
    )
    max_calls = forms.IntegerField(required=False, min_value=1, label="Max model calls")

    def __init__(self, project, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["revision"].queryset = (
            EvaluatorRevision.objects.filter(project=project, kind="llm_judge")
            .select_related("evaluator")
            .order_by("evaluator__name", "-version")
        )
        self.fields["revision"].label_from_instance = lambda r: f"{r.evaluator.name} · {r.slug}"
        self.fields["queue"].queryset = AnnotationQueue.objects.for_project(project).filter(
            archived=False
        )

    def service_arguments(self) -> dict:
        data = self.cleaned_data
        return {
            "base": data["revision"],
            "queue": data["queue"],
            "gold_field": data["gold_field"] or None,
            "shots": data["shots"],
            "heldout_fraction": data["heldout_fraction"],
            "seed": data["seed"],
        }


def _form_errors(form: forms.Form, exc: InvalidInput) -> None:
    for field, reasons in exc.fields.items():
        form.add_error(field if field in form.fields else None, reasons[0])


@project_view()
def alignment_new(request, project):
    form = AlignmentForm(
        project,
        request.POST or None,
        initial={"revision": request.GET.get("revision"), "queue": request.GET.get("queue")},
    )
    plan = None
    if request.method == "POST" and form.is_valid():
        arguments = form.service_arguments()
        try:
            if request.POST.get("action") == "create":
                alignment = review.alignment_create(
                    **arguments,
                    max_cost_usd=form.cleaned_data["max_cost_usd"],
                    max_calls=form.cleaned_data["max_calls"],
                    author=request.user,
                )
                messages.success(
                    request, "Alignment started: both revisions judge the held-out items."
                )
                return redirect("alignment-detail", project.slug, alignment.pk)
            plan = review.alignment_plan(**arguments).summary()
        except InvalidInput as exc:
            _form_errors(form, exc)
    context = {"project": project, "form": form, "plan": plan}
    if request.htmx and request.method == "POST":  # htmx 2 does not swap 4xx bodies
        return render(request, "runs/alignment/new.html#alignment-form", context)
    status = 400 if form.errors else 200
    return render(request, "runs/alignment/new.html", context, status=status)


def _alignment_or_404(project, alignment_id) -> JudgeAlignment:
    alignment = (
        JudgeAlignment.objects.for_project(project)
        .select_related("base__evaluator", "candidate", "queue__revision", "run", "created_by")
        .filter(pk=alignment_id)
        .first()
    )
    if alignment is None:
        raise Http404("No such alignment.")
    return alignment


def _figure_rows(records: dict) -> list[dict]:
    rows = []
    for name in records.get("figures", ()):
        difference = records["difference"][name]
        value = difference["value"]
        better = None
        if value:
            better = (value < 0) if name in LOWER_IS_BETTER else (value > 0)
        rows.append(
            {
                "name": name,
                "label": FIGURE_LABELS.get(name, name),
                "base": records["base"][name],
                "candidate": records["candidate"][name],
                "difference": difference,
                "better": better,
            }
        )
    return rows


def _detail_context(request, project, alignment: JudgeAlignment, error: str = "") -> dict:
    run = alignment.run
    return {
        "project": project,
        "alignment": alignment,
        "run": run,
        "percent": round(run.progress) if run else 0,
        "records": alignment.records,
        "figures": _figure_rows(alignment.records) if alignment.records else [],
        "can_decide": request.role in ("editor", "owner"),
        "decidable": alignment.status == AlignmentStatus.DONE,
        "error": error,
    }


@project_view()
def alignment_detail(request, project, alignment_id):
    alignment = review.alignment_refresh(alignment=_alignment_or_404(project, alignment_id))
    context = _detail_context(request, project, alignment)
    if request.htmx and request.GET.get("region") == "alignment-results":
        return render(request, "runs/alignment/detail.html#alignment-results", context)
    return render(request, "runs/alignment/detail.html", context)


def _decide(request, project, alignment_id, service, done: str):
    alignment = _alignment_or_404(project, alignment_id)
    try:
        service(alignment=alignment, author=request.user)
    except InvalidInput as exc:
        message = next(iter(exc.fields.values()))[0]
        context = _detail_context(request, project, alignment, error=message)
        return render(request, "runs/alignment/detail.html", context, status=exc.status)
    messages.success(request, done)
    return redirect("alignment-detail", project.slug, alignment.pk)


@require_POST
@project_view()
def alignment_accept(request, project, alignment_id):
    return _decide(
        request,
        project,
        alignment_id,
        review.alignment_accept,
        "Accepted: the candidate is now the evaluator's head revision.",
    )


@require_POST
@project_view()
def alignment_discard(request, project, alignment_id):
    return _decide(
        request,
        project,
        alignment_id,
        review.alignment_discard,
        "Discarded: the evaluator's head is unchanged.",
    )


urlpatterns = [
    path("alignments/new", alignment_new, name="alignment-new"),
    path("alignments/<int:alignment_id>/", alignment_detail, name="alignment-detail"),
    path("alignments/<int:alignment_id>/accept", alignment_accept, name="alignment-accept"),
    path("alignments/<int:alignment_id>/discard", alignment_discard, name="alignment-discard"),
]
