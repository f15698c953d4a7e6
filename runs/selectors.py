"""Reads of runs for pages and APIs."""

from __future__ import annotations

from evalsite.models import Project


def run_list_recent(*, project: Project, limit: int = 8) -> list:
    # Runs arrive with the runs engine (issue 5); until then a project has none.
    return []
