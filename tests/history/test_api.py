"""GET /api/v1/testsets/{ref}/history: the planted classes in the JSON a CI gate reads, the
baseline and candidate parameters, refusals that name the parameter, and isolation."""

from __future__ import annotations

import pytest

from evaluators.services import evaluator_create
from tests.history.conftest import CASES
from tests.history.test_cases import logged_run
from tests.runs.factories import make_testset

URL = "/api/v1/testsets/{}/history"


def get(client, ref, **params):
    return client.get(URL.format(ref), params)


def test_it_lists_the_planted_classes_for_a_gate(viewer_api, planted):
    testset, runs = planted
    response = get(viewer_api, "planted", tag="branch:main", baseline=runs[2].pk)
    assert response.status_code == 200
    body = response.json()
    assert body["testset"] == {"id": testset.pk, "slug": "planted"}
    assert [r["id"] for r in body["runs"]] == [r.pk for r in runs[:4]]
    assert [(r["baseline"], r["candidate"]) for r in body["runs"]][-2:] == [
        (True, False),
        (False, True),
    ]
    assert body["runs"][0]["tags"] == {"branch": "main", "commit": "c1"}
    assert body["evaluators"] == [{"slug": "exact", "metric": "exact.success"}]
    assert body["count"] == 6 and body["counts"]["regressed"] == 1
    classes = {CASES[c["index"]]: c["class"] for c in body["cases"]}
    assert classes == {
        "stable pass": "stable_pass",
        "stable fail": "stable_fail",
        "flaky": "flaky",
        "regressed": "regressed",
        "fixed": "fixed",
        "errored": "stable_pass",
    }
    flaky = body["cases"][2]
    assert flaky["verdicts"] == ["pass", "fail", "pass", "pass"]
    assert flaky["flips"] == 2 and flaky["flip_rate"] == pytest.approx(0.6667)
    assert flaky["evaluator"] == "exact" and flaky["inputs"].startswith("case: flaky")
    assert body["cases"][5]["verdicts"][-1] == "error"


def test_it_lists_regressed_and_flaky_cases_apart(api, planted):
    for klass, name in (("regressed", "regressed"), ("flaky", "flaky")):
        body = get(api, "planted", tag="branch:main", **{"class": klass}).json()
        assert [CASES[c["index"]] for c in body["cases"]] == [name] and body["count"] == 1
    both = api.get(URL.format("planted") + "?tag=branch:main&class=regressed&class=flaky")
    assert [c["class"] for c in both.json()["cases"]] == ["flaky", "regressed"]


def test_it_takes_baseline_and_candidate_runs(api, planted):
    testset, runs = planted
    body = get(api, testset.pk, runs=2, baseline=runs[0].pk, candidate=runs[3].pk).json()
    assert [r["id"] for r in body["runs"]] == [runs[0].pk, runs[3].pk]
    assert body["runs"][0]["baseline"] and body["runs"][1]["candidate"]
    classes = {CASES[c["index"]]: c["class"] for c in body["cases"]}
    assert classes["flaky"] == "stable_pass" and classes["fixed"] == "fixed"


def test_it_pages_the_cases(api, planted):
    body = get(api, "planted", offset=4, limit=1).json()
    assert [c["index"] for c in body["cases"]] == [4]
    assert (body["count"], body["offset"], body["limit"]) == (6, 4, 1)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"runs": "1"}, "runs"),
        ({"runs": "101"}, "runs"),
        ({"runs": "many"}, "runs"),
        ({"tag": "main"}, "tag"),
        ({"baseline": "abc"}, "baseline"),
        ({"candidate": "999999"}, "candidate"),
        ({"class": "broken"}, "class"),
        ({"offset": "-1"}, "offset"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"evaluator": "nope"}, "evaluator"),
    ],
)
def test_it_refuses_bad_parameters_naming_them(api, planted, params, field):
    response = get(api, "planted", **params)
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_it_refuses_a_baseline_of_another_testset_or_newer_than_the_candidate(
    api, project, planted
):
    _, runs = planted
    judge = evaluator_create(project=project, kind="feedback", name="J", outputs_schema={})
    other = logged_run(project, make_testset(project, [{"q": 1}], slug="other"), judge.head, [])
    refused = get(api, "planted", baseline=other.pk)
    assert refused.status_code == 400 and "baseline" in refused.json()["error"]["fields"]
    later = get(api, "planted", baseline=runs[3].pk, candidate=runs[1].pk)
    assert later.status_code == 400 and "baseline" in later.json()["error"]["fields"]


def test_it_hides_another_projects_testset(outsider_api, api, planted, other_project):
    assert get(outsider_api, "planted").status_code == 404
    make_testset(other_project, [{"q": 1}], slug="theirs")
    assert get(api, "theirs").status_code == 404
    assert get(api, "nope").status_code == 404


def test_it_refuses_another_projects_run_as_candidate(api, outsider_api, planted, other_project):
    judge = evaluator_create(project=other_project, kind="feedback", name="J", outputs_schema={})
    version = make_testset(other_project, [{"q": 1}], slug="planted")
    theirs = logged_run(other_project, version, judge.head, [])
    response = get(api, "planted", candidate=theirs.pk)
    assert response.status_code == 400 and "candidate" in response.json()["error"]["fields"]


def test_it_documents_the_endpoint_in_the_schema(client, db):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/testsets/{ref}/history"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"runs", "tag", "baseline", "class"}
    assert "History" in schema["components"]["schemas"]
