"""Tenancy services: projects, members and API keys."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from evalsite.errors import InvalidInput
from evalsite.models import MAX_RETENTION_DAYS, ApiKey, Membership, Project, Role


@transaction.atomic
def project_create(*, name: str, owner, slug: str = "", description: str = "") -> Project:
    project = Project.objects.create(
        name=name, slug=slug or slugify(name)[:64], description=description
    )
    if owner is not None:
        Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    return project


def membership_set(*, project: Project, user, role: str) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership


def api_key_create(
    *, project: Project, name: str, created_by=None, role: str = Role.EDITOR
) -> tuple[ApiKey, str]:
    """Create a key and return it with its raw value, which is never stored or shown again."""
    raw, prefix, key_hash = ApiKey.generate()
    key = ApiKey.objects.create(
        project=project,
        name=name,
        role=role,
        prefix=prefix,
        key_hash=key_hash,
        created_by=created_by if getattr(created_by, "pk", None) else None,
    )
    return key, raw


def user_get_or_create(*, username: str, password: str | None = None):
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    if created:
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
    return user


def project_spend_cap_set(*, project: Project, max_run_cost_usd) -> Project:
    """The most one run of the project may be projected to spend on judges (None: no cap)."""
    if max_run_cost_usd is not None and max_run_cost_usd < 0:
        raise InvalidInput({"max_run_cost_usd": ["must be 0 or more (or empty for no cap)"]})
    Project.objects.filter(pk=project.pk).update(max_run_cost_usd=max_run_cost_usd)
    project.max_run_cost_usd = max_run_cost_usd
    return project


def project_trace_retention_set(*, project: Project, trace_retention_days: int | None) -> Project:
    """Whole days (plus today) the project keeps its traces; None: the site's
    EVALSITE_TRACE_RETENTION_DAYS. The hourly retention run applies it (docs/traces.md)."""
    days = trace_retention_days
    if days is not None and not 1 <= days <= MAX_RETENTION_DAYS:
        raise InvalidInput(
            {
                "trace_retention_days": [
                    f"must be 1 to {MAX_RETENTION_DAYS} days (or empty for the site's setting)"
                ]
            }
        )
    Project.objects.filter(pk=project.pk).update(trace_retention_days=days)
    project.trace_retention_days = days
    return project
