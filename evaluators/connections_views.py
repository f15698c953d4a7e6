"""Model connection pages: list, add, edit, test, delete. The API key is write-only here too:
the form never renders it back, and an empty key field keeps the stored one."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from evalsite.views import project_view
from evaluators.judge.connections import (
    model_connection_create,
    model_connection_delete,
    model_connection_test,
    model_connection_update,
)
from evaluators.models import ModelConnection

PRICES_HELP = 'USD per 1M tokens, per model: {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}.'


class ConnectionForm(forms.Form):
    name = forms.CharField(max_length=200)
    slug = forms.SlugField(
        max_length=100,
        required=False,
        help_text="What judges name; empty derives it from the name.",
    )
    base_url = forms.CharField(
        max_length=500,
        label="Base URL",
        help_text="The OpenAI-compatible API root, e.g. https://api.openai.com/v1.",
    )
    api_key = forms.CharField(
        required=False,
        strip=True,
        label="API key",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted and never shown again. Leave empty to keep the stored key.",
    )
    clear_api_key = forms.BooleanField(required=False, label="Remove the stored key")
    model_names = forms.CharField(
        required=False,
        label="Models",
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="One model name per line; the first is the default.",
    )
    prices = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "data-editor": "json"}),
        help_text=PRICES_HELP,
    )
    rate_limit_rpm = forms.IntegerField(
        min_value=0,
        initial=600,
        label="Rate limit (requests/min)",
        help_text="Shared by runs, online rules and the playground on every worker; 0: none.",
    )
    timeout_seconds = forms.FloatField(min_value=0.1, initial=60.0, label="Timeout (s)")

    def clean_model_names(self) -> list[str]:
        return [
            line.strip() for line in self.cleaned_data["model_names"].splitlines() if line.strip()
        ]

    def clean_prices(self) -> dict:
        raw = self.cleaned_data["prices"].strip()
        try:
            prices = jsonsafe.loads(raw) if raw else {}
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}")
        if not isinstance(prices, dict):
            raise forms.ValidationError("A JSON object keyed by model name.")
        return prices

    @classmethod
    def initial_for(cls, connection: ModelConnection) -> dict:
        return {
            "name": connection.name,
            "slug": connection.slug,
            "base_url": connection.base_url,
            "model_names": "\n".join(connection.model_names),
            "prices": json.dumps(connection.prices, indent=2) if connection.prices else "",
            "rate_limit_rpm": connection.rate_limit_rpm,
            "timeout_seconds": connection.timeout_seconds,
        }


def _errors_onto(form: forms.Form, exc: InvalidInput) -> None:
    for field, reasons in exc.fields.items():
        target = field.split(".")[0]
        for reason in reasons:
            form.add_error(target if target in form.fields else None, reason)


def _connection_or_404(project, ref: str) -> ModelConnection:
    connection = ModelConnection.objects.for_project(project).by_ref(ref).first()
    if connection is None:
        raise Http404("No such model connection.")
    return connection


@project_view()
def connection_list(request, project):
    connections = ModelConnection.objects.for_project(project)
    context = {"project": project, "connections": connections}
    if request.htmx:
        return render(request, "evaluators/connections/list.html#connection-table", context)
    return render(request, "evaluators/connections/list.html", context)


@project_view()
def connection_new(request, project):
    form = ConnectionForm(request.POST or None)
    del form.fields["clear_api_key"]
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        try:
            connection = model_connection_create(project=project, author=request.user, **data)
        except InvalidInput as exc:
            _errors_onto(form, exc)
        else:
            messages.success(request, f"Model connection {connection.name} added.")
            return redirect("connection-detail", project.slug, connection.slug)
    context = {"project": project, "form": form, "connection": None}
    return render(request, "evaluators/connections/form.html", context)


@project_view()
def connection_detail(request, project, ref):
    connection = _connection_or_404(project, ref)
    initial = ConnectionForm.initial_for(connection)
    form = ConnectionForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            connection = model_connection_update(connection=connection, **form.cleaned_data)
        except InvalidInput as exc:
            _errors_onto(form, exc)
        else:
            messages.success(request, f"Model connection {connection.name} saved.")
            return redirect("connection-detail", project.slug, connection.slug)
    context = {"project": project, "form": form, "connection": connection}
    status = 400 if request.method == "POST" else 200
    return render(request, "evaluators/connections/form.html", context, status=status)


@require_POST
@project_view()
def connection_test(request, project, ref):
    connection = _connection_or_404(project, ref)
    result = model_connection_test(connection=connection, model=request.POST.get("model", ""))
    context = {"project": project, "connection": connection, "test": result}
    if request.htmx:
        return render(request, "evaluators/connections/form.html#connection-test", context)
    form = ConnectionForm(initial=ConnectionForm.initial_for(connection))
    return render(request, "evaluators/connections/form.html", context | {"form": form})


@require_POST
@project_view()
def connection_delete(request, project, ref):
    connection = _connection_or_404(project, ref)
    model_connection_delete(connection=connection)
    messages.success(request, f"Model connection {connection.name} deleted.")
    return redirect("connection-list", project.slug)


urlpatterns = [
    path("connections/", connection_list, name="connection-list"),
    path("connections/new", connection_new, name="connection-new"),
    path("connections/<str:ref>/", connection_detail, name="connection-detail"),
    path("connections/<str:ref>/test", connection_test, name="connection-test"),
    path("connections/<str:ref>/delete", connection_delete, name="connection-delete"),
]
