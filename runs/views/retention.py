"""The retention dry run of a project (owners): what the next hourly run would delete. The
settings page loads it into its Trace retention card; without JavaScript it is a page."""

from __future__ import annotations

from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe

from evalsite.views import project_view
from runs.traces import retention_plan


@require_safe
@project_view
def project_retention(request, project):
    report = retention_plan(project=project)
    context = {"project": project, "report": report, "row": report.projects[0]}
    template = "runs/retention/preview.html"
    return render(request, f"{template}#retention-preview" if request.htmx else template, context)


urlpatterns = [path("settings/retention", project_retention, name="project-retention")]
