"""Replaying production: production traces (or sessions) become a testset with the production
outputs and the people's corrections, a new application version runs over it beside production,
and the comparison pairs them. The candidate is a real HTTP server; the runs go through the
engine with tasks executed inline."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from evalsite.errors import InvalidInput
from evaluators.services import evaluator_create
from runs import compare, online
from runs.annotations import annotation_create
from runs.api.replay import ReplayFiltersSerializer
from runs.applications import application_create, invoke_many
from runs.models import Application, Result, Run, Scenario, Testcase, Testset, TestsetVersion
from runs.online.replay import traces_selected
from runs.traces import trace_ingest
from tests.runs.factories import make_testset
from tests.servers import Reply

CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid"}
# What production answered: right for France and Italy, wrong for Germany and Spain.
PRODUCTION = {
    "France": "Paris",
    "Germany": "Bonn",
    "Italy": "Rome",
    "Spain": "I don't know",
    "Peru": "Lima",
}
START = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def _span(trace_id, name, inputs, outputs, minute, env="prod", session_id=None, **extra):
    span = {
        "trace_id": trace_id,
        "span_id": f"{trace_id}-root",
        "name": name,
        "kind": "workflow",
        "start_time": (START + timedelta(minutes=minute)).isoformat(),
        "end_time": (START + timedelta(minutes=minute, seconds=1)).isoformat(),
        "attributes": {
            "ag": {"data": {"inputs": inputs, "outputs": outputs}, "meta": {"env": env}}
        },
        **extra,
    }
    if session_id:
        span["session_id"] = session_id
    return span


def _ingest(project, spans):
    trace_ingest(project=project, spans=spans)


@pytest.fixture
def allow_local(settings):
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True


@pytest.fixture
def production(project):
    """Five production answers (Peru without any correction), one staging trace, one trace of
    another workflow, and a trace a run recorded; corrections and a gold label on four."""
    spans = [
        _span(f"t-{country.lower()}", "capital_qa", {"country": country}, answer, minute)
        for minute, (country, answer) in enumerate(PRODUCTION.items())
    ]
    spans.append(_span("t-staging", "capital_qa", {"country": "Chile"}, "Santiago", 10, "staging"))
    spans.append(_span("t-other", "summarise", "a long text", "a summary", 11))
    _ingest(project, spans)
    trace_ingest(
        project=project,
        spans=[_span("t-invocation", "capital_qa", {"country": "Japan"}, "Tokyo", 12)],
        source="invocation",
    )
    human = evaluator_create(
        project=project,
        kind="human",
        name="Answer review",
        parameters={"fields": [{"name": "correct_answer", "type": "string"}]},
    )
    correct = {"origin": "human", "channel": "sdk", "evaluator": "correction"}
    annotation_create(
        project=project, trace_id="t-france", outputs={"correct_answer": "Lyon"}, **correct
    )
    annotation_create(
        project=project, trace_id="t-france", outputs={"correct_answer": "Paris"}, **correct
    )
    annotation_create(
        project=project, trace_id="t-germany", outputs={"expected": "Berlin"}, **correct
    )
    annotation_create(
        project=project,
        evaluator=human.slug,
        trace_id="t-spain",
        outputs={"correct_answer": "Madrid"},
        origin="gold",
        channel="web",
    )
    annotation_create(
        project=project,
        evaluator=human.slug,
        trace_id="t-italy",
        outputs={"correct_answer": "Rome"},
        origin="gold",
        channel="web",
    )
    # An evaluator's own output is never ground truth, even when it names an expected value.
    annotation_create(
        project=project,
        trace_id="t-peru",
        evaluator="judge",
        outputs={"expected": "Cusco"},
        origin="auto",
    )


@pytest.fixture
def exact(project):
    return evaluator_create(project=project, kind="exact_match", name="Exact")


@pytest.fixture
def candidate(project, http_server, allow_local):
    """The new version: knows every capital."""
    http_server.handler = lambda request: Reply(
        200, {"outputs": CAPITALS.get(request.json()["inputs"].get("country"), "Lima")}
    )
    return application_create(
        project=project,
        name="Capital QA v2",
        kind="http",
        config={"url": http_server.url, "retries": 0},
    )


def _rows(version: TestsetVersion) -> dict[str, dict]:
    rows = Testcase.objects.filter(version=version).order_by("index")
    return {row.data["source_trace_id"]: row.data for row in rows}


def _counts() -> tuple[int, ...]:
    return (
        Testset.objects.count(),
        TestsetVersion.objects.count(),
        Run.objects.count(),
        Application.objects.count(),
    )


BODY = {"filters": {"name": "capital_qa", "attributes": {"ag.meta.env": "prod"}}}


# --- the whole loop -----------------------------------------------------------------------------


def test_it_replays_production_and_compares_the_new_version(
    api,
    project,
    production,
    exact,
    candidate,
    http_server,
    celery_eager,
    django_capture_on_commit_callbacks,
):
    body = {
        **BODY,
        "name": "Capitals replay",
        "application": candidate.slug,
        "evaluators": ["exact"],
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["rows"] == 5 and data["testset"]["name"] == "Capitals replay"
    assert data["testset"]["columns"][0] == "country"
    assert {"production_output", "correct_answer", "source_trace_id"} <= set(
        data["testset"]["columns"]
    )

    rows = _rows(
        TestsetVersion.objects.get(
            pk=Run.objects.get(pk=data["runs"]["production"]["id"]).testset_version_id
        )
    )
    assert set(rows) == {"t-france", "t-germany", "t-italy", "t-spain", "t-peru"}
    assert rows["t-germany"] == {
        "country": "Germany",
        "correct_answer": "Berlin",
        "production_output": "Bonn",
        "source_trace_id": "t-germany",
    }
    assert rows["t-france"]["correct_answer"] == "Paris"  # the newest correction wins
    assert rows["t-spain"]["correct_answer"] == "Madrid"  # a gold label
    assert "correct_answer" not in rows["t-peru"]  # only a judge's output: no ground truth

    production_run = Run.objects.get(pk=data["runs"]["production"]["id"])
    candidate_run = Run.objects.get(pk=data["runs"]["candidate"]["id"])
    assert production_run.tags == {"replay": data["replay"], "side": "production"}
    assert candidate_run.tags == {"replay": data["replay"], "side": "candidate"}
    assert production_run.application.config == {
        "outputs_column": "production_output",
        "error_column": "production_error",
    }
    assert not production_run.is_active and not candidate_run.is_active
    assert len(http_server.requests) == 5  # the candidate was called once a row
    assert {r.json()["inputs"]["country"] for r in http_server.requests} == set(PRODUCTION)

    comparison = compare.comparison_get(
        project=project, run_ids=[str(production_run.pk), str(candidate_run.pk)]
    )
    report = compare.comparison_report(comparison)
    (stats,) = [s for s in report["stats"] if s["metric"] == "exact.success"]
    assert [r["value"] for r in stats["runs"]] == [0.5, 1.0]
    (test,) = stats["tests"]
    assert test["table"]["false_to_true"] == 2 and test["table"]["true_to_false"] == 0
    assert test["n"] == 4 and test["excluded"]["errors"] == 1  # Peru has no truth: an error

    assert data["compare_url"].endswith(
        f"/p/acme/runs/compare?runs={production_run.pk},{candidate_run.pk}&baseline={production_run.pk}"
    )


def test_the_comparison_page_shows_the_paired_difference(
    editor_client,
    project,
    production,
    exact,
    candidate,
    celery_eager,
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        replay = online.replay_create(
            project=project, filters=BODY["filters"], application=candidate, evaluators=[exact.head]
        )
    response = editor_client.get(f"/p/acme/replay/{replay.id}/")
    assert response.status_code == 302 and "/runs/compare?" in response["Location"]
    page = editor_client.get(response["Location"]).content.decode()
    assert "exact.success" in page
    assert "+50.0 pp" in page  # the candidate's rate over production's


# --- selection ----------------------------------------------------------------------------------


def test_it_replays_only_production_traces_that_match(project, production):
    preview = online.replay_preview(project=project, filters={"name": "capital_qa"})
    ids = {row["source_trace_id"] for row in preview.rows}
    assert "t-invocation" not in ids  # traces runs recorded are never replayed
    assert ids == {"t-france", "t-germany", "t-italy", "t-spain", "t-peru", "t-staging"}
    staging = online.replay_preview(
        project=project, filters={"attributes": {"ag.meta.env": "staging"}}
    )
    assert [row["country"] for row in staging.rows] == ["Chile"]
    searched = online.replay_preview(project=project, filters={"search": "t-peru"})
    assert [row["source_trace_id"] for row in searched.rows] == ["t-peru"]


def test_the_limit_takes_the_newest(project, production):
    preview = online.replay_preview(project=project, filters=BODY["filters"], limit=2)
    assert (preview.matched, preview.count, preview.more) == (5, 2, True)
    assert [row["country"] for row in preview.rows] == ["Peru", "Spain"]


def test_an_input_that_is_not_an_object_becomes_the_input_column(project, production):
    (row,) = online.replay_preview(project=project, filters={"name": "summarise"}).rows
    assert row == {
        "input": "a long text",
        "production_output": "a summary",
        "source_trace_id": "t-other",
    }


def test_an_input_named_like_a_replay_column_keeps_its_value(project):
    _ingest(project, [_span("t-odd", "x", {"production_output": "kept", "q": 1}, "new", 0)])
    (row,) = online.replay_preview(project=project).rows
    assert row["input_production_output"] == "kept" and row["production_output"] == "new"


def test_it_replays_sessions_from_their_first_turn(project, exact, candidate, celery_eager):
    _ingest(
        project,
        [
            _span(
                "s1-a", "chat", {"message": "hi, capital of France?"}, "Paris", 0, session_id="s1"
            ),
            _span("s1-b", "chat", {"message": "and Spain?"}, "Madrid", 1, session_id="s1"),
            _span("s2-a", "chat", {"message": "capital of Peru?"}, "Lima", 2, session_id="s2"),
            _span("s3-a", "chat", {"message": "staging"}, "x", 3, session_id="other-3"),
        ],
    )
    annotation_create(
        project=project,
        trace_id="s1-a",
        evaluator="correction",
        outputs={"correct_answer": "Paris"},
        origin="human",
    )
    preview = online.replay_preview(project=project, source="sessions")
    assert preview.matched == 3
    by_session = {row["source_session_id"]: row for row in preview.rows}
    assert by_session["s1"] == {
        "message": "hi, capital of France?",
        "correct_answer": "Paris",
        "production_output": "Paris",
        "source_trace_id": "s1-a",
        "source_session_id": "s1",
    }
    assert by_session["s2"]["message"] == "capital of Peru?"
    only = online.replay_preview(project=project, source="sessions", filters={"search": "s2"})
    assert [row["source_session_id"] for row in only.rows] == ["s2"]


# --- what it creates ----------------------------------------------------------------------------


def test_the_production_application_is_made_once(project, production, exact, candidate):
    first = online.replay_create(project=project, application=candidate, evaluators=[exact.head])
    second = online.replay_create(project=project, application=candidate, evaluators=[exact.head])
    assert first.production.application_id == second.production.application_id
    assert Application.objects.filter(project=project, kind="column").count() == 1
    assert first.testset != second.testset


def test_it_makes_a_new_version_of_a_named_testset(api, project, production, exact, candidate):
    existing = make_testset(project, [{"country": "Old"}], slug="replayed")
    body = {**BODY, "testset": "replayed", "application": candidate.slug, "evaluators": ["exact"]}
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["testset"] | {"columns": None} == {
        "id": existing.testset_id,
        "slug": "replayed",
        "name": "Replayed",
        "version": 2,
        "columns": None,
    }
    assert Testcase.objects.filter(version=existing).count() == 1  # v1 kept as it was


def test_a_dry_run_creates_nothing(api, project, production, exact, candidate):
    before = _counts()
    body = {**BODY, "limit": 3, "dry_run": True}
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["matched"], data["rows"], data["more"]) == (5, 3, True)
    assert len(data["sample"]) == 3 and data["columns"][0] == "country"
    assert _counts() == before


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": "spans"}, "source"),
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"application": "nope"}, "application"),
        ({"evaluators": []}, "evaluators"),
        ({"evaluators": ["nope"]}, "evaluators.0"),
        ({"testset": "nope"}, "testset"),
        ({"filters": {"status": "maybe"}}, "filters"),
        ({"filters": {"name": "nothing-like-this"}}, "filters"),
        ({"source": "sessions", "filters": {"name": "capital_qa"}}, "filters.name"),
    ],
)
def test_it_refuses_bad_input_naming_the_field(
    api, project, production, exact, candidate, body, field
):
    before = _counts()
    full = {"application": candidate.slug, "evaluators": ["exact"], **body}
    response = api.post("/api/v1/replays", full, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert any(name == field or name.startswith(f"{field}.") for name in fields), fields
    assert _counts() == before


def test_a_logged_application_is_refused(api, project, production, exact):
    application_create(project=project, name="Logged", kind="logged")
    response = api.post(
        "/api/v1/replays", {"application": "logged", "evaluators": ["exact"]}, format="json"
    )
    assert response.status_code == 400
    assert "application" in response.json()["error"]["fields"]


def test_a_viewer_is_refused_and_nothing_changes(
    viewer_api, viewer_client, project, production, exact, candidate
):
    before = _counts()
    body = {"application": candidate.slug, "evaluators": ["exact"]}
    assert viewer_api.post("/api/v1/replays", body, format="json").status_code == 403
    form = {"application": candidate.pk, "evaluators": [exact.pk], "limit": 10}
    assert viewer_client.post("/p/acme/replay/new?source=traces", form).status_code == 403
    assert viewer_client.get("/p/acme/replay/new").status_code == 403
    assert _counts() == before
    assert "Replay as testset" not in viewer_client.get("/p/acme/traces/").content.decode()


def test_another_projects_traces_never_leak(project, production, other_project, outsider_api):
    _ingest(other_project, [_span("theirs", "capital_qa", {"country": "Narnia"}, "Cair", 0)])
    ours = online.replay_preview(project=project, filters={"name": "capital_qa"})
    assert "theirs" not in {row["source_trace_id"] for row in ours.rows}
    response = outsider_api.post("/api/v1/replays", {"dry_run": True}, format="json")
    assert [row["source_trace_id"] for row in response.json()["sample"]] == ["theirs"]
    exact_theirs = evaluator_create(project=other_project, kind="exact_match", name="Exact")
    ours_app = Application.objects.filter(project=project).first() or application_create(
        project=project, name="Ours", kind="http", config={"url": "http://127.0.0.1:9/"}
    )
    refused = outsider_api.post(
        "/api/v1/replays",
        {"application": str(ours_app.pk), "evaluators": [exact_theirs.slug]},
        format="json",
    )
    assert refused.status_code == 400 and "application" in refused.json()["error"]["fields"]


def test_a_testset_of_another_project_is_refused(
    project, production, exact, candidate, other_project
):
    theirs = make_testset(other_project, [{"a": 1}], slug="theirs").testset
    before = _counts()
    with pytest.raises(InvalidInput) as refused:
        online.replay_create(
            project=project, testset=theirs, application=candidate, evaluators=[exact.head]
        )
    assert list(refused.value.fields) == ["testset"]
    assert _counts() == before


# --- pages --------------------------------------------------------------------------------------


def test_the_traces_list_offers_a_replay_to_editors(editor_client, project, production):
    page = editor_client.get("/p/acme/traces/?q=capital").content.decode()
    assert "Replay as testset" in page and 'form="trace-filters"' in page


def test_the_page_counts_and_previews_the_matching_traces(
    editor_client, project, production, exact, candidate
):
    response = editor_client.get("/p/acme/replay/new?source=traces&q=capital")
    assert response.status_code == 200
    page = response.content.decode()
    assert "6 production traces match" in page  # the staging one included, the invocation not
    assert "production_output" in page and "Bonn" in page
    assert "Capital QA v2" in page  # the application to choose


def test_the_page_says_when_nothing_matches(editor_client, project, production):
    page = editor_client.get("/p/acme/replay/new?q=nothing-like-this").content.decode()
    assert "No production traces match these filters." in page
    assert 'id="replay-form"' not in page


def test_the_page_creates_and_follows_the_runs(
    editor_client, project, production, exact, candidate
):
    form = {
        "name": "From the page",
        "application": candidate.pk,
        "evaluators": [exact.pk],
        "limit": 2,
    }
    response = editor_client.post("/p/acme/replay/new?source=traces&q=capital", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    version = Testset.objects.get(name="From the page").head
    assert version.row_count == 2
    runs = Run.objects.filter(testset_version=version)
    assert {run.tags["side"] for run in runs} == {"production", "candidate"}
    replay_id = runs.first().tags["replay"]
    assert response["Location"] == f"/p/acme/replay/{replay_id}/"
    # Queued, not run (no worker here): the page follows them, the fragment polls.
    page = editor_client.get(response["Location"])
    assert page.status_code == 200 and b"Open the comparison" in page.content
    assert b"<html" in page.content
    fragment = editor_client.get(response["Location"], HTTP_HX_REQUEST="true")
    assert b'id="replay-progress"' in fragment.content and b"<html" not in fragment.content
    Run.objects.filter(testset_version=version).update(status="success")
    done = editor_client.get(response["Location"], HTTP_HX_REQUEST="true")
    assert "/runs/compare?runs=" in done["HX-Redirect"]


def test_the_page_shows_a_refusal_inline(editor_client, project, production, exact, candidate):
    before = _counts()
    form = {"application": candidate.pk, "limit": 2}  # no evaluator
    response = editor_client.post("/p/acme/replay/new?source=traces", form)
    assert response.status_code == 200
    assert b"field-error" in response.content
    assert _counts() == before


def test_an_unknown_replay_is_a_404(editor_client, project):
    assert editor_client.get("/p/acme/replay/nothing123/").status_code == 404


def test_a_run_of_the_replay_scenarios_hold_the_rows(project, production, exact, candidate):
    replay = online.replay_create(
        project=project, filters=BODY["filters"], application=candidate, evaluators=[exact.head]
    )
    scenario = Scenario.objects.filter(run=replay.candidate).order_by("index").first()
    assert scenario.inputs["production_output"] == "Lima"  # newest first: Peru
    assert replay.candidate.scenario_count == replay.production.scenario_count == 5


def test_a_refusal_half_way_leaves_nothing_behind(api, project, production, exact):
    """The candidate is refused after the testset, the production application and the
    production run were made: all of them go."""
    application_create(
        project=project, name="Column", kind="column", config={"outputs_column": "outputs"}
    )
    before = _counts()
    body = {"application": "column", "evaluators": ["exact"]}
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 400
    assert "no column 'outputs'" in response.json()["error"]["fields"]["application"][0]
    assert _counts() == before


def test_a_bad_time_names_the_filter(api, project, production, exact, candidate):
    body = {
        "filters": {"since": "yesterday"},
        "application": candidate.slug,
        "evaluators": ["exact"],
    }
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["filters.since"]


@pytest.mark.django_db(transaction=True)
def test_two_replays_at_once_each_get_their_testset(
    project, production, exact, candidate, celery_eager
):
    """Two hosts replaying under one name at the same moment: two testsets (the second slug
    taken after the first), one production application, four runs."""
    barrier, errors = threading.Barrier(2), []

    def replay():
        try:
            barrier.wait()
            online.replay_create(
                project=project,
                name="Nightly",
                filters=BODY["filters"],
                application=candidate,
                evaluators=[exact.head],
            )
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(Testset.objects.filter(name="Nightly").values_list("slug", flat=True)) == [
        "nightly",
        "nightly-2",
    ]
    assert Application.objects.filter(project=project, kind="column").count() == 1
    assert Run.objects.filter(tags__has_key="replay").count() == 4


def test_the_page_replays_sessions_with_the_sessions_list_filters(editor_client, project):
    _ingest(
        project,
        [
            _span("s1-a", "chat", {"message": "capital of France?"}, "Paris", 0, session_id="s1"),
            _span("s1-b", "chat", {"message": "and Spain?"}, "Madrid", 1, session_id="s1"),
            _span("s2-a", "chat", {"message": "capital of Peru?"}, "Lima", 2, session_id="s2"),
        ],
    )
    page = editor_client.get("/p/acme/replay/new?source=sessions&q=s1").content.decode()
    assert "1 production session matches" in page
    assert "capital of France?" in page and "and Spain?" not in page  # the first turn only
    assert 'aria-current="page">Sessions' in page


def test_an_attribute_filter_matches_a_boolean(project):
    spans = [_span("t-flag", "x", {"q": 1}, "a", 0), _span("t-plain", "x", {"q": 2}, "b", 1)]
    spans[0]["attributes"]["ag"]["meta"]["beta"] = True
    _ingest(project, spans)
    preview = online.replay_preview(project=project, filters={"attributes": {"ag.meta.beta": True}})
    assert [row["source_trace_id"] for row in preview.rows] == ["t-flag"]


# --- failed traces, sizes, odd inputs -------------------------------------------------------------


def test_a_failed_production_trace_is_an_error_not_a_score(
    project, exact, candidate, celery_eager, django_capture_on_commit_callbacks
):
    """A root that failed (status error, no outputs) carries its error in the row; production's
    side records that error and its evaluators skip the row, the candidate is still scored, and
    the comparison leaves the pair out as an error."""
    failed = _span("t-failed", "qa", {"country": "Spain"}, None, 1)
    failed["attributes"]["ag"]["data"].pop("outputs")
    failed |= {"status": "error", "status_message": "upstream timeout"}
    _ingest(project, [_span("t-ok", "qa", {"country": "France"}, "Paris", 0), failed])
    for trace_id, answer in (("t-ok", "Paris"), ("t-failed", "Madrid")):
        annotation_create(
            project=project,
            trace_id=trace_id,
            outputs={"correct_answer": answer},
            origin="human",
            evaluator="correction",
        )
    with django_capture_on_commit_callbacks(execute=True):
        replay = online.replay_create(
            project=project, application=candidate, evaluators=[exact.head]
        )
    rows = _rows(replay.version)
    assert rows["t-failed"]["production_error"] == "upstream timeout"
    assert "production_error" not in rows["t-ok"]

    def cells(run):
        results = Result.objects.filter(run=run, scenario__inputs__source_trace_id="t-failed")
        return {r.step_key.split("-")[0]: r for r in results}

    production = cells(replay.production)
    assert production["application"].status == "error"
    assert production["application"].error["message"] == "upstream timeout"
    assert production["evaluator"].status == "skipped"
    assert production["evaluator"].annotation_id is None  # no score for production
    scored = cells(replay.candidate)["evaluator"]
    assert scored.status == "success" and scored.annotation.outputs == {"success": True}

    comparison = compare.comparison_get(
        project=project, run_ids=[str(replay.production.pk), str(replay.candidate.pk)]
    )
    (stats,) = [
        s for s in compare.comparison_report(comparison)["stats"] if s["metric"] == "exact.success"
    ]
    assert [r["count"] for r in stats["runs"]] == [1, 2]  # production scored the good row only
    (test,) = stats["tests"]
    assert test["n"] == 1 and sum(test["excluded"].values()) == 1


def test_a_column_application_reads_an_error_column(project):
    """Any column application may name an error column: a row with a value there is that
    error; a row without reads its outputs as before."""
    app = application_create(
        project=project,
        name="Answers",
        kind="column",
        config={"outputs_column": "out", "error_column": "err"},
    )
    ok, failed = invoke_many(app, [{"out": "Paris", "err": ""}, {"out": None, "err": "boom"}])
    assert ok.ok and ok.outputs == "Paris"
    assert not failed.ok and failed.error["message"] == "boom"
    plain = application_create(project=project, name="Plain", kind="column", config={})
    assert plain.config == {"outputs_column": "outputs"}  # stored as before without one


def test_a_replay_too_big_for_a_testset_says_how_many_rows_fit(
    api, project, production, exact, candidate, settings
):
    """The rows are measured while they are built and reading stops where they go over the
    testset size limit: a 400 on ``limit`` saying how many fit, and nothing created."""
    newest = online.replay_preview(project=project, filters=BODY["filters"], limit=3).rows
    sizes = [len(json.dumps(row, ensure_ascii=False).encode()) for row in newest]
    settings.EVALSITE_TESTSET_MAX_BYTES = sizes[0] + sizes[1] + sizes[2] // 2
    before = _counts()
    body = {**BODY, "application": candidate.slug, "evaluators": ["exact"]}
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 400, response.content
    (reason,) = response.json()["error"]["fields"]["limit"]
    assert "only the newest 2 fit" in reason, reason
    assert _counts() == before
    fits = api.post("/api/v1/replays", {**body, "limit": 2}, format="json")
    assert fits.status_code == 201, fits.content


def test_blank_input_keys_get_a_column_name(api, project, exact, candidate):
    _ingest(
        project,
        [
            _span("t-ok", "qa", {"country": "France"}, "Paris", 0),
            _span("t-odd", "qa", {"": "empty", " ": "blank", "country": "Peru"}, "Lima", 1),
        ],
    )
    body = {"application": candidate.slug, "evaluators": ["exact"]}
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 201, response.content
    rows = _rows(TestsetVersion.objects.get(testset__slug=response.json()["testset"]["slug"]))
    odd = rows["t-odd"]
    assert {odd["input_blank"], odd["input_blank_2"]} == {"empty", "blank"}
    assert odd["country"] == "Peru" and "" not in odd and " " not in odd


def test_a_row_the_testset_refuses_names_its_trace(api, project, exact, candidate, settings):
    _ingest(project, [_span(f"t-{n}", "qa", {"n": n}, "x", n) for n in range(3)])
    settings.EVALSITE_TESTSET_MAX_ROWS = 2
    body = {"application": candidate.slug, "evaluators": ["exact"]}
    before = _counts()
    response = api.post("/api/v1/replays", body, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["limit"]
    assert _counts() == before


def test_a_session_replay_keeps_the_minimum_turns(editor_client, project):
    _ingest(
        project,
        [
            _span("s1-a", "chat", {"message": "capital of France?"}, "Paris", 0, session_id="s1"),
            _span("s1-b", "chat", {"message": "and Spain?"}, "Madrid", 1, session_id="s1"),
            _span("s2-a", "chat", {"message": "capital of Peru?"}, "Lima", 2, session_id="s2"),
        ],
    )
    preview = online.replay_preview(project=project, source="sessions", filters={"min_turns": 2})
    assert [row["source_session_id"] for row in preview.rows] == ["s1"]
    page = editor_client.get("/p/acme/replay/new?source=sessions&min_turns=2").content.decode()
    assert "1 production session matches" in page and 'name="min_turns"' in page
    with pytest.raises(InvalidInput) as refused:
        online.replay_preview(project=project, filters={"min_turns": 2})
    assert list(refused.value.fields) == ["filters.min_turns"]


def test_a_root_is_looked_for_in_its_trace_partition(project):
    """The span table is partitioned by ``trace_time``: the root probe names it, so PostgreSQL
    reads one partition per trace instead of every one."""
    sql = str(traces_selected(project=project, filters=online.ReplayFilters()).query)
    assert '"trace_time" = ("runs_trace"."created_at")' in sql


def test_the_api_says_session_times_are_the_last_activity():
    fields = ReplayFiltersSerializer().fields
    assert "Sessions: last active" in fields["since"].help_text
    assert "Sessions: last active" in fields["until"].help_text
