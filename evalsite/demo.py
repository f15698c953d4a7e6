"""Demo content so the first page a newcomer sees is not empty. Idempotent: run it any time."""

from __future__ import annotations

from django.db import transaction

from evalsite.models import Project, Role
from evalsite.services import membership_set, project_create, user_get_or_create

DEMO_USER = "demo"
DEMO_PASSWORD = "demo"  # noqa: S105 (a local demo login, printed by the run command)
DEMO_PROJECT = "demo"


@transaction.atomic
def demo_load() -> Project:
    user = user_get_or_create(username=DEMO_USER, password=DEMO_PASSWORD)
    if not user.is_staff:
        user.is_staff = user.is_superuser = True
        user.save(update_fields=["is_staff", "is_superuser"])
    project = Project.objects.filter(slug=DEMO_PROJECT).first()
    if project is None:
        project = project_create(
            name="Demo",
            slug=DEMO_PROJECT,
            owner=user,
            description="A capital-cities QA app, its testset, evaluators and runs.",
        )
    membership_set(project=project, user=user, role=Role.OWNER)
    _demo_evaluators(project, user)
    return project


def _demo_evaluators(project, user) -> None:
    from evaluators.models import Evaluator
    from evaluators.services import evaluator_create

    for spec in DEMO_EVALUATORS:
        if not Evaluator.objects.filter(project=project, slug=spec["slug"]).exists():
            evaluator_create(project=project, author=user, **spec)


DEMO_EVALUATORS: list[dict] = [
    {
        "slug": "exact-answer",
        "name": "Exact answer",
        "kind": "exact_match",
        "description": "The answer is the capital, letter for letter (case-insensitive).",
        "parameters": {"case_sensitive": False},
    },
    {
        "slug": "no-apology",
        "name": "No apology",
        "kind": "regex",
        "preset": "no_apology",
        "description": "The app answers instead of apologising.",
    },
]
