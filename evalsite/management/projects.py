"""What the management commands share."""

from __future__ import annotations

from django.core.management.base import CommandError

from evalsite.models import Project


def project_scope(slug: str) -> Project | None:
    """A command's ``--project SLUG``: that project, None when no slug was given; an unknown
    slug stops the command with a message."""
    if not slug:
        return None
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise CommandError(f"No project with the slug {slug!r}.")
    return project
