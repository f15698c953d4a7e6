"""REST authentication and the project/role check every API view goes through.

An API key names its project. A browser session names one with the ``X-Project`` header or the
``project`` query parameter, else the project chosen last in the UI, else the user's only one.
The resolved project and role land on ``request.project`` / ``request.role``; querysets are then
scoped with ``for_project(request.project)``, so another project's ids are simply not found (404).

A web process keeps the keys it resolved for ``KEY_CACHE_SECONDS`` (the lookup joins three
tables and cost about a tenth of an ingest request): a key revoked, or a key, project or user
changed, in this process is looked up again at once; in another process or on another host it
stops working within ``KEY_CACHE_SECONDS``. Every request still compares the key's hash, in
constant time.
"""

from __future__ import annotations

import copy
import hmac
import time
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from rest_framework import authentication, exceptions, permissions

from evalsite.access import project_role_needed
from evalsite.models import ApiKey, Project, hash_key, role_allows

KEY_CACHE_SECONDS = 5.0


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme != self.keyword:
            return None
        raw = raw.strip()
        parts = raw.split("_")
        if len(parts) < 3 or not raw:
            raise exceptions.AuthenticationFailed("Malformed API key.")
        key = _key_by_prefix(parts[1])
        if key is None or not hmac.compare_digest(key.key_hash, hash_key(raw)):
            raise exceptions.AuthenticationFailed("Invalid API key.")
        if not key.is_active:
            raise exceptions.AuthenticationFailed("This API key has been revoked.")
        key.touch()
        key = _own_copy(key)
        return (key.created_by or _KeyUser(key), key)

    def authenticate_header(self, request):
        return self.keyword


@dataclass(frozen=True)
class _Resolved:
    key: ApiKey
    until: float  # time.monotonic()


_resolved: dict[str, _Resolved] = {}


def _key_by_prefix(prefix: str) -> ApiKey | None:
    """The key with this prefix, its project and creator loaded: from this process's cache
    while it is fresh, else from the database (active keys only are kept)."""
    found = _resolved.get(prefix)
    if found is not None and found.until > time.monotonic():
        return found.key
    key = ApiKey.objects.select_related("project", "created_by").filter(prefix=prefix).first()
    if key is not None and key.is_active:
        _resolved[prefix] = _Resolved(key, time.monotonic() + KEY_CACHE_SECONDS)
    return key


def _own_copy(key: ApiKey) -> ApiKey:
    # A request may change the instances it is handed (a service setting a project's field):
    # that must not leak into other requests through the cache.
    mine = copy.copy(key)
    mine.project = copy.copy(key.project)
    if key.created_by is not None:
        mine.created_by = copy.copy(key.created_by)
    return mine


def keys_forget(**_) -> None:
    """Drop every cached key: now, and again once the change commits (a thread that read the
    old row meanwhile may have cached it)."""
    _resolved.clear()
    transaction.on_commit(_resolved.clear)


for _model in (ApiKey, Project, get_user_model()):
    post_save.connect(keys_forget, sender=_model, dispatch_uid=f"keys_forget_save_{_model}")
    post_delete.connect(keys_forget, sender=_model, dispatch_uid=f"keys_forget_delete_{_model}")


class _KeyUser:
    """Stands in for a key whose creator was deleted: authenticated, but no person."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None
    username = "api-key"

    def __init__(self, key: ApiKey):
        self.key = key

    def __str__(self) -> str:
        return f"api key {self.key.prefix}"


def resolve_project(request) -> tuple[Project, str]:
    if isinstance(request.auth, ApiKey):
        return request.auth.project, request.auth.role
    user = request.user
    if not user.is_authenticated:
        raise exceptions.NotAuthenticated()
    slug = request.headers.get("X-Project") or request.query_params.get("project")
    slug = slug or request.session.get("project")
    projects = Project.objects.for_user(user)
    if slug:
        project = projects.filter(slug=slug).first()
    else:
        candidates = list(projects[:2])
        project = candidates[0] if len(candidates) == 1 else None
        if project is None:
            raise exceptions.ValidationError(
                {"project": ["Name a project with the X-Project header or ?project=<slug>."]}
            )
    if project is None:
        raise exceptions.NotFound("No such project.")
    return project, project.role_of(user)


class ProjectRolePermission(permissions.BasePermission):
    """The role ``evalsite.access`` sets for this URL and method (reads viewer, writes editor,
    a few more)."""

    def has_permission(self, request, view) -> bool:
        project, role = resolve_project(request)
        request.project, request.role = project, role
        needed = project_role_needed(request)
        if not role_allows(role, needed):
            raise exceptions.PermissionDenied(f"This needs the {needed} role in {project.slug}.")
        return True
