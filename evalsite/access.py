"""Who may do what: the least role each URL of the site needs, per kind of method.

This table is what the checks enforce, not a description of them: ``project_view`` (pages) and
``ProjectRolePermission`` (the API) look the request's URL name up here. A URL missing from it is
refused with an ``ImproperlyConfigured`` error instead of guessed, and
``tests/security/test_roles.py`` walks every URL pattern of the site with each role against it.

The rule: reading saved things needs viewer. Anything that writes, or that executes or spends
without writing (runs code, renders a template or judge script, calls a webhook, an application
or a model, queues work), needs editor, with one exception DOMAIN.md states: viewers review (and
adjudicate) in annotation queues that list them, and the review services check the list. Owners
alone manage API keys. The levels outside a
project (anonymous, authenticated, staff) are enforced by Django where they apply (login
redirects, the admin site); the table states them so that the test holds them too.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from evalsite.models import Role

ANONYMOUS = "anonymous"
AUTHENTICATED = "authenticated"  # logged in, whatever their projects
STAFF = "staff"  # Django's is_staff: the admin site
VIEWER, EDITOR, OWNER = Role.VIEWER.value, Role.EDITOR.value, Role.OWNER.value
PROJECT_ROLES = (VIEWER, EDITOR, OWNER)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Rule:
    """``read`` covers GET, HEAD and OPTIONS; ``write`` every other method. ``None``: the URL
    answers no such method (405). A write to a URL that only reads still needs editor: a viewer
    never gets a write through, whatever a view does with it."""

    read: str | None
    write: str | None
    note: str = ""

    def needed(self, method: str) -> str:
        if method in SAFE_METHODS:
            return self.read or self.write or OWNER
        if self.write:
            return self.write
        return EDITOR if self.read == VIEWER else self.read or OWNER


def _rule(read: str | None, write: str | None = None, note: str = "") -> Rule:
    return Rule(read, write, note)


READ = _rule(VIEWER)
READ_WRITE = _rule(VIEWER, EDITOR)
EDIT = _rule(None, EDITOR)
EDIT_FORM = _rule(EDITOR, EDITOR, "a form that only creates or edits")
EXECUTES = "runs the evaluator: code, a template, a webhook or a model"
REVIEWS = "a reviewer of the queue reviews (viewers included); the service checks the list"
ADJUDICATES = "an adjudicator of the queue settles an item; the service checks the list"

ACCESS: dict[str, Rule] = {
    # --- outside any project
    "home": _rule(AUTHENTICATED),
    "login": _rule(ANONYMOUS, ANONYMOUS),
    "logout": _rule(ANONYMOUS, ANONYMOUS),
    "project-list": _rule(AUTHENTICATED, AUTHENTICATED, "anyone logged in may create a project"),
    "project-go": _rule(AUTHENTICATED),
    "healthz": _rule(ANONYMOUS),
    "schema": _rule(ANONYMOUS, note="the OpenAPI schema: no project data"),
    "api-docs": _rule(ANONYMOUS, note="the OpenAPI schema: no project data"),
    "admin:*": _rule(STAFF, STAFF, "Django's admin site"),
    "admin:login": _rule(ANONYMOUS, ANONYMOUS),
    "admin:logout": _rule(ANONYMOUS, ANONYMOUS),
    # --- project pages
    "project-home": READ,
    "project-settings": _rule(VIEWER, OWNER, "members see members and key names, never a key"),
    "project-spend-cap": _rule(None, OWNER),
    "project-trace-retention": _rule(None, OWNER),
    "project-retention": _rule(OWNER, note="the retention dry run: counts, changes nothing"),
    "api-key-revoke": _rule(None, OWNER),
    "evaluator-list": READ,
    "evaluator-new": _rule(EDITOR, EDITOR, "also the code playground, which runs code"),
    "evaluator-detail": READ_WRITE,
    "evaluator-save": _rule(None, EDITOR, "also runs the example cases"),
    "evaluator-archive": EDIT,
    "evaluator-try": _rule(VIEWER, EDITOR, EXECUTES),
    "evaluator-diff": READ,
    "connection-list": READ,
    "connection-new": EDIT_FORM,
    "connection-detail": READ_WRITE,
    "connection-test": _rule(None, EDITOR, "calls the model"),
    "connection-delete": EDIT,
    "run-compare": READ,
    "run-compare-export": READ,
    "run-export": READ,
    "testset-list": READ,
    "testset-new": EDIT_FORM,
    "testset-detail": READ,
    "testset-update": EDIT,
    "testset-delete": EDIT_FORM,
    "testset-export": READ,
    "testset-history": READ,
    "testset-row-add": EDIT,
    "testset-row-edit": EDIT,
    "testset-row-delete": EDIT,
    "trace-list": READ,
    "trace-detail": READ,
    "session-list": READ,
    "session-detail": READ,
    "replay-new": _rule(EDITOR, EDITOR, "starts runs that call the application and evaluators"),
    "replay-detail": READ,
    "run-list": READ,
    "run-new": EDIT_FORM,
    "run-estimate": _rule(None, EDITOR, "renders the judges' prompts for a sample of rows"),
    "run-detail": READ,
    "run-progress": READ,
    "run-cancel": EDIT,
    "run-retry": EDIT,
    "run-close": EDIT,
    "run-metrics-refresh": _rule(None, EDITOR, "queues work"),
    "run-add-evaluator": EDIT,
    "application-list": READ_WRITE,
    "scenario-detail": READ,
    "scenario-annotate": _rule(None, EDITOR, "an annotation replaces a cell of the run"),
    "online-rule-list": READ,
    "online-rule-new": EDIT_FORM,
    "online-rule-detail": READ,
    "online-rule-edit": EDIT_FORM,
    "online-rule-pause": EDIT,
    "online-rule-resume": EDIT,
    "online-rule-backfill": _rule(None, EDITOR, "queues evaluations"),
    "online-rule-delete": EDIT,
    "schema-list": READ,
    "schema-detail": READ_WRITE,
    "schema-progress": READ,
    # annotation queues: reviewing is open to viewers; the services check that the person is a
    # reviewer (or adjudicator) of the queue, and a reservation or review is all it writes.
    "queue-list": READ,
    "queue-new": EDIT_FORM,
    "queue-detail": READ,
    "queue-edit": EDIT_FORM,
    "queue-items-add": EDIT_FORM,
    "queue-item-detail": READ,
    "queue-review": _rule(VIEWER, VIEWER, REVIEWS),
    "queue-review-item": _rule(VIEWER, VIEWER, REVIEWS),
    "queue-adjudicate": _rule(VIEWER, VIEWER, ADJUDICATES),
    "queue-adjudicate-item": _rule(VIEWER, VIEWER, ADJUDICATES),
    "queue-gold-export": READ,
    "queue-gold-testset": EDIT,
    "scenario-queue-add": EDIT,
    "reliability-refresh": _rule(None, EDITOR, "queues work"),
    "alignment-new": _rule(EDITOR, EDITOR, "spends model credit"),
    "alignment-detail": READ,
    "alignment-accept": EDIT,
    "alignment-discard": EDIT,
    # --- API
    "api-project": _rule(
        VIEWER, OWNER, "PATCH sets the project's spend cap per run and its trace retention"
    ),
    "api-project-retention": _rule(OWNER, note="the retention dry run: counts, changes nothing"),
    "api-key-list": _rule(OWNER, OWNER),
    "api-key-detail": _rule(OWNER, OWNER),
    "kind-list": READ,
    "kind-detail": READ,
    "revision-detail": READ,
    "evaluator-invoke": _rule(None, EDITOR, EXECUTES),
    "llm-judge-render": _rule(None, EDITOR, "renders a template or runs a judge script"),
    "api-evaluator-list": READ_WRITE,
    "api-evaluator-detail": READ_WRITE,
    "api-evaluator-revisions": READ,
    "api-model-connection-list": READ_WRITE,
    "api-model-connection-detail": READ_WRITE,
    "api-model-connection-test": _rule(None, EDITOR, "calls the model"),
    "api-run-compare": READ,
    "api-run-compare-export": READ,
    "api-run-export": READ,
    "api-testset-list": READ_WRITE,
    "api-testset-detail": READ_WRITE,
    "api-testset-export": READ,
    "api-testset-history": READ,
    "api-testset-row": READ_WRITE,
    "api-testset-rows": READ_WRITE,
    "api-testset-versions": READ,
    "api-trace-list": _rule(VIEWER, EDITOR, "POST ingests traces"),
    "api-trace-detail": READ,
    "api-session-list": READ,
    "api-session-detail": READ,
    "api-otlp-traces": _rule(None, EDITOR, "ingests traces"),
    "api-replays": _rule(None, EDITOR, "starts runs that call the application and evaluators"),
    "api-applications": READ_WRITE,
    "api-runs": _rule(VIEWER, EDITOR, "POST calls the application and the evaluators"),
    "api-run": READ_WRITE,
    "api-run-start": EDIT,
    "api-run-cancel": EDIT,
    "api-run-retry": EDIT,
    "api-run-close": EDIT,
    "api-run-evaluators": EDIT,
    "api-run-scenarios": READ_WRITE,
    "api-run-results": READ_WRITE,
    "api-run-metrics": READ,
    "api-run-metrics-refresh": _rule(None, EDITOR, "queues work"),
    "api-annotations": READ_WRITE,
    "api-online-rules": READ_WRITE,
    "api-online-rule": READ_WRITE,
    "api-online-rule-pause": EDIT,
    "api-online-rule-resume": EDIT,
    "api-online-rule-backfill": _rule(None, EDITOR, "queues evaluations"),
    "api-schema-candidates": READ,
    "api-revision-schema": READ_WRITE,
    "api-queues": READ_WRITE,
    "api-queue": READ_WRITE,
    "api-queue-items": READ_WRITE,
    "api-queue-next": _rule(None, VIEWER, REVIEWS),
    "api-queue-item": READ,
    "api-queue-item-review": _rule(None, VIEWER, REVIEWS),
    "api-queue-item-adjudicate": _rule(None, VIEWER, ADJUDICATES),
    "api-queue-agreement": READ,
    "api-queue-gold": READ,
    "api-queue-gold-testset": EDIT,
    "api-reliability": READ,
    "api-reliability-refresh": _rule(None, EDITOR, "queues work"),
    "api-alignments": _rule(VIEWER, EDITOR, "POST spends model credit"),
    "api-alignment": READ,
    "api-alignment-accept": EDIT,
    "api-alignment-discard": EDIT,
}


def rule_for(view_name: str) -> Rule:
    """The rule of a URL name (``namespace:name`` inside a namespace)."""
    namespace, _, _ = view_name.rpartition(":")
    rule = ACCESS.get(view_name) or (ACCESS.get(f"{namespace}:*") if namespace else None)
    if rule is None:
        raise ImproperlyConfigured(f"URL {view_name!r} has no entry in evalsite.access.ACCESS.")
    return rule


def project_role_needed(request) -> str:
    """The project role this request needs, from its URL name and method."""
    match = request.resolver_match
    needed = rule_for(match.view_name if match else "").needed(request.method)
    if needed not in PROJECT_ROLES:
        raise ImproperlyConfigured(f"{match.view_name!r} is not a project URL ({needed}).")
    return needed
