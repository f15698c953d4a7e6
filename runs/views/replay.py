"""Replay pages: production traces (or sessions) as a testset, with a new application version run
over it beside production's own outputs; then the two runs' progress, and the comparison."""

from __future__ import annotations

import json

from django import forms
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django_htmx.http import HttpResponseClientRedirect

from evalsite.errors import InvalidInput
from evalsite.views import project_view
from evaluators.models import Evaluator
from runs import online
from runs.models import Application, Testset
from runs.views.sessions import SessionFilterForm
from runs.views.traces import TraceFilterForm


class ReplayForm(forms.Form):
    name = forms.CharField(
        max_length=200,
        required=False,
        label="Testset name",
        help_text="A new testset; defaults to “Production replay” and the time.",
    )
    testset = forms.ModelChoiceField(
        queryset=Testset.objects.none(),
        required=False,
        empty_label="— a new testset —",
        label="Or a new version of",
        help_text="The replayed rows replace its rows in a new version; earlier runs keep theirs.",
    )
    application = forms.ModelChoiceField(
        queryset=Application.objects.none(),
        empty_label="Choose the new version",
        help_text="An HTTP application: evalsite POSTs each row's inputs to it.",
    )
    evaluators = forms.ModelMultipleChoiceField(
        queryset=Evaluator.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        help_text="Both runs use them, at their newest revision.",
    )
    limit = forms.IntegerField(
        min_value=1,
        max_value=online.REPLAY_MAX_LIMIT,
        initial=online.REPLAY_DEFAULT_LIMIT,
        label="At most",
        help_text=f"The newest this many become rows (up to {online.REPLAY_MAX_LIMIT:,}).",
    )

    def __init__(self, project, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["testset"].queryset = Testset.objects.for_project(project).filter(
            head__isnull=False
        )
        self.fields["application"].queryset = Application.objects.for_project(project).filter(
            kind=Application.Kind.HTTP
        )
        self.fields["evaluators"].queryset = (
            Evaluator.objects.for_project(project).active().exclude(kind__in=("human", "feedback"))
        )


def _source(request) -> str:
    source = request.GET.get("source", "traces")
    return source if source in online.REPLAY_SOURCES else "traces"


def _filters(source: str, form: forms.Form) -> online.ReplayFilters:
    data = form.cleaned_data
    return online.ReplayFilters(
        search=data.get("q") or "",
        status=data.get("status") or "",
        since=data.get("since"),
        until=data.get("until"),
        min_turns=data.get("min_turns"),
    )


def _form_errors(form: forms.Form, exc: InvalidInput) -> None:
    for name, reasons in exc.fields.items():
        field = name if name in form.fields else None
        for reason in reasons:
            form.add_error(field, reason if field else f"{name}: {reason}")


@project_view()
def replay_new(request, project):
    """GET: how many traces (or sessions) the list's filters match, and the first rows they
    make. POST: make the testset and queue both runs, then follow them."""
    source = _source(request)
    filter_form = (SessionFilterForm if source == "sessions" else TraceFilterForm)(request.GET)
    initial = {"limit": request.GET["limit"]} if request.GET.get("limit") else {}
    form = ReplayForm(project, request.POST or None, initial=initial)
    preview = None
    if filter_form.is_valid():
        filters = _filters(source, filter_form)
        if request.method == "POST" and form.is_valid():
            replay = _create(request, project, source, filters, form)
            if replay is not None:
                return redirect("replay-detail", project.slug, replay.id)
        limit = form.cleaned_data.get("limit") if form.is_bound else None
        try:
            preview = online.replay_preview(
                project=project,
                source=source,
                filters=filters,
                limit=limit or request.GET.get("limit") or online.REPLAY_DEFAULT_LIMIT,
            )
        except InvalidInput as exc:
            _form_errors(filter_form, exc)
    context = {
        "project": project,
        "source": source,
        "noun": source.removesuffix("s"),
        "max_limit": online.REPLAY_MAX_LIMIT,
        "max_limit_text": f"{online.REPLAY_MAX_LIMIT:,}",
        "filter_form": filter_form,
        "form": form,
        "preview": preview,
        "table": _table(preview) if preview else None,
        "query": request.GET.urlencode(),
        "list_url": _list_url(project, source, request.GET),
        "http_apps": form.fields["application"].queryset.exists(),
    }
    return render(request, "runs/replay/new.html", context)


def _create(request, project, source, filters, form) -> online.Replay | None:
    """The replay, or None with the refusal shown on the form."""
    data = form.cleaned_data
    try:
        return online.replay_create(
            project=project,
            user=request.user,
            source=source,
            filters=filters,
            limit=data["limit"],
            name=data["name"],
            testset=data["testset"],
            application=data["application"],
            evaluators=[e.head for e in data["evaluators"]],
        )
    except InvalidInput as exc:
        _form_errors(form, exc)
        return None


def _table(preview: online.Preview) -> dict:
    """The preview rows as text, one cell per column (a missing key shows as empty)."""
    columns = preview.columns
    return {
        "columns": columns,
        "rows": [[_text(row.get(c)) for c in columns] for row in preview.rows],
    }


def _text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _list_url(project, source: str, params) -> str:
    """Back to the traces list with the same filters."""
    if source != "traces":
        return ""
    query = params.copy()
    for name in ("source", "limit"):
        query.pop(name, None)
    url = reverse("trace-list", args=[project.slug])
    return f"{url}?{query.urlencode()}" if query else url


@project_view()
def replay_detail(request, project, replay_id):
    """A replay's two runs while they go; once both have ended, the comparison (htmx follows
    there by itself, a plain page load is redirected)."""
    runs = online.replay_runs(project=project, replay_id=replay_id)
    production, candidate = runs.get("production"), runs.get("candidate")
    if production is None or candidate is None:
        raise Http404("No such replay.")
    compare_url = (
        f"{reverse('run-compare', args=[project.slug])}?runs={production.pk},{candidate.pk}"
        f"&baseline={production.pk}"
    )
    done = not (production.is_active or candidate.is_active)
    if done and not request.htmx:
        return redirect(compare_url)
    context = {
        "project": project,
        "replay_id": replay_id,
        "runs": [production, candidate],
        "version": production.testset_version,
        "compare_url": compare_url,
    }
    if request.htmx:
        if done:
            return HttpResponseClientRedirect(compare_url)
        return render(request, "runs/replay/detail.html#replay-progress", context)
    return render(request, "runs/replay/detail.html", context)


urlpatterns = [
    path("replay/new", replay_new, name="replay-new"),
    path("replay/<slug:replay_id>/", replay_detail, name="replay-detail"),
]
