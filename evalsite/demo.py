"""Demo content so the first page a newcomer sees is not empty. Idempotent: run it any time.

A capital-cities QA app: a testset whose rows hold two versions of the app's answers, evaluators
of several kinds (built-in checks, a Python code evaluator, human feedback), and two finished
runs to read, drill into, annotate and compare.
"""

from __future__ import annotations

from django.db import transaction

from evalsite.errors import InvalidInput
from evalsite.models import Project, Role
from evalsite.services import membership_set, project_create, user_get_or_create
from evaluators.models import Evaluator
from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Application, Run, Testset
from runs.testsets import testset_create

DEMO_USER = "demo"
DEMO_PASSWORD = "demo"  # noqa: S105 (a local demo login, printed by the run command)
DEMO_PROJECT = "demo"

CAPITALS = [
    ("France", "Paris", "Paris", "Paris"),
    ("Germany", "Berlin", "Berlin", "Berlin"),
    ("Italy", "Rome", "Milan", "Rome"),
    ("Spain", "Madrid", "Madrid", "Madrid"),
    ("Australia", "Canberra", "Sydney", "Canberra"),
    ("Canada", "Ottawa", "Toronto", "Ottawa"),
    ("Japan", "Tokyo", "Tokyo", "Tokyo"),
    ("Brazil", "Brasília", "I'm sorry, I don't know.", "Brasília"),
    ("Egypt", "Cairo", "Cairo", "Cairo"),
    ("Turkey", "Ankara", "Istanbul", "Istanbul"),
    ("Kenya", "Nairobi", "nairobi", "Nairobi"),
    ("Peru", "Lima", "Lima, of course.", "Lima"),
]

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
    {
        "slug": "close-enough",
        "name": "Close enough",
        "kind": "similarity",
        "description": "Levenshtein similarity to the capital of at least 0.8.",
        "parameters": {"method": "levenshtein", "threshold": 0.8},
    },
    {
        "slug": "answer-quality",
        "name": "Answer quality (Python)",
        "kind": "code",
        "preset": "multi_metric",
        "description": "A custom Python evaluator returning several metrics: score, success, label, length.",
    },
    {
        "slug": "reviewer-stars",
        "name": "Reviewer stars",
        "kind": "human",
        "preset": "five_stars",
        "description": "People rate each answer from 1 to 5.",
    },
]


@transaction.atomic
def demo_load() -> Project:
    user = user_get_or_create(username=DEMO_USER, password=DEMO_PASSWORD)
    if user.is_staff or user.is_superuser:
        # Its password is printed on every start: an ordinary owner of the demo project, never
        # staff (earlier versions made it a superuser; loading the demo again takes that back).
        user.is_staff = user.is_superuser = False
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
    _demo_runs(project, user)
    return project


def _demo_evaluators(project, user) -> None:
    for spec in DEMO_EVALUATORS:
        if Evaluator.objects.filter(project=project, slug=spec["slug"]).exists():
            continue
        try:
            evaluator_create(project=project, author=user, **spec)
        except InvalidInput:
            continue  # the code sandbox is unavailable here; the code evaluator page says why


def _demo_runs(project, user) -> None:

    testset = Testset.objects.filter(project=project, slug="capitals").first()
    if testset is None:
        rows = [
            {
                "country": c,
                "question": f"What is the capital of {c}?",
                "correct_answer": capital,
                "outputs": v1,
                "outputs_v2": v2,
            }
            for c, capital, v1, v2 in CAPITALS
        ]
        testset = testset_create(
            project=project,
            name="Capitals",
            slug="capitals",
            rows=rows,
            author=user,
            description="Capital cities with the answers of two versions of the app.",
        )
    revisions = [
        e.head
        for e in Evaluator.objects.filter(
            project=project, kind__in=("exact_match", "regex", "similarity", "code")
        )
    ]
    for version, column in (("v1", "outputs"), ("v2", "outputs_v2")):
        name = f"Capital QA {version}"
        if Run.objects.filter(project=project, name=name).exists():
            continue
        app = Application.objects.filter(
            project=project, slug=f"capital-qa-{version}"
        ).first() or application_create(
            project=project,
            name=f"Capital QA {version}",
            slug=f"capital-qa-{version}",
            kind="column",
            config={"outputs_column": column},
        )
        run = run_create(
            project=project,
            name=name,
            testset_version=testset.head,
            application=app,
            revisions=revisions,
            author=user,
        )
        run_execute_inline(run=run)
