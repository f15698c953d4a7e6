"""Session pages: the filtered list, and one session read as its conversation."""

from __future__ import annotations

from django import forms
from django.http import Http404
from django.shortcuts import render
from django.urls import path
from django.utils.http import urlencode

from evalsite.views import project_view
from runs.traces.sessions import (
    TREE_SPAN_BUDGET,
    TURNS_PER_PAGE,
    session_cursor,
    session_cursor_parse,
    session_get,
    session_list,
    session_turns,
)

PAGE_SIZE = 50


class SessionFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Search")
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), ("ok", "ok"), ("error", "error")]
    )
    since = forms.DateTimeField(
        required=False,
        label="Active from",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    until = forms.DateTimeField(
        required=False,
        label="Active before",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    min_turns = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1_000_000,
        label="Turns at least",
        widget=forms.NumberInput(attrs={"placeholder": "any", "size": 4}),
    )
    # Keyset pagination (runs.traces.sessions.session_cursor): the page starts after this one.
    before = forms.CharField(required=False, max_length=60, widget=forms.HiddenInput)

    def clean_before(self):
        text = self.cleaned_data["before"]
        cursor = session_cursor_parse(text) if text else None
        if text and cursor is None:
            raise forms.ValidationError("not a page of this list; start from the newest.")
        return cursor


@project_view()
def session_list_page(request, project):
    form = SessionFilterForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else {}
    sessions = session_list(
        project=project,
        search=filters.get("q") or "",
        status=filters.get("status") or "",
        since=filters.get("since"),
        until=filters.get("until"),
        min_traces=filters.get("min_turns"),
        before=filters.get("before"),
    )
    page = list(sessions[: PAGE_SIZE + 1])
    query = request.GET.copy()
    query.pop("before", None)
    newest = f"{request.path}?{query.urlencode()}"
    context = {
        "project": project,
        "form": form,
        "sessions": page[:PAGE_SIZE],
        "older_url": (
            f"{newest}&before={session_cursor(page[PAGE_SIZE - 1])}"
            if len(page) > PAGE_SIZE
            else ""
        ),
        "newest_url": newest if filters.get("before") else "",
        "replay_query": _replay_query(request.GET),
    }
    template = (
        "runs/sessions/list.html#session-table" if request.htmx else "runs/sessions/list.html"
    )
    return render(request, template, context)


def _replay_query(params) -> str:
    """The filters the replay page reads (runs/views/replay.py), as the user typed them."""
    query = {"source": "sessions"}
    names = ("q", "status", "since", "until", "min_turns")
    query.update({key: params[key] for key in names if params.get(key)})
    return urlencode(query)


@project_view()
def session_detail_page(request, project, pk):
    session = session_get(project=project, pk=pk)
    if session is None:
        raise Http404("No such session.")
    page, turns = session_turns(
        session,
        page=request.GET.get("page") or 1,
        size=TURNS_PER_PAGE,
        span_budget=TREE_SPAN_BUDGET,
    )
    context = {"project": project, "session": session, "page": page, "turns": turns}
    return render(request, "runs/sessions/detail.html", context)


urlpatterns = [
    path("sessions/", session_list_page, name="session-list"),
    # By pk: a session id is the client's free text; a newline, a ``..`` segment or a ``?``
    # in it cannot survive a URL path (the API, for scripts, takes the id itself).
    path("sessions/<int:pk>/", session_detail_page, name="session-detail"),
]
