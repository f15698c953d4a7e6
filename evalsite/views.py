"""Tenancy pages (projects, settings, API keys) and the project lookup every page uses.

Every app's views import ``project_view`` from here, so this module imports no app (the project
home page, which reads both, is ``evalsite/home.py``)."""

from __future__ import annotations

from functools import wraps

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from evalsite.access import project_role_needed
from evalsite.models import MAX_RETENTION_DAYS, Project, Role, role_allows
from evalsite.services import (
    api_key_create,
    project_create,
    project_spend_cap_set,
    project_trace_retention_set,
)


def project_view(view=None):
    """Look up ``slug`` among the user's projects (404 for others') and check the role that
    ``evalsite.access`` sets for this URL and method (403 below it).

    The view receives ``project`` instead of ``slug`` and finds the caller's role on
    ``request.role``. Use it bare or called with no arguments: the roles live in the table.
    """
    if view is None:
        return project_view

    @login_required
    @wraps(view)
    def wrapper(request, slug, *args, **kwargs):
        project = Project.objects.for_user(request.user).filter(slug=slug).first()
        if project is None:
            raise Http404("No such project.")
        request.project, request.role = project, project.role_of(request.user)
        needed = project_role_needed(request)
        if not role_allows(request.role, needed):
            raise PermissionDenied(f"This needs the {needed} role in {project.name}.")
        if request.session.get("project") != project.slug:  # a GET must not write
            request.session["project"] = project.slug
        return view(request, project, *args, **kwargs)

    return wrapper


@login_required
def home(request):
    projects = Project.objects.for_user(request.user)
    slug = request.session.get("project")
    project = projects.filter(slug=slug).first() if slug else projects.first()
    if project is None:
        return redirect("project-list")
    return redirect("project-home", slug=project.slug)


class ProjectForm(forms.ModelForm):
    class Meta:
        model = Project
        fields = ["name", "slug", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}


@login_required
def project_list(request):
    form = ProjectForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        project = project_create(owner=request.user, **form.cleaned_data)
        messages.success(request, f"Project {project.name} created.")
        return redirect("project-home", slug=project.slug)
    projects = Project.objects.for_user(request.user)
    return render(request, "projects/list.html", {"projects": projects, "form": form})


@login_required
def project_go(request):
    """The project switcher's target: works as a plain GET form without JavaScript."""
    slug = request.GET.get("project", "")
    return redirect("project-home", slug=slug) if slug else redirect("project-list")


class SpendCapForm(forms.Form):
    max_run_cost_usd = forms.DecimalField(
        label="Spend cap per run (USD)",
        required=False,
        min_value=0,
        max_digits=12,
        decimal_places=4,
        help_text="A run whose judges are projected to cost more is refused before it starts. "
        "Empty: no cap.",
    )


class RetentionForm(forms.Form):
    trace_retention_days = forms.IntegerField(
        label="Keep traces for (days)",
        required=False,
        min_value=1,
        max_value=MAX_RETENTION_DAYS,
        help_text="Whole days, plus today; older traces, their spans and the annotations on "
        "them are deleted every hour. Empty: the site's setting.",
    )


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.EDITOR)


@project_view
def project_settings(request, project):
    form = ApiKeyForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        _, new_key = api_key_create(project=project, created_by=request.user, **form.cleaned_data)
        form = ApiKeyForm()
    context = {
        "project": project,
        "form": form,
        "new_key": new_key,
        "keys": project.api_keys.select_related("created_by"),
        "memberships": project.memberships.select_related("user").order_by("user__username"),
        "can_manage": role_allows(request.role, Role.OWNER),
        "spend_form": SpendCapForm(initial={"max_run_cost_usd": project.max_run_cost_usd}),
        "retention_form": RetentionForm(
            initial={"trace_retention_days": project.trace_retention_days}
        ),
        "site_retention_days": settings.EVALSITE_TRACE_RETENTION_DAYS,
    }
    return render(request, "projects/settings.html", context)


@require_POST
@project_view
def project_spend_cap(request, project):
    form = SpendCapForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(e for errors in form.errors.values() for e in errors))
    else:
        project_spend_cap_set(project=project, **form.cleaned_data)
        cap = form.cleaned_data["max_run_cost_usd"]
        messages.success(request, f"Spend cap per run: {'none' if cap is None else f'${cap}'}.")
    return redirect("project-settings", slug=project.slug)


@require_POST
@project_view
def project_trace_retention(request, project):
    form = RetentionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(e for errors in form.errors.values() for e in errors))
    else:
        project_trace_retention_set(project=project, **form.cleaned_data)
        days = project.trace_retention_effective_days
        kept = "forever" if days is None else f"{days} days plus today"
        messages.success(request, f"Traces are kept {kept}.")
    return redirect("project-settings", slug=project.slug)


@require_POST
@project_view
def api_key_revoke(request, project, key_id):
    key = project.api_keys.filter(pk=key_id).first()
    if key is None:
        raise Http404("No such key.")
    key.revoke()
    messages.success(request, f"Key {key.name} revoked.")
    return redirect("project-settings", slug=project.slug)


def bad_request(request, exception=None):
    """The 400 page (``handler400``): the reason a view gave with ``BadRequest`` (its own words:
    "q: must not contain a NUL character"), the generic sentence for anything else (a
    ``SuspiciousOperation``'s text is not the user's to read)."""
    message = str(exception) if type(exception) is BadRequest else ""
    return render(request, "400.html", {"message": message}, status=400)
