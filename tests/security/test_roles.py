"""Roles mean what they say: every URL pattern of the site, with every role, against the table
in ``evalsite.access``.

The cast: the project's owner, editor and viewer (pages through a session, the API through a key
of that role), an outsider who owns another project only (their own key; a session naming our
project), anonymous, and staff for the admin site. One set of real objects (evaluators, a
finished run with scenarios and traces, a testset, an application, a model connection, an
online rule, an API key) is built once for the module; each test runs in a savepoint that is
rolled back, so an allowed delete does not take them from the next test.

A denied write must change no row anywhere (every model's table, row by row). Write requests
send a body that an allowed role gets through (``VALID``): a refusal is then the permission, not
bad input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from evalsite.access import (
    ACCESS,
    ADJUDICATES,
    ANONYMOUS,
    AUTHENTICATED,
    PROJECT_ROLES,
    REVIEWS,
    STAFF,
    rule_for,
)
from evalsite.models import ROLE_RANK, Role
from evalsite.services import api_key_create, membership_set, project_create, user_get_or_create
from evaluators.judge.connections import model_connection_create
from evaluators.services import evaluator_create, evaluator_revise
from runs import review
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import JudgeAlignment, Session, Trace
from runs.online import online_rule_create, replay_create
from runs.traces import trace_ingest
from tests.runs.factories import CAPITALS, make_testset

SLUG, OTHER = "roles", "roles-other"
MARK = "zqx"  # in the names of our objects: an outsider's answer must never contain it
METHODS = ("get", "post", "put", "patch", "delete")


# --- the URL patterns --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    name: str  # the view name (namespace:name), "" when the pattern has none
    route: str
    groups: tuple[str, ...]
    methods: tuple[str, ...]

    @property
    def is_api(self) -> bool:
        return self.route.startswith("api/v1/")

    @property
    def is_admin(self) -> bool:
        return self.route.startswith("admin/")


def _methods(callback, route: str) -> tuple[str, ...]:
    actions = getattr(callback, "actions", None)
    if actions:  # a DRF viewset: the router says which methods exist
        return tuple(m for m in METHODS if m in actions)
    cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if route.startswith("api/v1/") and cls is not None:
        return tuple(m for m in METHODS if hasattr(cls, m))
    if route.startswith("admin/"):
        return ("get",)
    return ("get", "post")  # pages: GET shows, POST acts (require_POST answers 405 to GET)


def _walk(resolver, prefix="", namespace="", groups=()):
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        found = groups + tuple(entry.pattern.regex.groupindex)
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _walk(entry, route, inner, found)
        elif isinstance(entry, URLPattern):
            name = f"{namespace}{entry.name}" if entry.name else ""
            if not name and namespace:
                name = f"{namespace}<unnamed>"
            yield Endpoint(name, route, found, _methods(entry.callback, route))


ENDPOINTS = list(_walk(get_resolver()))


def test_every_url_pattern_has_an_entry_in_the_table():
    missing = []
    for endpoint in ENDPOINTS:
        try:
            rule_for(endpoint.name)
        except Exception:
            missing.append(endpoint.route)
    assert missing == [], "Add these URLs to evalsite.access.ACCESS"


def test_the_table_names_no_url_that_does_not_exist():
    names = {e.name for e in ENDPOINTS}
    stale = [n for n in ACCESS if not n.endswith(":*") and n not in names]
    assert stale == []


# --- the world -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """Everything the URLs name, committed nowhere: one outer transaction for the module."""
    with django_db_blocker.unblock(), transaction.atomic():
        data = _build()
        yield data
        transaction.set_rollback(True)


def _build() -> dict[str, Any]:
    owner = user_get_or_create(username="roles-owner", password="pw-roles-1234")
    project = project_create(name=f"Roles {MARK}", slug=SLUG, owner=owner)
    editor = user_get_or_create(username="roles-editor", password="pw-roles-1234")
    viewer = user_get_or_create(username="roles-viewer", password="pw-roles-1234")
    membership_set(project=project, user=editor, role=Role.EDITOR)
    membership_set(project=project, user=viewer, role=Role.VIEWER)
    outsider = user_get_or_create(username="roles-outsider", password="pw-roles-1234")
    other = project_create(name="Roles other", slug=OTHER, owner=outsider)
    staff = get_user_model().objects.create_superuser("roles-staff", "", "pw-roles-1234")
    keys = {
        role: api_key_create(project=project, name=f"{role} {MARK}", created_by=user, role=role)[1]
        for role, user in (("owner", owner), ("editor", editor), ("viewer", viewer))
    }
    keys["outsider"] = api_key_create(project=other, name="o", created_by=outsider, role="owner")[1]
    spare_key, _ = api_key_create(project=project, name=f"spare {MARK}", created_by=owner)

    exact = evaluator_create(project=project, kind="exact_match", name=f"Exact {MARK}")
    evaluator_revise(evaluator=exact, description="v2", author=owner)
    similar = evaluator_create(
        project=project, kind="similarity", name=f"Similar {MARK}", parameters={"threshold": 0.5}
    )
    version = make_testset(project, CAPITALS, slug=f"capitals-{MARK}")
    spare = make_testset(project, CAPITALS, slug=f"spare-{MARK}")
    app = application_create(
        project=project, name=f"Column {MARK}", kind="column", config={"outputs_column": "outputs"}
    )
    runs = [
        run_execute_inline(
            run=run_create(
                project=project,
                name=f"Run {n} {MARK}",
                testset_version=version,
                application=app,
                revisions=[exact.head],
            )
        )
        for n in (1, 2)
    ]
    with override_settings(EVALSITE_MODELS_ALLOW_PRIVATE=True):
        conn = model_connection_create(
            project=project,
            name=f"Conn {MARK}",
            base_url="http://127.0.0.1:9/v1",  # the discard port: refused at once
            model_names=["judge-1"],
            timeout_seconds=1.0,
        )
    rule = online_rule_create(
        project=project, name=f"Rule {MARK}", revision=exact.head, filter={"name": "x"}
    )
    trace = Trace.objects.filter(project=project).order_by("id").first()
    session = _session(project)
    endpoint = application_create(  # the discard port: never called (nothing commits)
        project=project, name=f"Endpoint {MARK}", kind="http", config={"url": "http://127.0.0.1:9/"}
    )
    replay = replay_create(project=project, application=endpoint, evaluators=[exact.head])
    queue, items = _queue(project, runs[0], owner, editor, viewer)
    alignment = JudgeAlignment.objects.create(  # finished: accept and discard get through
        project=project, base=exact.head, candidate=exact.head, queue=queue, status="done"
    )
    sessions = {}
    for who, user in (("owner", owner), ("editor", editor), ("viewer", viewer)):
        sessions[who] = _session_of(user)
    sessions["outsider"], sessions["staff"] = _session_of(outsider), _session_of(staff)
    return {
        "sessions": sessions,
        "project": project,
        "users": {"owner": owner, "editor": editor, "viewer": viewer, "outsider": outsider},
        "staff": staff,
        "keys": keys,
        "spare_key": spare_key,
        "exact": exact,
        "similar": similar,
        "testset": version.testset,
        "spare_testset": spare.testset,
        "app": app,
        "runs": runs,
        "conn": conn,
        "rule": rule,
        "trace": trace,
        "session": session,
        "endpoint": endpoint,
        "replay": replay,
        "queue": queue,
        "items": items,
        "alignment": alignment,
    }


def _session(project) -> Session:
    """A conversation of two traces naming one session."""
    trace_ingest(
        project=project,
        spans=[
            {
                "trace_id": f"chat-{n}",
                "span_id": "root",
                "name": f"chat {MARK}",
                "start_time": f"2026-11-20T10:0{n}:00Z",
                "session_id": f"session-{MARK}",
                "attributes": {"ag": {"data": {"inputs": "hi", "outputs": "hello"}}},
            }
            for n in (1, 2)
        ],
    )
    return Session.objects.get(project=project)


def _queue(project, run, owner, editor, viewer):
    """An annotation queue everyone reviews and adjudicates: item 0 open, item 1 waiting for
    an adjudicator (the owner and the editor disagreed)."""
    form = evaluator_create(
        project=project,
        kind="human",
        name=f"Review {MARK}",
        parameters={"fields": [{"name": "correct", "type": "boolean"}]},
    )
    queue = review.queue_create(
        project=project,
        name=f"Queue {MARK}",
        evaluator=form,
        adjudicators=[owner.username, editor.username, viewer.username],
    )
    review.items_add_from_run(queue=queue, run=run)
    items = list(queue.items.order_by("position"))
    review.review_submit(item=items[1], reviewer=owner, outputs={"correct": True})
    review.review_submit(item=items[1], reviewer=editor, outputs={"correct": False})
    return queue, {"open": items[0], "adjudication": items[1]}


def _session_of(user) -> str:
    """A logged-in session made once: each test's client carries its cookie (cheaper than a
    login per test, and a test that logs out deletes the row only inside its savepoint)."""
    client = Client()
    client.force_login(user)
    return client.cookies[django_settings.SESSION_COOKIE_NAME].value


def _kwargs(endpoint: Endpoint, w) -> dict[str, Any]:
    name = endpoint.name
    run = w["runs"][0]
    ref = w["exact"].slug
    if "connection" in name:
        ref = w["conn"].slug
    elif "testset" in name:  # one no run uses, so that it may be deleted
        ref = w["spare_testset"].slug
    elif "schema" in name or name == "revision-detail":
        ref = w["exact"].head.slug
    values = {
        "slug": SLUG,
        "ref": ref,
        "run_id": run.pk,
        "index": 0,
        "rule_id": w["rule"].pk,
        "trace_id": w["trace"].trace_id,
        "session_id": w["session"].session_id,
        "key_id": w["spare_key"].pk,
        "pk": w["spare_key"].pk,
        "key": "exact_match",
        "app_label": "evalsite",
        "object_id": w["project"].pk,
        "id": w["users"]["owner"].pk,
        "content_type_id": 1,
        "url": "nothing-here/",
        "queue_ref": w["queue"].slug,
        "item_id": w["items"]["adjudication" if "adjudicate" in name else "open"].pk,
        "alignment_id": w["alignment"].pk,
        "evaluator_ref": w["exact"].slug,
        "replay_id": w["replay"].id,
    }
    if name == "session-detail":  # the page names a session by pk, the API by its id
        values["pk"] = w["session"].pk
    return {group: values[group] for group in endpoint.groups}


def _url(endpoint: Endpoint, w) -> str:
    if endpoint.name.endswith("<unnamed>"):
        return "/admin/nothing-here/"
    url = reverse(endpoint.name, kwargs=_kwargs(endpoint, w))
    if endpoint.name in ("run-compare", "run-compare-export", "api-run-compare"):
        url += f"?runs={w['runs'][0].pk},{w['runs'][1].pk}"
    if endpoint.name == "evaluator-diff":
        url += "?a=1&b=1"
    if endpoint.name == "api-run-compare-export":
        url += f"?runs={w['runs'][0].pk},{w['runs'][1].pk}&format=csv"
    return url


# --- bodies that get through for a role that may --------------------------------------------


def _page_bodies(w) -> dict[str, Any]:
    exact, run = w["exact"], w["runs"][0]
    step = run.steps.filter(revision__isnull=False).first()
    head = w["spare_testset"].head
    return {
        "project-list": {"name": "New one", "slug": "new-one"},
        "project-settings": {"name": "ci", "role": "viewer"},
        "api-key-revoke": {},
        "evaluator-new": {"kind": "exact_match", "name": "Made here"},
        "evaluator-save": {"message": "tweak", "p__case_sensitive": "on"},
        "evaluator-archive": {},
        "evaluator-try": {"inputs": "{}", "outputs": '"Paris"', "trace": ""},
        "connection-new": {
            "name": "Made",
            "base_url": "https://104.18.7.192/v1",
            "rate_limit_rpm": "10",
            "timeout_seconds": "1",
        },
        "connection-detail": {
            "name": "Renamed",
            "slug": w["conn"].slug,
            "base_url": "https://104.18.7.192/v1",
            "rate_limit_rpm": "10",
            "timeout_seconds": "1",
        },
        "connection-test": {},
        "connection-delete": {},
        "testset-new": {"name": "Pasted", "text": "a,b\n1,2\n", "format": "csv"},
        "testset-update": {"name": "Renamed"},
        "testset-delete": {},
        "testset-row-add": {"data": json.dumps(CAPITALS[0]), "base_version": head.version},
        "testset-row-edit": {"data": json.dumps(CAPITALS[1]), "base_version": head.version},
        "testset-row-delete": {"base_version": head.version},
        "replay-new": {"application": w["endpoint"].pk, "evaluators": [exact.pk], "limit": "10"},
        "run-new": {
            "name": "Made",
            "testset": w["testset"].pk,
            "application": w["app"].pk,
            "evaluators": [exact.pk],
            "repeats": 1,
        },
        "run-estimate": {
            "testset": w["testset"].pk,
            "application": w["app"].pk,
            "evaluators": [exact.pk],
            "repeats": 1,
        },
        "project-spend-cap": {"max_run_cost_usd": "5"},
        "project-trace-retention": {"trace_retention_days": "30"},
        "run-cancel": {},
        "run-retry": {},
        "run-close": {},
        "run-metrics-refresh": {},
        "run-add-evaluator": {"evaluators": [w["similar"].pk]},
        "application-list": {"name": "Made", "kind": "column", "config": '{"outputs_column": "x"}'},
        "scenario-annotate": {"evaluator": exact.pk, f"s{step.pk}-success": "on"},
        "online-rule-new": {
            "name": "Made",
            "evaluator": exact.pk,
            "sampling_percent": "100",
            "bucket_seconds": "3600",
        },
        "online-rule-edit": {"name": "Renamed", "sampling_percent": "50", "bucket_seconds": "3600"},
        "online-rule-pause": {},
        "online-rule-resume": {},
        "online-rule-backfill": {"since": "2020-01-01T00:00"},
        "online-rule-delete": {},
        "schema-detail": {"schema": json.dumps(exact.head.outputs_schema or {"type": "object"})},
        "queue-new": {
            "name": "Made",
            "evaluator": w["queue"].evaluator_id,
            "reviewers_per_item": "2",
            "min_agreement": "1",
            "reservation_minutes": "15",
        },
        "queue-edit": {
            "name": "Renamed",
            "reviewers_per_item": "2",
            "min_agreement": "1",
            "reservation_minutes": "15",
        },
        "queue-items-add": {"run": w["runs"][1].pk, "select": "all"},
        "queue-review-item": {"action": "skip"},
        "queue-adjudicate-item": {"f-correct": "true"},
        "queue-gold-testset": {"testset": w["testset"].pk, "prefix": "gold_"},
    }


def _api_bodies(w) -> dict[tuple[str, str], Any]:
    exact = w["exact"]
    head = w["spare_testset"].head
    return {
        ("api-key-list", "post"): {"name": "ci", "role": "viewer"},
        ("evaluator-invoke", "post"): {"evaluator": str(exact.pk), "outputs": "Paris"},
        ("llm-judge-render", "post"): {
            "parameters": {"connection": w["conn"].slug},
            "inputs": {"question": "Q", "correct_answer": "A"},
        },
        ("api-evaluator-list", "post"): {"name": "Made", "kind": "exact_match"},
        ("api-evaluator-detail", "put"): {"description": "changed"},
        ("api-evaluator-detail", "patch"): {"description": "changed"},
        ("api-model-connection-list", "post"): {
            "name": "Made",
            "base_url": "https://104.18.7.192/v1",
            "models": ["m"],
        },
        ("api-model-connection-detail", "put"): {
            "name": "Renamed",
            "base_url": "https://104.18.7.192/v1",
        },
        ("api-model-connection-detail", "patch"): {"rate_limit_rpm": 5},
        ("api-testset-list", "post"): {"name": "Made", "rows": [{"a": 1}]},
        ("api-testset-detail", "patch"): {"name": "Renamed"},
        ("api-testset-row", "patch"): {"data": CAPITALS[1], "base_version": head.version},
        ("api-testset-rows", "post"): {"rows": [CAPITALS[0]], "base_version": head.version},
        ("api-testset-rows", "put"): {"rows": [CAPITALS[0]], "base_version": head.version},
        ("api-trace-list", "post"): {
            "spans": [
                {
                    "trace_id": "ab" * 16,
                    "span_id": "cd" * 8,
                    "name": "x",
                    "start_time": "2026-01-01T00:00:00Z",
                    "end_time": "2026-01-01T00:00:01Z",
                }
            ]
        },
        ("api-applications", "post"): {
            "name": "Made",
            "kind": "column",
            "config": {"outputs_column": "x"},
        },
        ("api-replays", "post"): {
            "application": str(w["endpoint"].pk),
            "evaluators": [str(exact.pk)],
            "limit": 10,
        },
        ("api-runs", "post"): {
            "testset": str(w["testset"].pk),
            "application": str(w["app"].pk),
            "evaluators": [str(exact.pk)],
        },
        ("api-run-evaluators", "post"): {"evaluators": [str(w["similar"].pk)]},
        ("api-run", "patch"): {"tags": {"branch": "main"}},
        ("api-run", "put"): {"tags": {"branch": "main"}},
        ("api-project", "patch"): {"max_run_cost_usd": 5, "trace_retention_days": 30},
        ("api-project", "put"): {"max_run_cost_usd": 5, "trace_retention_days": 30},
        ("api-run-scenarios", "post"): {"scenarios": [{"inputs": {"a": 1}}]},
        ("api-annotations", "post"): {
            "evaluator": str(exact.pk),
            "trace_id": w["trace"].trace_id,
            "outputs": {"success": True},
        },
        ("api-online-rules", "post"): {"name": "Made", "evaluator": str(exact.pk)},
        ("api-online-rule", "patch"): {"name": "Renamed"},
        ("api-online-rule-pause", "post"): {},
        ("api-online-rule-backfill", "post"): {"since": "2020-01-01T00:00:00Z"},
        ("api-revision-schema", "post"): {"schema": exact.head.outputs_schema},
        ("api-run-metrics-refresh", "post"): {},
        ("api-run-cancel", "post"): {},
        ("api-run-close", "post"): {},
        ("api-run-start", "post"): {},
        ("api-run-retry", "post"): {},
        ("api-model-connection-test", "post"): {},
        ("api-otlp-traces", "post"): {},
        ("api-run-results", "post"): {"results": []},
        ("api-online-rule-resume", "post"): {},
        ("api-queues", "post"): {"name": "Made", "evaluator": str(w["queue"].evaluator.pk)},
        ("api-queue-items", "post"): {"trace_ids": [w["trace"].trace_id]},
        ("api-queue-item-review", "post"): {"outputs": {"correct": True}},
        ("api-queue-item-adjudicate", "post"): {"outputs": {"correct": True}},
        ("api-queue-gold-testset", "post"): {"testset": w["testset"].slug},
        ("api-reliability-refresh", "post"): {},
    }


def _is_valid(endpoint: Endpoint, method: str) -> bool:
    """Whether the body sent is one that gets through (else only the role is checked)."""
    return (endpoint.name, method) not in NOT_VALID


# Writes whose body cannot get through in this world (what they act on is missing or final).
NOT_VALID = {
    ("api-run-scenarios", "post"),  # the run has ended: only a logged run takes them
    ("alignment-new", "post"),  # aligning needs gold items a judge got wrong: none here
    ("api-alignments", "post"),
    ("api-queue-gold-testset", "post"),  # no item is settled: no gold label to write
}


def _body(endpoint: Endpoint, method: str, w):
    if method == "get":
        return None
    if endpoint.is_api:
        return _api_bodies(w).get((endpoint.name, method), {})
    return _page_bodies(w).get(endpoint.name, {})


# --- the database, row by row --------------------------------------------------------------------

VOLATILE = {"evalsite_apikey": ("last_used_at",), "auth_user": ("last_login",)}
SKIPPED = {"django_session"}
# Whose project a row of a table without a project column belongs to.
OWNER_SQL = {
    "evalsite_project": "t.id",
    "runs_runstep": "(SELECT project_id FROM runs_run r WHERE r.id = t.run_id)",
    "runs_workunit": "(SELECT project_id FROM runs_run r WHERE r.id = t.run_id)",
    "runs_runmetrics": "(SELECT project_id FROM runs_run r WHERE r.id = t.run_id)",
    "runs_inferredschema": (
        "(SELECT project_id FROM evaluators_evaluatorrevision v WHERE v.id = t.revision_id)"
    ),
}


def _snapshot_sql() -> str:
    selects = []
    for model in apps.get_models():
        table = model._meta.db_table
        if table in SKIPPED:
            continue
        columns = [f.column for f in model._meta.concrete_fields]
        dropped = "".join(f" - '{c}'" for c in VOLATILE.get(table, ()))
        owner = OWNER_SQL.get(table) or ("t.project_id" if "project_id" in columns else "NULL")
        selects.append(
            f"SELECT '{table}', t.\"{model._meta.pk.column}\"::text,"
            f' md5((to_jsonb(t){dropped})::text), ({owner})::bigint FROM "{table}" t'
        )
    return " UNION ALL ".join(selects)


def snapshot() -> dict[tuple[str, str], tuple[str, int | None]]:
    """Every row of every model's table: (table, pk) -> (a digest of the row, its project)."""
    with connection.cursor() as cursor:
        cursor.execute(_snapshot_sql())
        return {(table, key): (digest, project) for table, key, digest, project in cursor}


def changed(before, after) -> dict[tuple[str, str], int | None]:
    """The rows added, removed or changed, with their project."""
    keys = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return {k: (after.get(k) or before.get(k))[1] for k in keys}


# --- the clients --------------------------------------------------------------------------------

CAST = ("owner", "editor", "viewer", "outsider", "anonymous")


def _client(who: str, endpoint: Endpoint, w):
    if endpoint.is_api:
        client = APIClient()
        if who in w["keys"]:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {w['keys'][who]}")
        return client
    client = Client()
    if who != "anonymous":
        client.cookies[django_settings.SESSION_COOKIE_NAME] = w["sessions"][who]
    return client


def _allowed(level: str, who: str) -> bool:
    if level == ANONYMOUS:
        return True
    if level == AUTHENTICATED:
        return who != "anonymous"
    if level == STAFF:
        return who == "staff"
    if who in ("anonymous", "outsider", "staff"):
        return False
    return ROLE_RANK[Role(who)] >= ROLE_RANK[Role(level)]


def _cases():
    for endpoint in ENDPOINTS:
        cast = ("owner", "anonymous", "staff") if endpoint.is_admin else CAST
        for method in endpoint.methods:
            for who in cast:
                label = endpoint.name or endpoint.route
                yield pytest.param(endpoint, method, who, id=f"{label}-{method}-{who}")


def _send(client, method: str, url: str, body, endpoint: Endpoint):
    if method == "get":
        return client.get(url)
    if endpoint.is_api:
        return getattr(client, method)(url, body, format="json")
    return client.post(url, body)


def _content(response) -> bytes:
    if response.streaming:
        return b"".join(response.streaming_content)
    return response.content


def _is_login_redirect(response) -> bool:
    return response.status_code == 302 and "login" in response.get("Location", "")


@pytest.fixture
def celery_off(settings):
    # The outer transaction never commits, so nothing is queued; a direct send must not either.
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.EVALSITE_MODELS_ALLOW_PRIVATE = True


@pytest.mark.parametrize(("endpoint", "method", "who"), list(_cases()))
def test_it_enforces_the_table(world, db, celery_off, endpoint, method, who):
    w = world
    rule = rule_for(endpoint.name)
    level = rule.needed(method.upper())
    answers = rule.read if method == "get" else rule.write  # None: the view refuses the method
    url = _url(endpoint, w)
    client = _client(who, endpoint, w)
    body = _body(endpoint, method, w)
    before = snapshot() if method != "get" else None
    response = _send(client, method, url, body, endpoint)
    status = response.status_code
    detail = f"{method.upper()} {url} as {who}: {status} {_content(response)[:300]!r}"
    assert status < 500, detail
    if answers is None and status == 405:  # require_POST answers before anyone is looked up
        return

    if endpoint.is_api and who == "outsider" and level in PROJECT_ROLES:
        _check_outsider_api(endpoint, response, before, w["project"].pk, detail)
        return

    if level == ANONYMOUS:  # login, logout, health, the schema: nothing to refuse
        return
    if _allowed(level, who):
        if endpoint.is_admin:  # the admin's own per-model permissions may still say 403
            assert not (status == 302 and "/admin/login/" in response["Location"]), detail
            return
        assert status not in (401, 403, 404) and not _is_login_redirect(response), detail
        if method != "get" and _is_valid(endpoint, method):
            assert status < 400, detail  # the body gets through: a refusal is the permission
        return

    if endpoint.is_api:
        expected = (401,) if who == "anonymous" else (403,)
        if who == "outsider":  # a session naming a project it is not in: none found
            expected = (404,)
        assert status in expected, detail
    elif endpoint.is_admin:
        assert status == 302 and "/admin/login/" in response["Location"], detail
    elif who == "anonymous":
        assert _is_login_redirect(response), detail
    elif who in ("outsider", "staff") and level in PROJECT_ROLES:
        assert status == 404, detail  # another project is not there at all
    else:
        assert status == 403, detail
    if before is not None:
        assert changed(before, snapshot()) == {}, detail


def _check_outsider_api(endpoint: Endpoint, response, before, project_id: int, detail: str):
    """An outsider's key acts in their own project: ours is simply not found, and nothing of it
    is read or touched."""
    ours = {"ref", "run_id", "rule_id", "trace_id", "session_id", "pk", "index"}
    ours &= set(endpoint.groups)
    if ours and endpoint.name not in ("kind-detail",):
        assert response.status_code in (400, 404), detail
    assert MARK not in _content(response).decode(errors="replace"), detail
    if before is not None:
        touched = {k: p for k, p in changed(before, snapshot()).items() if p == project_id}
        assert touched == {}, detail


# --- things the matrix cannot see ---------------------------------------------------------------


def test_a_session_may_not_name_another_project_on_the_api(world, db):
    client = APIClient()
    client.force_login(world["users"]["outsider"])
    for url in ("/api/v1/project", "/api/v1/evaluators", f"/api/v1/runs/{world['runs'][0].pk}"):
        assert client.get(url, HTTP_X_PROJECT=SLUG).status_code == 404
        assert client.get(f"{url}?project={SLUG}").status_code == 404


def test_a_viewer_session_on_the_api_has_the_viewer_role(world, db):
    client = APIClient()
    client.force_login(world["users"]["viewer"])
    body = {"evaluator": str(world["exact"].pk), "outputs": "Paris"}
    response = client.post("/api/v1/evaluators/invoke", body, format="json", HTTP_X_PROJECT=SLUG)
    assert response.status_code == 403
    script = {"parameters": {"connection": world["conn"].slug}, "inputs": {}}
    response = client.post("/api/v1/llm-judge/render", script, format="json", HTTP_X_PROJECT=SLUG)
    assert response.status_code == 403


# --- the table itself ---------------------------------------------------------------------------

EXECUTES = [
    ("evaluator-invoke", "POST"),
    ("llm-judge-render", "POST"),
    ("evaluator-try", "POST"),
    ("evaluator-new", "POST"),
    ("evaluator-save", "POST"),
    ("connection-test", "POST"),
    ("api-model-connection-test", "POST"),
    ("run-new", "POST"),
    ("run-estimate", "POST"),
    ("api-runs", "POST"),
    ("replay-new", "POST"),
    ("api-replays", "POST"),
    ("run-add-evaluator", "POST"),
    ("api-run-evaluators", "POST"),
    ("online-rule-backfill", "POST"),
    ("api-online-rule-backfill", "POST"),
]


@pytest.mark.parametrize(("name", "method"), EXECUTES)
def test_what_executes_needs_an_editor(name, method):
    needed = rule_for(name).needed(method)
    assert needed in PROJECT_ROLES and ROLE_RANK[Role(needed)] >= ROLE_RANK[Role.EDITOR]


def test_a_viewer_never_writes():
    """Except reviewing (DOMAIN.md, Roles): viewers review the queue items assigned to them,
    and the services check that they are a reviewer (or adjudicator) of that queue."""
    for name, rule in ACCESS.items():
        if rule.note in (REVIEWS, ADJUDICATES):
            continue
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            assert rule.needed(method) != Role.VIEWER, name


def test_only_owners_manage_keys():
    for name in ("api-key-list", "api-key-detail", "api-key-revoke"):
        assert rule_for(name).needed("POST") == Role.OWNER
    assert rule_for("project-settings").needed("POST") == Role.OWNER


def test_the_snapshot_sees_a_changed_row(world, db):
    before = snapshot()
    w = world
    type(w["exact"]).objects.filter(pk=w["exact"].pk).update(description="changed")
    assert set(changed(before, snapshot())) == {("evaluators_evaluator", str(w["exact"].pk))}
