"""Retention: production traces older than their project's retention go (partitions dropped
whole when nobody keeps anything in them, rows deleted otherwise), with what points at them
handled as the models say; traces that runs recorded stay with their runs; trimmed sessions do
not look newly active to session rules; the dry run changes nothing and reports what the real
run then does; owners set it and see the dry run on the settings page and the API."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from evalsite.services import project_create, project_trace_retention_set
from evaluators.services import evaluator_create
from runs import tasks
from runs.engine import run_create, run_execute_inline
from runs.models import Annotation, Result, Run, Scenario, Session, Span, Trace
from runs.online import session_rule_sweep
from runs.selectors import scenario_rows
from runs.traces import retention_apply, retention_plan, trace_dict, trace_record
from runs.traces.partitions import (
    RETENTION_LOCK,
    day_start,
    partition_create,
    partitions_list,
)
from tests.conftest import api_client_for
from tests.runs.test_partitions import ingest, move
from tests.runs.test_session_rules import JUDGE, converse, judged, session_rule, time_passes

HTMX = {"HTTP_HX_REQUEST": "true"}
NOW = timezone.now()
TODAY = day_start(NOW)


def _names() -> set[str]:
    return {p.name for p in partitions_list()}


def _counts() -> tuple:
    return Trace.objects.count(), Span.objects.count(), Session.objects.count(), _names()


@pytest.fixture
def old_day(db):
    """A partition 40 days old."""
    day = TODAY - timedelta(days=40)
    partition_create(day)
    return day


def _cells(project, exact, trace):
    run = Run.objects.create(project=project, name="online", is_online=True)
    session = Session.objects.get(project=project, session_id=trace.session_id)
    scenario = Scenario.objects.create(
        project=project, run=run, index=0, trace=trace, session=session
    )
    annotation = Annotation.objects.create(
        project=project,
        trace=trace,
        evaluator=exact.evaluator,
        evaluator_slug=exact.evaluator.slug,
        revision=exact,
        outputs={"success": True},
    )
    result = Result.objects.create(
        project=project,
        run=run,
        scenario=scenario,
        step_key="evaluator-exact",
        trace=trace,
        annotation=annotation,
    )
    return scenario, annotation, result


def test_old_partitions_are_dropped_and_old_traces_deleted_with_what_points_at_them(
    project, exact, old_day, settings
):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    old = ingest(project, "old", session="chat-1", when=old_day + timedelta(hours=1))
    ingest(project, "old-2", session="chat-2", when=old_day + timedelta(hours=2))
    new = ingest(project, "new", session="chat-2")
    scenario, annotation, result = _cells(project, exact, old)
    kept = trace_dict(new)
    old_partition = f"runs_span_p{old_day:%Y%m%d}"

    before = _counts()
    dry = retention_plan(now=NOW)
    assert _counts() == before  # a dry run changes nothing
    assert [p.name for p in dry.partitions] == [old_partition]
    [row] = [r for r in dry.projects if r.slug == project.slug]
    assert (row.days, row.traces, row.spans) == (30, 2, 4)
    assert row.cutoff == TODAY - timedelta(days=30)
    assert row.oldest_kept == new.created_at

    done = retention_apply(now=NOW)

    assert done.as_dict() == {**dry.as_dict(), "dry_run": False}
    assert old_partition not in _names()
    assert list(Trace.objects.values_list("trace_id", flat=True)) == ["new"]
    assert trace_dict(new) == kept
    scenario.refresh_from_db()
    result.refresh_from_db()
    assert (scenario.trace_id, scenario.session_id) == (None, None)  # SET_NULL, both
    assert not Annotation.objects.filter(pk=annotation.pk).exists()  # CASCADE
    assert (result.trace_id, result.annotation_id) == (None, None)
    assert list(Session.objects.values_list("session_id", "trace_count")) == [("chat-2", 1)]


@pytest.mark.django_db(transaction=True)  # a drop needs the deletes' deferred checks committed
def test_online_judge_calls_go_with_the_traces_they_judged(project, exact, old_day, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    old = ingest(project, "old", session="chat-1", when=old_day + timedelta(hours=1))
    _, annotation, _ = _cells(project, exact, old)
    judge = trace_record(project=project, name="judge", inputs={}, outputs="ok", source="judge")
    move(judge, old_day + timedelta(hours=2))
    Annotation.objects.filter(pk=annotation.pk).update(judge_trace=judge)
    old_partition = f"runs_span_p{old_day:%Y%m%d}"

    retention_apply(now=NOW)

    assert not Trace.objects.filter(pk__in=[old.pk, judge.pk]).exists()
    assert not Span.objects.filter(trace_id__in=[old.pk, judge.pk]).exists()
    # The judge's spans held the day this time (rows were deleted); the next run drops it.
    assert old_partition in _names()
    retention_apply(now=NOW)
    assert old_partition not in _names()


def _old_run(project, capitals, column_app, exact, day):
    """A finished run whose invocation traces, and one judge call, arrived on ``day``."""
    run = run_execute_inline(
        run=run_create(
            project=project, testset_version=capitals, application=column_app, revisions=[exact]
        )
    )
    judge = trace_record(project=project, name="judge", inputs={}, outputs="ok", source="judge")
    recorded = list(Trace.objects.filter(project=project).exclude(source__in=("api", "otlp")))
    assert {t.source for t in recorded} == {"invocation", "judge"} and judge in recorded
    for trace in recorded:
        move(trace, day + timedelta(hours=3))
    return run, recorded


def test_traces_that_runs_recorded_outlive_the_cutoff_with_their_spans_and_outputs(
    project, capitals, column_app, exact, old_day, settings
):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    only_production = old_day - timedelta(days=1)
    partition_create(only_production)
    ingest(project, "prod-alone", when=only_production + timedelta(hours=1))
    ingest(project, "prod-beside-the-run", when=old_day + timedelta(hours=1))
    run, recorded = _old_run(project, capitals, column_app, exact, old_day)
    dicts = {t.pk: trace_dict(t) for t in recorded}
    scenarios = list(run.scenarios.all())
    rows = [row["values"] for row in scenario_rows(run, scenarios)]
    assert [row["outputs"] for row in rows][:3] == ["Paris", "Berlin", "Milan"]
    annotations = list(
        Annotation.objects.filter(trace__in=recorded).order_by("pk").values_list("pk", "outputs")
    )
    assert len(annotations) == 4

    dry = retention_plan(now=NOW)
    # The day with only production spans goes whole; the run's day is kept.
    assert [p.name for p in dry.partitions] == [f"runs_span_p{only_production:%Y%m%d}"]
    [row] = dry.projects
    assert (row.traces, row.spans, row.run_traces) == (2, 4, len(recorded))

    done = retention_apply(now=NOW)

    assert done.as_dict() == {**dry.as_dict(), "dry_run": False}
    names = _names()
    assert f"runs_span_p{only_production:%Y%m%d}" not in names
    assert f"runs_span_p{old_day:%Y%m%d}" in names
    assert not Trace.objects.filter(source__in=("api", "otlp")).exists()  # its rows deleted
    assert {t.pk: trace_dict(t) for t in recorded} == dicts  # spans and all
    assert [row["values"] for row in scenario_rows(run, scenarios)] == rows
    assert list(Annotation.objects.order_by("pk").values_list("pk", "outputs")) == annotations
    assert retention_apply(now=NOW + timedelta(days=1)).partitions == []  # the run's day stays


def test_a_shorter_project_retention_deletes_its_rows_and_keeps_the_shared_partition(
    project, old_day, settings
):
    settings.EVALSITE_TRACE_RETENTION_DAYS = None
    other = project_create(name="Keeps all", slug="keeps-all", owner=None)
    project_trace_retention_set(project=project, trace_retention_days=5)
    ingest(project, "mine", when=old_day + timedelta(hours=1))
    theirs = ingest(other, "theirs", when=old_day + timedelta(hours=1))
    theirs_before = trace_dict(theirs)

    dry = retention_plan(now=NOW)
    assert dry.partitions == []  # the other project keeps its spans there
    rows = {r.slug: r.as_dict() for r in dry.projects}
    assert (rows["acme"]["traces"], rows["acme"]["spans"]) == (1, 2)
    assert (rows["keeps-all"]["retention_days"], rows["keeps-all"]["traces"]) == (None, 0)

    done = retention_apply(now=NOW)

    assert done.as_dict() == {**dry.as_dict(), "dry_run": False}
    assert f"runs_span_p{old_day:%Y%m%d}" in _names()
    assert not Trace.objects.filter(project=project).exists()
    assert not Span.objects.filter(project=project).exists()
    assert trace_dict(theirs) == theirs_before


def test_old_spans_in_the_default_partition_are_deleted_row_by_row(project, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    ingest(project, "stray", when=TODAY - timedelta(days=400))  # no partition that day
    dry = retention_plan(now=NOW)
    assert dry.default_rows == 2
    done = retention_apply(now=NOW)
    assert [(r.traces, r.spans) for r in done.projects] == [(1, 2)]
    assert not Span.objects.filter(project=project).exists()


def test_with_no_retention_anywhere_nothing_goes(project, old_day, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = None
    ingest(project, "old", when=old_day + timedelta(hours=1))
    before = _counts()
    done = retention_apply(now=NOW)
    assert done.partitions == [] and [r.traces for r in done.projects] == [0]
    assert _counts() == before


def test_a_second_host_finds_retention_busy_and_does_nothing(project, old_day, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    ingest(project, "old", when=old_day + timedelta(hours=1))
    before = _counts()
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other_host:
        other_host.execute("SELECT pg_advisory_lock(%s)", [RETENTION_LOCK])
        done = retention_apply(now=NOW)
    assert done.skipped and done.projects == []
    assert _counts() == before


def test_the_beat_runs_both_tasks(project, old_day, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    ingest(project, "old", when=old_day + timedelta(hours=1))
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"runs.tasks.partitions_ensure", "runs.tasks.traces_retention"} <= scheduled
    assert tasks.partitions_ensure()["blocked"] == []
    report = tasks.traces_retention()
    assert [p["name"] for p in report["partitions"]] == [f"runs_span_p{old_day:%Y%m%d}"]
    assert not Trace.objects.filter(trace_id="old").exists()


@pytest.fixture
def session_judge(project):
    return evaluator_create(
        project=project,
        kind="code",
        name="Conversation",
        parameters={"runtime": "python", "code": JUDGE, "version": "2"},
    ).head


def test_sessions_trimmed_by_retention_do_not_look_newly_active_to_session_rules(
    project, session_judge, old_day, settings
):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    converse(project, "chat-before")  # idle before the rule existed: the past is a backfill
    time_passes(3 * 3600)
    rule = session_rule(project, session_judge)
    converse(project, "chat-judged")
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 1
    assert judged(rule) == ["chat-judged"]
    for session_id in ("chat-before", "chat-judged"):  # their first two turns are old
        for number in (1, 2):
            move(Trace.objects.get(trace_id=f"{session_id}-turn-{number}"), old_day)
    arrived = dict(Session.objects.values_list("session_id", "updated_at"))

    retention_apply(now=NOW)

    trimmed = Session.objects.values_list("session_id", "trace_count", "updated_at")
    assert {(sid, count) for sid, count, _ in trimmed} == {("chat-before", 3), ("chat-judged", 3)}
    assert {sid: updated for sid, _, updated in trimmed} == arrived
    time_passes()
    assert session_rule_sweep(rule_id=rule.pk) == 0
    assert judged(rule) == ["chat-judged"]  # neither judged again nor judged late


# --- the command -------------------------------------------------------------------------------


def test_the_command_dry_run_reports_and_the_real_run_deletes(project, old_day, settings, capsys):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    ingest(project, "old", when=old_day + timedelta(hours=1))
    call_command("traces_retention", "--dry-run", "--project", "acme")
    out = capsys.readouterr().out
    assert "Would drop 1 partition(s)" in out
    assert "acme: would lose 1 production trace(s), 2 span(s)" in out
    assert "0 older trace(s) recorded by runs are kept" in out
    assert Trace.objects.filter(trace_id="old").exists()
    call_command("traces_retention", "--project", "acme")
    assert "acme: lost 1 production trace(s), 2 span(s)" in capsys.readouterr().out
    assert not Trace.objects.filter(trace_id="old").exists()


def test_the_command_names_an_unknown_project(db):
    with pytest.raises(CommandError, match="nope"):
        call_command("traces_retention", "--dry-run", "--project", "nope")


# --- owners set it and see the dry run -------------------------------------------------------------


def test_an_owner_sets_the_retention_through_the_api(project, owner):
    client = api_client_for(project, owner, "owner")
    response = client.patch("/api/v1/project", {"trace_retention_days": 14}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["trace_retention_days"] == 14
    assert response.json()["trace_retention_effective_days"] == 14
    project.refresh_from_db()
    assert project.trace_retention_days == 14 and project.max_run_cost_usd is None
    cleared = client.patch("/api/v1/project", {"trace_retention_days": None}, format="json")
    assert cleared.json()["trace_retention_days"] is None


def test_a_retention_of_zero_days_is_refused_naming_the_field(project, owner):
    client = api_client_for(project, owner, "owner")
    response = client.patch("/api/v1/project", {"trace_retention_days": 0}, format="json")
    assert response.status_code == 400
    assert "trace_retention_days" in response.json()["error"]["fields"]
    project.refresh_from_db()
    assert project.trace_retention_days is None


def test_an_editor_may_not_change_the_retention(project, api):
    response = api.patch("/api/v1/project", {"trace_retention_days": 1}, format="json")
    assert response.status_code == 403
    project.refresh_from_db()
    assert project.trace_retention_days is None


def test_the_api_dry_run_tells_the_owner_what_would_go(project, owner, old_day, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    ingest(project, "old", when=old_day + timedelta(hours=1))
    new = ingest(project, "new")
    client = api_client_for(project, owner, "owner")
    body = client.get("/api/v1/project/retention").json()
    assert (body["retention_days"], body["traces"], body["spans"]) == (30, 1, 2)
    assert [p["name"] for p in body["partitions"]] == [f"runs_span_p{old_day:%Y%m%d}"]
    assert body["oldest_kept"].startswith(new.created_at.strftime("%Y-%m-%dT%H:%M"))
    assert Trace.objects.filter(trace_id="old").exists()


def test_editors_do_not_get_the_dry_run(project, api):
    assert api.get("/api/v1/project/retention").status_code == 403


def test_the_settings_page_sets_the_retention_and_loads_the_dry_run(owner_client, project):
    page = owner_client.get(f"/p/{project.slug}/settings/")
    assert b"Trace retention" in page.content
    assert f"/p/{project.slug}/settings/retention".encode() in page.content
    response = owner_client.post(
        f"/p/{project.slug}/settings/trace-retention", {"trace_retention_days": "7"}
    )
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.trace_retention_days == 7


def test_the_settings_form_refuses_zero_days_with_a_message(owner_client, project):
    response = owner_client.post(
        f"/p/{project.slug}/settings/trace-retention", {"trace_retention_days": "0"}, follow=True
    )
    assert b"greater than or equal to 1" in response.content
    project.refresh_from_db()
    assert project.trace_retention_days is None


def test_the_dry_run_page_and_its_fragment(owner_client, project, old_day, settings):
    settings.EVALSITE_TRACE_RETENTION_DAYS = 30
    ingest(project, "old", when=old_day + timedelta(hours=1))
    page = owner_client.get(f"/p/{project.slug}/settings/retention")
    assert page.status_code == 200
    assert b"<html" in page.content and b'id="retention-preview"' in page.content
    fragment = owner_client.get(f"/p/{project.slug}/settings/retention", **HTMX)
    assert b"<html" not in fragment.content
    assert b'id="retention-preview"' in fragment.content
    assert f"{old_day:%Y-%m-%d}".encode() in fragment.content
    assert Trace.objects.filter(trace_id="old").exists()
