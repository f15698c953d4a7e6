"""The cost of a run before it starts: the estimate (cells, calls, tokens, dollars), refusals
over a cap with nothing created, dry runs, and how close the projection comes to what the
judge's model reports spending."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from evalsite.errors import InvalidInput
from evaluators.services import evaluator_create
from runs.engine import run_create, run_estimate, run_start
from runs.models import Result, Run
from tests.llm_server import completion
from tests.runs.factories import CAPITALS, make_testset

pytestmark = pytest.mark.django_db

WORD = re.compile(r"\w+|[^\w\s]")
REASONING = (
    "The answer names the capital the reference gives, in the expected form, with no hedging "
    "and nothing contradicting it; a reader would take it as correct and complete."
)


def tokens_of(text: str) -> int:
    """The local model's own count: words and punctuation marks (not evalsite's chars / 4)."""
    return len(WORD.findall(text))


def counting_answer(request):
    """A judge answer whose usage is counted from what was actually sent and answered."""
    messages = request.json()["messages"]
    prompt = sum(tokens_of(m.get("content") or "") + 3 for m in messages)
    text = json.dumps({"reasoning": REASONING, "score": 1.0})
    return completion(text, prompt_tokens=prompt, completion_tokens=tokens_of(text))


def rows(n: int) -> list[dict]:
    return [
        dict(CAPITALS[i % 4], country=f"{CAPITALS[i % 4]['country']} #{i}", n=i) for i in range(n)
    ]


@pytest.fixture
def judge(project, llm_connection):
    return evaluator_create(
        project=project,
        kind="llm_judge",
        name="Judge",
        preset="correctness",
        parameters={"connection": llm_connection.slug},
    ).head


def _run(project, version, app, revisions, capture, **kwargs) -> Run:
    run = run_create(
        project=project, testset_version=version, application=app, revisions=revisions, **kwargs
    )
    with capture(execute=True):
        run_start(run=run)
    run.refresh_from_db()
    return run


def test_it_counts_cells_and_calls_per_step(project, column_app, exact, judge):
    version = make_testset(project, rows(30), slug="thirty")
    estimate = run_estimate(
        project=project,
        testset_version=version,
        application=column_app,
        revisions=[exact, judge],
        repeats=2,
    )
    steps = {s["key"]: s for s in estimate["steps"]}
    assert estimate["scenarios"] == 30 and estimate["repeats"] == 2
    assert steps["inputs"]["cells"] == 30
    assert steps[column_app.slug]["cells"] == 60 and steps[column_app.slug]["calls"] == 0
    assert steps[exact.slug] | {"calls": 0, "tokens": None} == steps[exact.slug]
    assert steps[judge.slug]["calls"] == 60 == estimate["judge_calls"]
    assert estimate["cells"] == 30 + 60 * 3
    judge_step = steps[judge.slug]
    per_call = judge_step["judge"]["prompt_tokens_per_call"]
    assert per_call > 20  # the correctness preset's prompt, rendered with each row
    assert judge_step["tokens"]["prompt"] == per_call * 60
    assert judge_step["judge"]["completion_source"].startswith("a guess")
    # judge-1 costs $1 / M prompt tokens and $2 / M completion tokens on the local connection.
    expected = (
        judge_step["tokens"]["prompt"] * 1.0 + judge_step["tokens"]["completion"] * 2.0
    ) / 1e6
    assert estimate["cost_usd"] == pytest.approx(expected)
    assert estimate["caps"] == {"run": None, "project": None, "judges": {}}
    assert estimate["over_cap"] is False


def test_projected_judge_cost_is_within_25_percent_of_the_real_cost(
    project, column_app, judge, llm_server, celery_eager, django_capture_on_commit_callbacks
):
    """The model's usage is counted on the server from the messages it received (words and
    punctuation), not with evalsite's rule of thumb. The first run of a judge has no recorded
    answers and guesses their length; later runs use the judge's recorded calls."""
    llm_server.answer = counting_answer
    capture = django_capture_on_commit_callbacks

    def projected_and_real(version) -> tuple[float, float, dict]:
        estimate = run_estimate(
            project=project, testset_version=version, application=column_app, revisions=[judge]
        )
        run = _run(project, version, column_app, [judge], capture)
        assert run.status == "success", list(Result.objects.filter(run=run).values("error"))
        real = run.metrics.get(scenario=None).data[f"evaluator-{judge.slug}"]["costs"]["sum"]
        return estimate["cost_usd"], real, estimate

    first, first_real, estimate = projected_and_real(make_testset(project, rows(12), slug="warm"))
    assert estimate["steps"][-1]["judge"]["completion_source"].startswith("a guess")
    projected, real, estimate = projected_and_real(make_testset(project, rows(60), slug="sixty"))
    assert estimate["steps"][-1]["judge"]["completion_source"] == "the mean of 12 recent calls"
    assert real > 0
    assert abs(projected - real) / real <= 0.25, (projected, real)
    # The first, guessed projection stays on the safe side of the real cost.
    assert first >= first_real


def test_a_run_over_its_cap_is_refused_up_front_and_creates_nothing(
    project, column_app, judge, llm_server
):
    version = make_testset(project, rows(40), slug="forty")
    estimate = run_estimate(
        project=project, testset_version=version, application=column_app, revisions=[judge]
    )
    cap = Decimal(str(round(estimate["cost_usd"] / 2, 6)))
    with pytest.raises(InvalidInput) as caught:
        run_create(
            project=project,
            testset_version=version,
            application=column_app,
            revisions=[judge],
            max_cost_usd=cap,
        )
    reason = caught.value.fields["max_cost_usd"][0]
    assert f"${estimate['cost_usd']:.4f} projected (40 judge calls" in reason
    assert "over the run's cap" in reason
    assert not Run.objects.exists()
    assert llm_server.calls == []


def test_the_projects_cap_refuses_runs_too(project, column_app, judge, api):
    version = make_testset(project, rows(40), slug="forty")
    project.max_run_cost_usd = Decimal("0.0001")
    project.save()
    body = {
        "testset": version.testset.slug,
        "application": column_app.slug,
        "evaluators": [judge.slug],
    }
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    reason = response.json()["error"]["fields"]["max_cost_usd"][0]
    assert "over the project's cap per run of $0.0001" in reason
    assert not Run.objects.exists()
    # A run under both caps goes through.
    project.max_run_cost_usd = Decimal("10")
    project.save()
    created = api.post("/api/v1/runs", body | {"max_cost_usd": 5, "start": False}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["max_cost_usd"] == 5.0


def test_a_cap_that_cannot_be_checked_refuses_the_run(project, column_app, llm_connection, api):
    judge = evaluator_create(
        project=project,
        kind="llm_judge",
        name="Unpriced",
        preset="correctness",
        parameters={"connection": llm_connection.slug, "model": "judge-2"},  # no price listed
    ).head
    version = make_testset(project, rows(5), slug="five")
    body = {
        "testset": version.testset.slug,
        "application": column_app.slug,
        "evaluators": [judge.slug],
        "max_cost_usd": 1,
    }
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    assert "no price" in response.json()["error"]["fields"]["max_cost_usd"][0]
    assert not Run.objects.exists()


def test_dry_run_answers_the_estimate_and_creates_nothing(
    project, column_app, judge, exact, api, llm_server
):
    version = make_testset(project, rows(20), slug="twenty")
    body = {
        "testset": version.testset.slug,
        "application": column_app.slug,
        "evaluators": [exact.slug, judge.slug],
        "repeats": 2,
        "max_cost_usd": 0.0001,
        "dry_run": True,
    }
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code == 200, response.json()
    data = response.json()
    assert data["dry_run"] is True
    estimate = data["estimate"]
    assert estimate["judge_calls"] == 40 and estimate["cells"] == 20 + 40 * 3
    assert estimate["caps"]["run"] == 0.0001 and estimate["over_cap"] is True
    assert not Run.objects.exists()
    assert llm_server.calls == []


def test_a_logged_run_has_nothing_to_estimate(project, api):
    response = api.post("/api/v1/runs", {"name": "sdk", "dry_run": True}, format="json")
    assert response.status_code == 400
    assert "dry_run" in response.json()["error"]["fields"]
    assert not Run.objects.exists()


def test_a_viewer_may_not_estimate(project, column_app, judge, viewer_api, llm_server):
    version = make_testset(project, rows(3), slug="three")
    body = {
        "testset": version.testset.slug,
        "application": column_app.slug,
        "evaluators": [judge.slug],
        "dry_run": True,
    }
    assert viewer_api.post("/api/v1/runs", body, format="json").status_code == 403
    assert llm_server.calls == []


# --- the pages ----------------------------------------------------------------------------------


def _form(version, app, revisions, **extra) -> dict:
    return {
        "testset": version.testset.pk,
        "application": app.pk,
        "evaluators": [r.evaluator_id for r in revisions],
        "repeats": 1,
        **extra,
    }


def test_the_new_run_page_shows_the_estimate_without_starting(
    project, column_app, judge, editor_client
):
    version = make_testset(project, rows(10), slug="ten")
    url = f"/p/{project.slug}/runs/new/estimate"
    partial = editor_client.post(url, _form(version, column_app, [judge]), HTTP_HX_REQUEST="true")
    assert partial.status_code == 200
    html = partial.content.decode()
    assert html.lstrip().startswith('<section id="estimate"')
    assert "<strong>10</strong> judge calls" in html and "projected cost" in html
    assert "a guess (no calls recorded yet)" in html
    # Without JavaScript the whole page comes back, the form filled in and the estimate below.
    page = editor_client.post(url, _form(version, column_app, [judge], max_cost_usd="0.0001"))
    assert "<h1>New run</h1>" in page.content.decode()
    assert "Over the cap: this run would be refused" in page.content.decode()
    assert not Run.objects.exists()


def test_the_new_run_page_refuses_a_run_over_its_cap_inline(
    project, column_app, judge, editor_client
):
    version = make_testset(project, rows(10), slug="ten")
    response = editor_client.post(
        f"/p/{project.slug}/runs/new",
        _form(version, column_app, [judge], max_cost_usd="0.0001", tags="branch=main"),
    )
    assert response.status_code == 200
    assert "over the run&#x27;s cap of $0.0001" in response.content.decode()
    assert not Run.objects.exists()


def test_the_owner_sets_the_projects_cap_and_an_editor_may_not(project, owner_client, owner):
    response = owner_client.post(
        f"/p/{project.slug}/settings/spend-cap", {"max_run_cost_usd": "2.5"}
    )
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.max_run_cost_usd == Decimal("2.5")
    page = owner_client.get(f"/p/{project.slug}/settings/").content.decode()
    assert 'value="2.5000"' in page or 'value="2.5"' in page


def test_an_editor_may_not_set_the_projects_cap(project, editor_client, api):
    response = editor_client.post(
        f"/p/{project.slug}/settings/spend-cap", {"max_run_cost_usd": "100"}
    )
    assert response.status_code == 403
    assert api.patch("/api/v1/project", {"max_run_cost_usd": 100}, format="json").status_code == 403
    project.refresh_from_db()
    assert project.max_run_cost_usd is None


def test_an_invalid_estimate_request_shows_its_errors_in_the_swapped_region(
    project, column_app, judge, editor_client
):
    response = editor_client.post(
        f"/p/{project.slug}/runs/new/estimate",
        {"application": column_app.pk, "evaluators": [judge.evaluator_id], "repeats": 1},
        HTTP_HX_REQUEST="true",
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="estimate"')
    assert 'role="alert"' in html and "testset: This field is required." in html


def test_an_agent_scorer_that_calls_a_model_cannot_pass_a_cap(
    project, column_app, llm_connection, api, llm_server
):
    scorer = evaluator_create(
        project=project,
        kind="agent_score",
        name="Goal",
        parameters={"connection": llm_connection.slug},
    ).head
    version = make_testset(project, rows(5), slug="five")
    estimate = run_estimate(
        project=project, testset_version=version, application=column_app, revisions=[scorer]
    )
    step = estimate["steps"][-1]
    assert (step["calls"], step["cost_usd"], estimate["cost_usd"]) == (5, None, None)
    body = {
        "testset": version.testset.slug,
        "application": column_app.slug,
        "evaluators": [scorer.slug],
        "max_cost_usd": 0,
    }
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code == 400
    assert "cannot be projected" in response.json()["error"]["fields"]["max_cost_usd"][0]
    assert not Run.objects.exists() and llm_server.calls == []


def test_the_sample_spans_the_testset_from_first_to_last_row(project, column_app, judge):
    def sampled(n: int) -> list[int]:
        version = make_testset(project, rows(n), slug=f"rows-{n}")
        estimate = run_estimate(
            project=project, testset_version=version, application=column_app, revisions=[judge]
        )
        assert estimate["sample_rows"] == len(estimate["sample_indexes"])
        return estimate["sample_indexes"]

    assert sampled(4) == [0, 1, 2, 3]
    assert sampled(30) == [0, 7, 14, 22, 29]
    assert sampled(1) == [0]


def test_a_dry_run_refuses_bad_tags_like_the_real_run(project, column_app, judge, api):
    version = make_testset(project, rows(3), slug="three")
    body = {
        "testset": version.testset.slug,
        "application": column_app.slug,
        "evaluators": [judge.slug],
        "tags": {"bad name": "x"},
        "dry_run": True,
    }
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code == 400 and "tags.bad name" in response.json()["error"]["fields"]


def test_a_logged_run_refuses_a_spend_cap(project, api):
    response = api.post("/api/v1/runs", {"name": "sdk", "max_cost_usd": 1}, format="json")
    assert response.status_code == 400
    assert "no spend to cap" in response.json()["error"]["fields"]["max_cost_usd"][0]
    assert not Run.objects.exists()


def test_a_run_that_spends_past_its_cap_stops_calling(
    project, column_app, judge, llm_server, celery_eager, django_capture_on_commit_callbacks
):
    """The cap is checked up front against the estimate and kept while the run goes: a model
    that answers at length (here 50x the projected tokens) is stopped by the run's spend
    counter, its remaining cells errors, never scores."""
    llm_server.answer = lambda request: completion(
        json.dumps({"reasoning": REASONING, "score": 1.0}),
        prompt_tokens=5_000,
        completion_tokens=5_000,
    )
    version = make_testset(project, rows(20), slug="twenty")
    estimate = run_estimate(
        project=project, testset_version=version, application=column_app, revisions=[judge]
    )
    cap = Decimal(str(round(estimate["cost_usd"] * 1.5, 4)))
    run = _run(
        project,
        version,
        column_app,
        [judge],
        django_capture_on_commit_callbacks,
        max_cost_usd=cap,
    )
    cells = Result.objects.filter(run=run, step_key__startswith="evaluator-")
    stopped = [c for c in cells if c.error and c.error.get("code") == "spend_cap_reached"]
    assert stopped, [c.error for c in cells]
    assert all(c.annotation_id is None for c in stopped)  # an error, not a score of 0
    assert len(llm_server.calls) < 20
