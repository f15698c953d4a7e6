"""Trace pages: the filtered list, and one trace as an expandable span tree."""

from __future__ import annotations

from django import forms
from django.http import Http404
from django.shortcuts import render
from django.urls import path

from evalsite.views import project_view
from runs.models import Trace
from runs.traces import trace_dict, trace_list
from runs.traces.sessions import session_pks

PAGE_SIZE = 50


class TraceFilterForm(forms.Form):
    q = forms.CharField(required=False, label="Search")
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), ("ok", "ok"), ("error", "error")]
    )
    since = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    # Keyset pagination: the page starts below this id, so new traces never shift pages.
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


@project_view()
def trace_list_page(request, project):
    form = TraceFilterForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else {}
    traces = trace_list(
        project=project,
        search=filters.get("q") or "",
        status=filters.get("status") or "",
        since=filters.get("since"),
        until=filters.get("until"),
    )
    if filters.get("before"):
        traces = traces.filter(pk__lt=filters["before"])
    page = list(traces.order_by("-id")[: PAGE_SIZE + 1])
    # Sessions are linked by pk (runs/views/sessions.py): one query for the page's.
    pks = session_pks(project=project, session_ids=[trace.session_id for trace in page])
    for trace in page:
        trace.session_pk = pks.get(trace.session_id)
    query = request.GET.copy()
    query.pop("before", None)
    newest = f"{request.path}?{query.urlencode()}"
    context = {
        "project": project,
        "form": form,
        "traces": page[:PAGE_SIZE],
        "older_url": f"{newest}&before={page[PAGE_SIZE - 1].pk}" if len(page) > PAGE_SIZE else "",
        "newest_url": newest if filters.get("before") else "",
    }
    template = "runs/traces/list.html#trace-table" if request.htmx else "runs/traces/list.html"
    return render(request, template, context)


@project_view()
def trace_detail_page(request, project, trace_id):
    trace = Trace.objects.for_project(project).filter(trace_id=trace_id).first()
    if trace is None:
        raise Http404("No such trace.")
    context = {
        "project": project,
        "trace": trace,
        "contract": trace_dict(trace),
        "session_pk": session_pks(project=project, session_ids=[trace.session_id]).get(
            trace.session_id
        ),
    }
    return render(request, "runs/traces/detail.html", context)


urlpatterns = [
    path("traces/", trace_list_page, name="trace-list"),
    path("traces/<str:trace_id>/", trace_detail_page, name="trace-detail"),
]
