"""The schema backfill pages (operators): revisions without an outputs schema, and repairing one."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from evalsite.views import project_view
from evaluators.selectors import revision_get
from runs import metrics
from runs.metrics import backfill


@project_view()
def schema_list(request, project):
    revisions = backfill.backfill_candidates(project=project)
    return render(request, "runs/schemas/list.html", {"project": project, "revisions": revisions})


class SchemaForm(forms.Form):
    schema = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 16, "data-editor": "json", "class": "mono"}),
        help_text="Adjust the inferred schema if needed; it becomes the revision's outputs schema.",
    )

    def clean_schema(self):
        try:
            return jsonsafe.loads(self.cleaned_data["schema"])
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}")


def _revision_or_404(project, ref):
    revision = revision_get(project=project, ref=ref)
    if revision is None:
        raise Http404("No such revision.")
    return revision


@project_view()
def schema_detail(request, project, ref):
    revision = _revision_or_404(project, ref)
    inferred = metrics.schema_infer(revision_id=revision.pk)
    current = revision.outputs_schema
    form = SchemaForm(
        request.POST or None,
        initial={"schema": json.dumps(current or inferred["schema"], indent=2)},
    )
    if request.method == "POST" and form.is_valid():
        try:
            backfill.schema_backfill_apply(
                revision=revision, schema=form.cleaned_data["schema"], author=request.user
            )
        except InvalidInput as exc:
            form.add_error("schema", next(iter(exc.fields.values()))[0])
        else:
            messages.success(
                request, f"Schema applied to {revision.slug}; affected runs are being refreshed."
            )
            return redirect("schema-detail", project.slug, revision.slug)
    context = {
        "project": project,
        "revision": revision,
        "inferred": inferred,
        "form": form,
        "progress": backfill.backfill_progress(revision),
        "disagreeing": backfill.disagreeing_outputs(revision=revision) if current else None,
        "runs": backfill.affected_runs(revision)[:50],
    }
    status = 400 if request.method == "POST" else 200
    return render(request, "runs/schemas/detail.html", context, status=status)


@project_view()
def schema_progress(request, project, ref):
    revision = _revision_or_404(project, ref)
    context = {
        "project": project,
        "revision": revision,
        "progress": backfill.backfill_progress(revision),
    }
    return render(request, "runs/schemas/detail.html#backfill-progress", context)


urlpatterns = [
    path("schemas/", schema_list, name="schema-list"),
    path("schemas/<str:ref>/", schema_detail, name="schema-detail"),
    path("schemas/<str:ref>/progress", schema_progress, name="schema-progress"),
]
