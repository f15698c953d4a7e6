from evalsite.models import Project


def navigation(request):
    """The project switcher's choices and the current project for the layout."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {
        "nav_projects": Project.objects.for_user(request.user).only("slug", "name"),
        "current_project": getattr(request, "project", None),
        "current_role": getattr(request, "role", None),
    }
