"""REST authentication and the project/role check every API view goes through.

An API key names its project. A browser session names one with the ``X-Project`` header or the
``project`` query parameter, else the project chosen last in the UI, else the user's only one.
The resolved project and role land on ``request.project`` / ``request.role``; querysets are then
scoped with ``for_project(request.project)``, so another project's ids are simply not found (404).
"""

from __future__ import annotations

import hmac

from rest_framework import authentication, exceptions, permissions

from evalsite.access import project_role_needed
from evalsite.models import ApiKey, Project, hash_key, role_allows


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
        key = ApiKey.objects.select_related("project", "created_by").filter(prefix=parts[1]).first()
        if key is None or not hmac.compare_digest(key.key_hash, hash_key(raw)):
            raise exceptions.AuthenticationFailed("Invalid API key.")
        if not key.is_active:
            raise exceptions.AuthenticationFailed("This API key has been revoked.")
        key.touch()
        return (key.created_by or _KeyUser(key), key)

    def authenticate_header(self, request):
        return self.keyword


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
