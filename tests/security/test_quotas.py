"""Tenant isolation of interactive work: a project holds at most EVALSITE_INTERACTIVE_SLOTS
evaluations at once in web threads (any host), example cases stay within their count and time
budget, and another project is never refused because of it."""

from __future__ import annotations

import time

import pytest

from evalsite.quotas import interactive_slot
from evaluators.services import evaluator_create
from tests.conftest import api_client_for

pytestmark = pytest.mark.django_db

SLEEPY = (
    "import time\n"
    "def evaluate(inputs, outputs, trace):\n"
    "    time.sleep(inputs.get('sleep', 0))\n"
    "    return True\n"
)


def _invoke(client):
    return client.post(
        "/api/v1/evaluators/invoke",
        {"kind": "exact_match", "inputs": {"correct_answer": "a"}, "outputs": "a"},
        format="json",
    )


def test_a_project_over_its_interactive_quota_gets_a_429_and_another_project_does_not(
    settings, api, project, other_project, outsider
):
    settings.EVALSITE_INTERACTIVE_SLOTS = 2
    with interactive_slot(project.pk), interactive_slot(project.pk):
        refused = _invoke(api)
        other = _invoke(api_client_for(other_project, outsider))
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert "already runs 2 interactive evaluations" in refused.json()["error"]["message"]
    assert other.status_code == 200 and other.json()["status"] == "success"
    # The slots were given back when the calls ended.
    assert _invoke(api).status_code == 200


def test_a_slot_whose_holder_died_frees_itself_when_its_lease_runs_out(settings, api, project):
    settings.EVALSITE_INTERACTIVE_SLOTS = 1
    settings.EVALSITE_INTERACTIVE_LEASE_SECONDS = 1
    holder = interactive_slot(project.pk)
    holder.__enter__()  # and never leaves: a web thread killed mid-call
    assert _invoke(api).status_code == 429
    time.sleep(1.2)
    assert _invoke(api).status_code == 200


def test_the_try_panel_says_inline_that_the_project_is_busy(settings, editor_client, project):
    settings.EVALSITE_INTERACTIVE_SLOTS = 1
    evaluator_create(project=project, kind="exact_match", name="E")
    with interactive_slot(project.pk):
        response = editor_client.post(
            "/p/acme/evaluators/e/try",
            {"inputs": '{"correct_answer": "a"}', "outputs": '"a"'},
            HTTP_HX_REQUEST="true",
        )
    assert response.status_code == 429
    assert "already runs 1 interactive evaluation" in response.content.decode()


def test_saving_refuses_more_example_cases_than_the_limit_and_saves_nothing(settings, api):
    settings.EVALSITE_EXAMPLES_MAX = 3
    cases = [{"inputs": {}, "outputs": "a", "expected": {"success": True}}] * 4
    response = api.post(
        "/api/v1/evaluators",
        {"name": "many", "kind": "exact_match", "examples": cases},
        format="json",
    )
    assert response.status_code == 400
    assert "at most 3 example cases" in response.json()["error"]["fields"]["examples"][0]
    assert api.get("/api/v1/evaluators").json()["results"] == []


def test_example_cases_stop_at_their_time_budget_and_the_rest_are_reported_not_run(settings, api):
    settings.EVALSITE_EXAMPLES_SECONDS = 2.5
    cases = [
        {
            "name": f"sleep {n}",
            "inputs": {"sleep": 1},
            "outputs": "x",
            "expected": {"success": True},
        }
        for n in range(5)
    ]
    response = api.post(
        "/api/v1/evaluators",
        {
            "name": "sleepy",
            "kind": "code",
            "parameters": {"runtime": "python", "version": "2", "code": SLEEPY, "timeout_s": 30},
            "examples": cases,
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    report = response.json()["head"]["examples_report"]
    assert [case["status"] for case in report[:2]] == ["success", "success"]
    # The third gets the half second left, times out, and is an error, not a failure score.
    assert report[2]["status"] == "error" and report[2]["error"]["code"] == "timeout"
    assert [case["status"] for case in report[3:]] == ["skipped", "skipped"]
    assert all(case["passed"] is None for case in report[3:])
    assert "budget" in report[3]["problems"][0]
