"""Demo content so the first page a newcomer sees is not empty. Idempotent: run it any time.

A capital-cities QA app: a testset whose rows hold five versions of the app's answers, evaluators
of several kinds (built-in checks, a Python code evaluator, human feedback), two finished
runs to read, drill into, annotate and compare, three more tagged ``branch: main`` whose
test-case history shows a stable, a flaky, a regressed and a fixed case, and an annotation
queue over the first run's answers: two reviewers' answers, one item adjudicated, one waiting
for an adjudicator, two waiting for the demo user's review (the second of theirs), gold labels
and the reliability records they give. Four conversations with a travel assistant (sent as
spans naming their session in each of the three ways) fill the Sessions pages.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evalsite.models import Project, Role
from evalsite.services import membership_set, project_create, user_get_or_create
from evaluators.models import Evaluator
from evaluators.services import evaluator_create
from runs import review
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import AnnotationQueue, Application, Run, Session, Testset
from runs.testsets import testset_create, testset_revise
from runs.traces import trace_ingest

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

# The answers of versions 3 to 5, run on branch main: their history (filtered by the tag
# branch:main) shows France stable, Turkey stable failing, Spain flaky, Germany regressed in
# v5 and Brazil fixed in v5 (v3 and v4 drop its accent).
LATER = {
    "Germany": ("Berlin", "Berlin", "Bonn"),
    "Spain": ("Madrid", "Barcelona", "Madrid"),
    "Brazil": ("Brasilia", "Brasilia", "Brasília"),
    "Turkey": ("Istanbul", "Istanbul", "Istanbul"),
}
LATER_VERSIONS = (("v3", "9f1c2e7"), ("v4", "a41d7b3"), ("v5", "c0ffee5"))


def _capital_rows() -> list[dict]:
    rows = []
    for country, capital, v1, v2 in CAPITALS:
        row = {
            "country": country,
            "question": f"What is the capital of {country}?",
            "correct_answer": capital,
            "outputs": v1,
            "outputs_v2": v2,
        }
        later = LATER.get(country, (capital,) * len(LATER_VERSIONS))
        for (version, _), answer in zip(LATER_VERSIONS, later, strict=True):
            row[f"outputs_{version}"] = answer
        rows.append(row)
    return rows


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
        "slug": "correct-answer",
        "name": "Correct answer",
        "kind": "human",
        "description": "A person's yes or no: does the answer name the capital?",
        "parameters": {
            "fields": [
                {"name": "correct", "type": "boolean", "description": "Names the capital"},
                {"name": "comment", "type": "string", "required": False},
            ]
        },
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
    _demo_queue(project, user)
    _demo_sessions(project)
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
        testset = testset_create(
            project=project,
            name="Capitals",
            slug="capitals",
            rows=_capital_rows(),
            author=user,
            description="Capital cities with the answers of five versions of the app.",
        )
    revisions = [
        e.head
        for e in Evaluator.objects.filter(
            project=project, kind__in=("exact_match", "regex", "similarity", "code")
        )
    ]
    for version, column in (("v1", "outputs"), ("v2", "outputs_v2")):
        _demo_run(project, user, testset, version, column, revisions)
    _demo_history(project, user, testset)


def _demo_run(project, user, testset, version, column, revisions, tags=None) -> None:
    name = f"Capital QA {version}"
    if Run.objects.filter(project=project, name=name).exists():
        return
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
        tags=tags,
    )
    run_execute_inline(run=run)


def _demo_history(project, user, testset) -> None:
    """Versions 3 to 5 on branch main, with the cheap evaluators only (no sandbox): the
    test-case history page's demo. A testset from an earlier demo gets their answers as a new
    version first."""
    if "outputs_v3" not in (testset.head.columns if testset.head else []):
        testset_revise(
            testset=testset,
            rows=_capital_rows(),
            message="Added the answers of versions 3 to 5",
            author=user,
        )
        testset.refresh_from_db()
    revisions = [
        e.head
        for e in Evaluator.objects.filter(
            project=project, kind__in=("exact_match", "regex", "similarity")
        )
    ]
    for version, commit in LATER_VERSIONS:
        tags = {"branch": "main", "commit": commit}
        _demo_run(project, user, testset, version, f"outputs_{version}", revisions, tags)


# A person would call an answer correct when it names the capital, whatever its case or the
# words around it: "nairobi" and "Lima, of course." are right, which exact matching misses.
DEMO_CORRECT_V1 = [True, True, False, True, False, False, True, False, True, False, True, True]
DEMO_REVIEWERS = ("rita", "remy")
DEMO_DISAGREE = {4: 1, 9: 0}  # item -> the reviewer who answers the opposite


def _demo_queue(project, user) -> None:
    if AnnotationQueue.objects.filter(project=project, slug="capital-answers").exists():
        return
    run = Run.objects.filter(project=project, name="Capital QA v1").first()
    human = Evaluator.objects.filter(project=project, slug="correct-answer").first()
    if run is None or human is None:
        return
    reviewers = []
    for name in DEMO_REVIEWERS:
        person = user_get_or_create(username=name)  # no password: they only hold reviews
        membership_set(project=project, user=person, role=Role.VIEWER)
        reviewers.append(person)
    queue = review.queue_create(
        project=project,
        name="Capital answers",
        slug="capital-answers",
        evaluator=human,
        reviewers_per_item=2,
        blind=True,
        reviewers=[*DEMO_REVIEWERS, user.username],
        adjudicators=[user.username],
        instructions="Is the answer **the capital** of the country asked about?\n\n"
        "- Case and extra words do not matter: *nairobi* is right.\n"
        "- An apology or another city is wrong.",
        author=user,
    )
    review.items_add_from_run(queue=queue, run=run, selection={"select": "all"})
    items = list(queue.items.order_by("position").select_related("scenario", "queue"))
    for item in items:
        index = item.scenario.index
        # The first two wait for a second review: the demo user's, on "Start reviewing".
        for r, person in enumerate(reviewers if index >= 2 else reviewers[:1]):
            correct = DEMO_CORRECT_V1[index] != (DEMO_DISAGREE.get(index) == r)
            review.review_submit(item=item, reviewer=person, outputs={"correct": correct})
    adjudicate = next(item for item in items if item.scenario.index == 4)
    adjudicate.refresh_from_db()
    review.item_adjudicate(
        item=adjudicate, adjudicator=user, outputs={"correct": False}, role=Role.OWNER
    )
    # What the background tasks would do a moment later, done now so the pages show it.
    review.queue_agreement_refresh(queue=queue)
    for step in run.steps.filter(revision__isnull=False).select_related("revision"):
        review.reliability_refresh(revision=step.revision, gold_evaluator=human)


# Conversations with the travel assistant, for the Sessions pages: (session id, how it names
# its session, how long ago it started, its turns as (user, assistant or None for a failure)).
DEMO_SESSIONS = [
    (
        "chat-7f3a-paris-trip",
        "session_id",
        timedelta(hours=2),
        [
            ("What is the capital of France?", "Paris is the capital of France."),
            (
                "How long is the train from there to Brussels?",
                "About 1 hour 22 minutes by Eurostar.",
            ),
            ("And is Brussels the capital of Belgium?", "Yes: Brussels is Belgium's capital."),
            ("Thanks! Which one has more museums?", "Paris, with about 130 museums."),
        ],
    ),
    (
        "chat-91c2-geography-quiz",
        "session.id",
        timedelta(days=1, hours=3),
        [
            ("Quiz me on capitals.", "Sure. What is the capital of Australia?"),
            ("Sydney?", "Not quite: it is Canberra. Next: the capital of Canada?"),
            ("Ottawa.", "Correct! Next: the capital of Turkey?"),
            ("Istanbul.", "Close, but it is Ankara. Last one: the capital of Kenya?"),
            ("Nairobi.", "Right! You scored 2 out of 4."),
        ],
    ),
    (
        "chat-b4e0-support",
        "session.id",
        timedelta(days=2, hours=5),
        [
            ("Book me a flight to the capital of Peru.", "Lima it is. Which dates?"),
            ("Next Friday, back on Sunday.", None),
            ("Did that work?", "Sorry, the booking service failed. Please try again later."),
        ],
    ),
    (
        "conv-5d18e2",
        "gen_ai.conversation.id",
        timedelta(days=4),
        [
            ("Was Bonn ever the capital of Germany?", "Yes, of West Germany from 1949 to 1990."),
            ("And now?", "Berlin has been the capital since reunification in 1990."),
        ],
    ),
]


def _demo_sessions(project) -> None:
    """Multi-turn conversations sent as spans, as an instrumented chat application would."""
    if Session.objects.filter(project=project, session_id=DEMO_SESSIONS[0][0]).exists():
        return
    now = timezone.now()
    spans: list[dict] = []
    for session_id, field, ago, turns in reversed(DEMO_SESSIONS):  # oldest first, as they came
        start = now - ago
        for n, (question, answer) in enumerate(turns):
            spans.extend(_demo_turn(session_id, field, n, start, question, answer))
            start += timedelta(seconds=40 + 17 * n)
    trace_ingest(project=project, spans=spans)


def _demo_turn(session_id, field, n, start, question, answer) -> list[dict]:
    trace_id = f"demo-{session_id}-{n + 1}"
    named = {"session_id": session_id} if field == "session_id" else {}
    attributes = {} if named else {field: session_id}
    tokens_in, tokens_out = 60 + 45 * n, len(answer or "") // 4 + 5
    end = start + timedelta(milliseconds=700 + 130 * len(question) % 900)
    root = {
        "trace_id": trace_id,
        "span_id": f"{trace_id}-root",
        "name": "travel_assistant",
        "kind": "workflow",
        "start_time": start.isoformat(),
        "end_time": end.isoformat(),
        "attributes": {
            "ag": {"data": {"inputs": {"question": question}, "outputs": answer}},
            **attributes,
        },
        **named,
    }
    llm = {
        "trace_id": trace_id,
        "span_id": f"{trace_id}-llm",
        "parent_id": root["span_id"],
        "name": "chat gpt-4o-mini",
        "kind": "llm",
        "start_time": (start + timedelta(milliseconds=40)).isoformat(),
        "end_time": (end - timedelta(milliseconds=20)).isoformat(),
        "attributes": {
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": tokens_out,
            "ag": {
                "metrics": {
                    "unit": {"costs": {"total": (tokens_in * 0.15 + tokens_out * 0.6) / 1e6}}
                }
            },
        },
    }
    if answer is None:  # the booking tool failed, and the turn with it
        root["status"] = "error"
        root["status_message"] = "booking service: 503 Service Unavailable"
        tool = {
            **llm,
            "span_id": f"{trace_id}-tool",
            "name": "book_flight",
            "kind": "tool",
            "status": "error",
            "status_message": "503 Service Unavailable",
            "attributes": {"ag": {"data": {"inputs": {"to": "LIM", "out": "Fri", "back": "Sun"}}}},
        }
        return [root, llm, tool]
    return [root, llm]
