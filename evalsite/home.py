"""The project home page: the project's latest evaluators and runs.

It reads both apps, so it sits on top of them with ``urls.py``, ``demo.py`` and the management
commands; ``views.py`` holds the pages every app's views build on (``project_view``) and imports
no app.
"""

from __future__ import annotations

from django.shortcuts import render

from evalsite.views import project_view
from evaluators.selectors import evaluator_list_recent
from runs.selectors import run_list_recent


@project_view()
def project_home(request, project):
    context = {
        "project": project,
        "evaluators": evaluator_list_recent(project=project),
        "runs": run_list_recent(project=project),
    }
    return render(request, "projects/home.html", context)
